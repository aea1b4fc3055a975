"""Setting up a tuning campaign from the command line, and reading its results.

Storage (journal file or RDB URL), the records sink, the device and its core count, the earlier
winners that seed each study, and the end-of-campaign summary. Uses ``tune``, ``settings``,
``kernels``, ``records``, ``table``, ``backends``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from .errors import OpgenError
from .hardware import ChipProfile
from .kernels import kernel_hashes
from .keys import key_text
from .records import Record
from .space import Point
from .spec import OpSpec
from .settings import CampaignConfig, Settings
from .tune import Campaign


def open_storage(where: str):
    """An optuna storage: an RDB URL (``sqlite:///x.db``, ``postgresql://...``) or a journal file."""
    import optuna

    if "://" in where:
        return optuna.storages.RDBStorage(where)
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    Path(where).parent.mkdir(parents=True, exist_ok=True)
    lock = JournalFileSymlinkLock(where)  # the lock optuna's writers take
    lock.acquire()
    try:
        if mend_journal(Path(where)):
            print(f"opgen tune: {where}: cut its torn last line (a run died writing it); the trial it "
                  "belonged to is measured again", file=sys.stderr)
    finally:
        lock.release()
    return optuna.storages.JournalStorage(JournalFileBackend(where, lock))


def mend_journal(path: Path) -> bool:
    """Check an optuna journal file before it is opened (under its lock): end it with a newline,
    cutting a torn last line, as :func:`opgen.records.append` does for records. Optuna's reader
    skips such a line, but its next append would join it and leave a malformed line for good.

    Returns:
        Whether a torn line was cut.

    Raises:
        OpgenError: a malformed line before the last, naming the file and what to do.
    """
    import json

    if not path.exists():
        return False
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty unless the last line is torn
    for n, line in enumerate(lines, 1):
        try:
            json.loads(line)
        except ValueError as exc:
            raise OpgenError(f"{path}:{n}: not a journal line ({exc}); optuna cannot resume from it: move "
                             "it aside to start the studies afresh (the records keep every measured trial)") from None
    if not tail:
        return False
    with open(path, "r+b") as f:
        try:
            json.loads(tail)
        except ValueError:
            f.truncate(len(data) - len(tail))
            cut = True
        else:
            f.seek(0, 2)
            f.write(b"\n")
            cut = False
        f.flush()
        os.fsync(f.fileno())
    return cut


def record_sink(path: Path, spec: OpSpec, chip: str, toolchain: dict[str, str],
                hashes: dict[str, str], date: str, flush: str = "read") -> Callable[[str, dict[str, Any]], None]:
    """A sink that appends each trial, winner, cross-check and fill measure to the tuning records as it happens;
    ``flush`` names the timing protocol's flush (``records.FLUSHES``)."""
    from . import records

    classes = {"trial": records.TrialRecord, "winner": records.WinnerRecord,
               "cross_check": records.CheckRecord, "measure": records.MeasureRecord}

    def sink(kind: str, fields_: dict[str, Any]) -> None:
        common = dict(op=spec.op, chip=chip, toolchain=toolchain,
                      kernel_hash=hashes[fields_["variant"]], date=date, flush=flush)
        if kind == "cross_check":
            common["fill_kernel_hash"] = hashes[fields_["fill_variant"]]
        records.append(path, [classes[kind](**common, **fields_)])
    return sink


def summary(spec: OpSpec, winners: list[dict[str, Any]]) -> str:
    """The end-of-campaign table: per bucket, the shapes it stands for, then its winner."""
    lines = [f"{'variant':<28} {'median ms':>10}  point"]
    for w in winners:
        point = ",".join(f"{k}={v}" for k, v in w["point"].items())
        lines.append(f"{key_text(spec, tuple(w['key']))}:")
        lines.append(f"  {w['variant']:<26} {w['median_ms']:>10.4f}  {point}")
    return "\n".join(lines)


def open_campaign(root: Path, spec: OpSpec, chip: ChipProfile, device: str | None, storage: str,
                  settings: Settings, records_path: Path, date: str,
                  progress: bool = True) -> tuple[Campaign, dict[tuple, list[Point]], dict[tuple, Point]]:
    """A campaign on the chip's backend, refusing a device that is not that chip, plus what the
    records hand :meth:`Campaign.run`: the earlier winners of each bucket (enqueued first) and its
    standing winner, the one the build freezes now (it competes for its bucket again)."""
    from .backends import get_backend
    from .errors import UnsupportedInput
    from .table import filled_rows, read_keyed, split_winners

    name = chip.backend
    device = device or {"cuda": "cuda:0", "npu": "npu:0", "interpreter": "cpu"}[name]
    env = {"TRITON_INTERPRET": "1"} if name == "interpreter" else {}  # for the worker processes
    backend = get_backend(name, device)
    toolchain = backend.toolchain()
    device_name = toolchain.pop("device", "")
    if name != "interpreter" and not any(s in device_name for s in chip.device_names):
        raise UnsupportedInput(f"device {device!r} is {device_name!r}, not a {chip.name}: tables are per chip")
    programs = backend.cores() or chip.cores
    hashes = kernel_hashes(root, spec, chip.rendering)  # the caller checked the files are these
    found = read_keyed(spec, chip, records_path).records
    earlier = earlier_winners(spec, found)
    fresh = split_winners(spec, chip, records_path, found, hashes)[0]
    for row in filled_rows(spec, chip, fresh, found):  # an untuned bucket starts from the row filling it
        earlier.setdefault(row.key, []).append(Point(row.variant, tuple(row.point.items())))
    tunables = spec.tunables_for(chip.backend)
    standing = {key: Point.of(w.variant, w.point, tunables) for key, w in fresh.items()}
    sink = record_sink(records_path, spec, chip.name, toolchain, hashes, date,
                       "write" if settings.protocol.dirty else "read")
    config = CampaignConfig(spec, chip, str(root), name, device, programs, toolchain, hashes, settings,
                            env, dict(spec.accuracy.max_rel_l2), progress)
    campaign = Campaign(config, open_storage(storage), sink)
    return campaign, earlier, standing


def earlier_winners(spec: OpSpec, records: Iterable[Record], keep: int = 3) -> dict[tuple, list[Point]]:
    """Up to ``keep`` distinct earlier winners of each bucket, newest first, keyed as the current
    spec buckets the case each was tuned on: a winner still seeds its shape's study after the
    dispatch edges moved (a case the spec no longer accepts keeps its stored key), and an older
    winner is tried again after a kernel edit, when the newest one may come from a shorter search."""
    from .records import WinnerRecord
    from .table import rekeyed

    out: dict[tuple, list[Point]] = {}
    for rec in reversed(rekeyed(spec, records)):
        if not isinstance(rec, WinnerRecord):
            continue
        found = out.setdefault(rec.key, [])
        point = Point(rec.variant, tuple(sorted(rec.point.items())))
        if point not in found and len(found) < keep:
            found.append(point)
    return out
