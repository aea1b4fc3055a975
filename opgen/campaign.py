"""Setting up a tuning campaign from the command line, and reading its results.

Storage (journal file or RDB URL, opened by ``storage``), the records sink (the records file, or
the database of a PostgreSQL storage, ``db_records``), the bucket claims of a shared storage
(``claims``), the device and its core count, the earlier winners that seed each study, and the
end-of-campaign summary. Uses ``tune``, ``settings``, ``kernels``, ``records``, ``table``,
``backends``, ``storage``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from .hardware import ChipProfile
from .kernels import kernel_hashes
from .keys import key_text
from .records import Record
from .space import Point
from .spec import OpSpec
from .settings import CampaignConfig, Settings
from .storage import HEARTBEAT_SECONDS, is_postgres, mend_journal, open_storage
from .tune import Campaign, Sink

__all__ = ["open_storage", "mend_journal", "record_sink", "summary", "open_campaign", "earlier_winners"]


def record_sink(path: Path, spec: OpSpec, chip: str, toolchain: dict[str, str],
                hashes: dict[str, str], date: str, flush: str = "read",
                write: Callable[[list[Record]], Any] | None = None) -> Sink:
    """A sink that appends each trial, winner, cross-check and fill measure to the tuning records
    as it happens (to the file ``path``, or through ``write``), the records of one call in one
    write (a trial's cases together); ``flush`` names the timing protocol's flush
    (``records.FLUSHES``). A call's ``holder`` (a bucket's claim) goes to ``write``, which writes
    only while the claim holds (``RecordTable.append``)."""
    from . import records

    write = write or (lambda recs: records.append(path, recs))
    classes = {"trial": records.TrialRecord, "winner": records.WinnerRecord,
               "cross_check": records.CheckRecord, "measure": records.MeasureRecord}

    def record(kind: str, fields_: dict[str, Any]) -> Record:
        common = dict(op=spec.op, chip=chip, toolchain=toolchain,
                      kernel_hash=hashes[fields_["variant"]], date=date, flush=flush)
        if kind == "cross_check":
            common["fill_kernel_hash"] = hashes[fields_["fill_variant"]]
        return classes[kind](**common, **fields_)

    def sink(kind: str, fields_: dict[str, Any] | list[dict[str, Any]],
             holder: tuple[int, int] | None = None) -> None:
        recs = [record(kind, f) for f in (fields_ if isinstance(fields_, list) else [fields_])]
        if holder is None:
            write(recs)
        else:
            write(recs, holder=holder)
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
                  settings: Settings, records_path: Path, date: str, progress: bool = True,
                  shard: tuple[int, int] | None = None,
                  heartbeat: int = HEARTBEAT_SECONDS
                  ) -> tuple[Campaign, dict[tuple, list[Point]], dict[tuple, Point]]:
    """A campaign on the chip's backend, refusing a device that is not that chip, plus what the
    records hand :meth:`Campaign.run`: the earlier winners of each bucket (enqueued first) and its
    standing winner, the one the build freezes now (it competes for its bucket again). On a
    PostgreSQL ``storage`` the campaign claims its buckets and writes its records to the database
    (:func:`opgen.db_records.export` appends them to ``records_path``, first here, so every host
    starts from the same records); ``shard`` is this process's share."""
    from .backends import get_backend
    from .errors import UnsupportedInput
    from .table import fill_measured, filled_rows, read_keyed, split_winners

    opened = open_storage(storage, shard, heartbeat)  # first: a storage in use refuses before the device
    if is_postgres(storage):  # every host seeds its studies from the same records
        from .db_records import export

        export(storage, records_path, spec.op, chip.name)
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
    fresh, _, pending = split_winners(spec, chip, records_path, found, hashes)
    measured = fill_measured(spec, chip, fresh, found, hashes, pending)
    for row in filled_rows(spec, chip, fresh, measured):  # an untuned bucket starts from the row filling it
        earlier.setdefault(row.key, []).append(Point(row.variant, tuple(row.point.items())))
    tunables = spec.tunables_for(chip.backend)
    standing = {key: Point.of(w.variant, w.point, tunables) for key, w in fresh.items()}
    claims, table = None, None
    if is_postgres(storage):
        from .claims import Claims
        from .db_records import RecordTable

        claims, table = Claims(storage, heartbeat), RecordTable(storage)
    sink = record_sink(records_path, spec, chip.name, toolchain, hashes, date,
                       "write" if settings.protocol.dirty else "read", table.append if table else None)
    config = CampaignConfig(spec, chip, str(root), name, device, programs, toolchain, hashes, settings,
                            env, dict(spec.accuracy.max_rel_l2), progress)
    campaign = Campaign(config, opened, sink, claims, table)
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
