"""``opgen records``: what the tuning records of one op on one chip hold, bucket by bucket.

Per key: the winner the build freezes (or why the latest one is stale), its median, the margin to
its runner-up and its date; the trials measured there on today's kernels, by status; the loss of
its current cross-check. Then the table's cross-check verdict. Reads the records only, no device.
Uses ``records``, ``table``.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Mapping

from .hardware import ChipProfile
from .records import TrialRecord, read, sort_key
from .spec import OpSpec
from .table import cross_checked, split_winners


def report(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str]) -> str:
    """The records report of ``spec`` on ``chip`` (``kernel_hashes``: variant -> today's kernel)."""
    found = read(path, op=spec.op, chip=chip.name)
    fresh, old = split_winners(spec, chip, path, found.records, kernel_hashes)
    stale = {s.record.key: s.reason for s in old}
    checks = cross_checked(spec, chip, found.records, fresh, kernel_hashes)
    loss = {c.key: c.loss for c in checks.current}
    trials: dict[tuple, Counter] = {}
    other = 0
    for rec in found.records:
        if not isinstance(rec, TrialRecord):
            continue
        if kernel_hashes.get(rec.variant) == rec.kernel_hash:
            trials.setdefault(rec.key, Counter())[rec.status] += 1
        else:
            other += 1
    torn = f", {found.torn} torn line skipped" if found.torn else ""
    lines = [f"{spec.op} on {chip.name}: {len(found.records)} records in {path}{torn}",
             f"{'key (' + ', '.join(spec.dispatch.key) + ')':<44} {'winner':<26} {'median ms':>9} {'margin':>7} "
             f"{'tuned':<10} {'loss':>7}  trials on today's kernels"]
    for key in sorted(set(fresh) | set(stale) | set(trials), key=sort_key):
        tried = ", ".join(f"{n} {status}" for status, n in sorted(trials.get(key, Counter()).items())) or "none"
        name = ",".join(map(str, key))
        if key in fresh:
            w = fresh[key]
            margin = "-" if w.margin is None else f"{w.margin:.1%}"
            checked = f"{loss[key]:.1%}" if key in loss else "-"
            lines.append(f"{name:<44} {w.variant:<26} {w.median_ms:>9.4f} {margin:>7} {w.date:<10} "
                         f"{checked:>7}  {tried}")
        else:
            lines.append(f"{name:<44} {'(' + stale[key] + ')' if key in stale else '(no winner)'}")
            lines.append(f"{'':<44} {'':<26} {'':>9} {'':>7} {'':<10} {'':>7}  {tried}")
    if other:
        lines.append(f"{other} trials measured kernels other than today's (not counted above)")
    lines.append(checks.line())
    return "\n".join(lines)
