"""``opgen records``: what the tuning records of one op on one chip hold, bucket by bucket.

Per key: the winner the build freezes (or why it is stale), its median, the margin to its
runner-up and its date; the trials measured there on the current kernels, by status; the loss of its
current cross-check; a later winner that never met it (not frozen); another point that won the
key earlier on the same kernel and ran faster in its own run, and another point that ran faster
beside the winner in a cross-check (its search missed it). Then the table's cross-check verdict,
the toolchains its measured rows were timed under (the rows of any but the latest named), the
measured rows re-keyed since (each with the key it was measured for), and the measured fills,
naming each untuned bucket where the nearest fill's point ran slower than the measured winner (a
bucket edge that puts those shapes on a slower kernel).
Reads the records only, no device.
Uses ``hardware``, ``keys``, ``records``, ``settings``, ``space``, ``spec``, ``table``.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Mapping

from ..space.space import point_id
from ..spec.hardware import ChipProfile
from ..spec.keys import key_text, sort_key
from ..spec.spec import OpSpec
from ..storage.records import CheckRecord, MeasureRecord, Record, TrialRecord, WinnerRecord, latest_winners
from ..table.table import (checked_frozen_winner, cross_checked, fill_measured, fill_nearest, frozen_rows, read_keyed,
                    split_winners)
from ..tune.settings import Settings


#: An earlier winner (another point) this much faster in its own run than the frozen one is named.
EARLIER_FASTER = 0.05


def report(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str]) -> str:
    """The records report of ``spec`` on ``chip`` (``kernel_hashes``: variant -> current kernel)."""
    found = read_keyed(spec, chip, path)
    fresh, old, pending = split_winners(spec, chip, path, found.records, kernel_hashes)
    stale = {s.record.key: s.reason for s in old}
    latest = latest_winners(found.records)
    checks = cross_checked(spec, chip, found.records, fresh, kernel_hashes)
    loss = {c.key: c.loss for c in checks.current}
    trials, faster, beside, other = _tally(found.records, fresh, kernel_hashes)
    torn = f", {found.torn} torn line skipped" if found.torn else ""
    lines = [f"{spec.op} on {chip.name}: {len(found.records)} records in {path}{torn}",
             f"per key (the values it stands for): {'winner':<26} {'median ms':>9} {'margin':>7} "
             f"{'tuned':<10} {'loss':>7}  trials on the current kernels"]
    for key in sorted(set(fresh) | set(stale) | set(trials), key=sort_key):
        tried = ", ".join(f"{n} {status}" for status, n in sorted(trials.get(key, Counter()).items())) or "none"
        lines.append(key_text(spec, key))
        name = ""
        if key in fresh:
            w = fresh[key]
            margin = "-" if w.margin is None else f"{w.margin:.1%}"
            checked = f"{loss[key]:.1%}" if key in loss else "-"
            lines.append(f"{name:<36} {w.variant:<26} {w.median_ms:>9.4f} {margin:>7} {w.date:<10} "
                         f"{checked:>7}  {tried}")
            if latest[key] is not w:
                n = latest[key]
                lines.append(f"{'':<36} a later winner, {n.variant} at {n.median_ms:.4f} ms ({n.date}), "
                             "never met it: not frozen")
            e = faster.get(key)
            if e is not None and e.median_ms * (1.0 + EARLIER_FASTER) < w.median_ms:
                lines.append(f"{'':<36} an earlier winner, {e.variant} at {e.median_ms:.4f} ms in its run "
                             f"({e.date}); the frozen one is {w.median_ms / e.median_ms - 1:.0%} slower")
            c = beside.get(key)
            if c is not None and c.fill_ms * (1.0 + EARLIER_FASTER) < c.own_ms:
                lines.append(f"{'':<36} {c.fill_variant} ({c.fill_from or 'spec default'}) ran "
                             f"{c.own_ms / c.fill_ms - 1:.0%} faster here in a cross-check ({c.date})")
        elif key in pending:
            p = pending[key]
            lines.append(f"{name:<36} {p.variant:<26} {p.median_ms:>9.4f} (never faced the point measured fastest "
                         f"here: a measure-step candidate, not a tuned row)")
            lines.append(f"{'':<36} {'':<26} {'':>9} {'':>7} {'':<10} {'':>7}  {tried}")
        else:
            lines.append(f"{name:<36} {'(' + stale[key] + ')' if key in stale else '(no winner)'}")
            lines.append(f"{'':<36} {'':<26} {'':>9} {'':>7} {'':<10} {'':>7}  {tried}")
    if other:
        lines.append(f"{other} trials measured a kernel since changed (not counted above)")
    lines.append(checks.line())
    table = frozen_rows(spec, chip, path, kernel_hashes)
    lines.extend(table.toolchains.lines())
    if table.moved:
        lines.append(table.rekeyed_line())
        lines.extend(f"{what} {key!r}: measured for {old!r}" for key, old, what in table.moved)
    lines.extend(_measured_fills(spec, chip, found.records, fresh, kernel_hashes, pending))
    return "\n".join(lines)


def _tally(records: tuple[Record, ...], fresh: Mapping[tuple, WinnerRecord], kernel_hashes: Mapping[str, str]
           ) -> tuple[dict[tuple, Counter], dict[tuple, WinnerRecord], dict[tuple, CheckRecord], int]:
    """Per key, the trial statuses on the current kernels, the fastest earlier winner on them and
    the cross-check whose other point beat the frozen winner most; and how many trials measured a
    kernel since changed."""
    trials: dict[tuple, Counter] = {}
    faster: dict[tuple, WinnerRecord] = {}  # per key, the fastest earlier winner, current kernels
    beside: dict[tuple, CheckRecord] = {}  # per key, the check whose other point beat the winner most
    other = 0
    for rec in records:
        if isinstance(rec, CheckRecord) and _checks_frozen(rec, fresh, kernel_hashes) and rec.loss < 0:
            if rec.key not in beside or rec.loss < beside[rec.key].loss:
                beside[rec.key] = rec
        if (isinstance(rec, WinnerRecord) and rec.key in fresh and kernel_hashes.get(rec.variant) == rec.kernel_hash
                and (rec.variant, rec.point) != (fresh[rec.key].variant, fresh[rec.key].point)
                and rec.flush == fresh[rec.key].flush):  # times of two flushes do not compare
            best = faster.get(rec.key)
            if best is None or rec.median_ms < best.median_ms:
                faster[rec.key] = rec
        if not isinstance(rec, TrialRecord):
            continue
        if kernel_hashes.get(rec.variant) == rec.kernel_hash:
            trials.setdefault(rec.key, Counter())[rec.status] += 1
        else:
            other += 1
    return trials, faster, beside, other


def _measured_fills(spec: OpSpec, chip: ChipProfile, records: tuple[Record, ...],
                    fresh: Mapping[tuple, WinnerRecord], kernel_hashes: Mapping[str, str],
                    pending: Mapping[tuple, WinnerRecord]) -> list[str]:
    """How many buckets the table fills from measurements (and how many keep the spec's default,
    measured faster there), and where the nearest fill would have run another point slower by
    more than the tuner's default tie margin (a smaller gap is a tie): its time beside the
    measured winner's in the same run."""
    measured, kept = fill_measured(spec, chip, fresh, records, kernel_hashes, pending)
    if not measured and not kept:
        return []
    nearest = {r.key: r for r in fill_nearest(spec, chip, fresh)}
    times = {(r.key, r.run, point_id(r.variant, r.point)): r.ms for r in records if isinstance(r, MeasureRecord)}
    lines = [f"Measured fills: {len(measured)} untuned buckets take the tuned point that ran fastest there"
             + (f", {len(kept)} keep the spec's default, which ran faster there than every tuned point" if kept else "")]
    for row in measured:
        near = nearest.get(row.key)
        if near is None or point_id(near.variant, near.point) == point_id(row.variant, row.point):
            continue
        found = (row.key, row.measured.run, point_id(near.variant, near.point))
        ms = times.get(found)
        if ms is not None and ms <= row.measured.ms * (1 + Settings.tie_margin):
            continue
        ran = ("was not measured" if found not in times else "failed" if ms is None
               else f"ran {ms / row.measured.ms - 1:.0%} slower")
        lines.append(f"{key_text(spec, row.key)}: the nearest fill's point (from {near.source!r}) {ran} beside "
                     f"{row.variant} (from {row.source!r}): a bucket edge puts these shapes on a slower kernel")
    return lines


def _checks_frozen(rec: CheckRecord, fresh: Mapping[tuple, WinnerRecord], kernel_hashes: Mapping[str, str]) -> bool:
    """Whether a cross-check measured the key's frozen winner and its other point on the current
    kernels."""
    return checked_frozen_winner(rec, fresh) and kernel_hashes.get(rec.fill_variant) == rec.fill_kernel_hash
