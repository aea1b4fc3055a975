"""A tuning campaign from the command line: set up, its steps run in order, its results read.

Storage (journal file or RDB URL, opened by ``storage``), the records sink (the records file, or
the database of a PostgreSQL storage, ``db_records``), the bucket claims of a shared storage
(``claims``), the device and its core count, the earlier winners that seed each study, the
end-of-campaign summary; and :func:`run`, the steps of one ``opgen tune`` (:class:`TuneRun`): the
search, the cross-check, the measured fill. Uses ``tune``, ``settings``, ``kernels``, ``records``,
``table``, ``table_records``, ``fill_measured``, ``backends``, ``storage``, ``plan``, ``cross_check``,
``measure_fill``, ``lifetime``, ``claims``, ``db_records``, ``errors``.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ..backends import get_backend
from ..errors import UnsupportedInput
from ..render.kernels import kernel_hashes, stale_kernels
from ..run.lifetime import stop_workers_on_signals
from ..space.plan import buckets, rival_plans
from ..space.space import Point
from ..spec.hardware import ChipProfile
from ..spec.keys import key_text
from ..spec.spec import OpSpec
from ..storage.claims import Claims
from ..storage.db_records import RecordTable, export
from ..storage.records import CheckRecord, MeasureRecord, Record, TrialRecord, WinnerRecord, append as append_records
from ..storage.storage import HEARTBEAT_SECONDS, is_postgres, mend_journal, open_storage, shown, storage_errors
from ..table.fill_measured import current_measures, fill_measured
from ..table.table import filled_rows
from ..table.table_records import fresh_winners, read_keyed, rekeyed, split_winners
from .cross_check import cross_report
from .measure_fill import (FILL_HEADER, MeasureInputs, bucket_candidates, bucket_report, candidates, earlier_runs,
                           outrun, outrun_line, run_name)
from .settings import CampaignConfig, Settings
from .tune import Campaign, Sink

__all__ = ["open_storage", "mend_journal", "record_sink", "summary", "open_campaign", "earlier_winners", "TuneRun",
           "run", "pull", "measure_inputs"]


def record_sink(path: Path, spec: OpSpec, chip: str, toolchain: dict[str, str],
                hashes: dict[str, str], date: str, flush: str = "read",
                write: Callable[[list[Record]], Any] | None = None) -> Sink:
    """A sink that appends each trial, winner, cross-check and fill measure to the tuning records
    as it happens (to the file ``path``, or through ``write``), the records of one call in one
    write (a trial's cases together); ``flush`` names the timing protocol's flush
    (``records.FLUSHES``). A call's ``holder`` (a bucket's claim) goes to ``write``, which writes
    only while the claim holds (``RecordTable.append``)."""
    write = write or (lambda recs: append_records(path, recs))
    classes = {"trial": TrialRecord, "winner": WinnerRecord, "cross_check": CheckRecord, "measure": MeasureRecord}

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
    (:func:`opgen.storage.db_records.export` appends them to ``records_path``, first here, so every host
    starts from the same records); ``shard`` is this process's share."""
    opened = open_storage(storage, shard, heartbeat)  # first: a storage in use refuses before the device
    if is_postgres(storage):  # every host seeds its studies from the same records
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
    out: dict[tuple, list[Point]] = {}
    for rec in reversed(rekeyed(spec, records)):
        if not isinstance(rec, WinnerRecord):
            continue
        found = out.setdefault(rec.key, [])
        point = Point(rec.variant, tuple(sorted(rec.point.items())))
        if point not in found and len(found) < keep:
            found.append(point)
    return out


@dataclass(frozen=True)
class TuneRun:
    """One ``opgen tune`` run on a device, past the dry run and the split over devices: what it
    searches (``plans``, with ``trials`` > 0) and which steps follow (the cross-check, the
    measured fill), with the settings the command line gave."""

    root: Path
    spec: OpSpec
    chip: ChipProfile
    rows: list[dict[str, Any]]
    plans: list[Any]
    variants: list[str] | None
    settings: Settings
    device: str | None
    storage: str
    records: Path
    date: str
    progress: bool = True
    shard: tuple[int, int] | None = None
    heartbeat: int = HEARTBEAT_SECONDS
    cross_check: bool = False
    cross_check_all: bool = False
    cross_margin: float = 0.10
    measure_fill: bool = False
    remeasure: bool = False
    drop_below: float = 0.95
    drop_after: int = 5


def run(r: TuneRun) -> None:
    """The steps of ``opgen tune``, in order, on one storage: the search (``trials`` > 0), then
    the cross-check, then the measured fill; each prints its report. On a PostgreSQL storage the
    records every host wrote are appended to the records file before and after each step.

    Raises:
        UnsupportedInput: the kernel modules under ``generated/`` are not the ones the build
            renders (the records would name kernels that will not be frozen).
        StorageError: the storage is lost mid-campaign (the message says how to resume).
    """
    stale = stale_kernels(r.root, r.spec, r.chip.rendering)
    if stale:
        raise UnsupportedInput(f"generated/ kernels are stale ({len(stale)} files): run `opgen build` "
                               "first, so the tuned kernels are the ones that will be frozen")
    stop_workers_on_signals()  # a tuner stopped by a signal takes its worker processes with it
    _quiet_optuna()
    with storage_errors(r.storage):
        campaign, earlier, standing = open_campaign(
            r.root, r.spec, r.chip, r.device, r.storage, r.settings, r.records, r.date, progress=r.progress,
            shard=r.shard, heartbeat=r.heartbeat)
        if r.settings.trials > 0:
            _search(r, campaign, earlier, standing)
        if r.cross_check or r.cross_check_all:
            _cross_check(r, campaign)
        if r.measure_fill:
            _measure_fill(r, campaign)


def _quiet_optuna() -> None:
    """Optuna's log at warnings only; its heartbeat warnings silenced: heartbeats are optuna's
    experimental feature, meant by it for ``Study.optimize``, and this tuner asks and tells and
    beats for its trials itself (:class:`opgen.storage.storage.Heartbeat`)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def pull(url: str, path: Path, op: str, chip: str, required: bool = False) -> None:
    """Append to the records file ``path`` the records of ``op`` on ``chip`` that the PostgreSQL
    storage ``url`` holds and the file lacks, saying how many (:func:`opgen.storage.db_records.export`)."""
    held, added = export(url, path, op, chip, required)
    print(f"records: {added} of the {held} records of {op} on {chip} in {shown(url)} appended to {path}",
          file=sys.stderr)


def _pull_shared(r: TuneRun) -> None:
    """On a PostgreSQL storage, the records every host wrote appended to the records file."""
    if is_postgres(r.storage):
        pull(r.storage, r.records, r.spec.op, r.chip.name)


def _search(r: TuneRun, campaign: Campaign, earlier: dict[tuple, list[Point]], standing: dict[tuple, Point]) -> None:
    """The search over ``r.plans``; a narrower campaign (some variants) competes with the other
    variants' stored points."""
    rivals = rival_plans(r.spec, r.chip, r.rows, r.plans, r.variants) if r.variants else []
    winners = campaign.run(r.plans, earlier, rivals, standing)
    print(summary(r.spec, winners))
    _pull_shared(r)
    print(f"records: {r.records}; run `opgen build` to freeze them")


def _cross_check(r: TuneRun, campaign: Campaign) -> None:
    """Each tuned bucket's winner re-measured against the table's fill from the others (with
    ``cross_check_all``, every winner on every bucket)."""
    _pull_shared(r)  # the winners of every host
    tuned = fresh_winners(r.spec, r.chip, r.records, campaign.config.kernel_hash)
    checks = campaign.cross_check(buckets(r.spec, r.rows), tuned, r.cross_margin, r.cross_check_all)
    _pull_shared(r)
    print(cross_report(r.spec, checks, r.cross_margin))


def measure_inputs(spec: OpSpec, chip: ChipProfile, path: Path, hashes: dict[str, str], drop_below: float,
                   drop_after: int, remeasure: bool) -> MeasureInputs:
    """What a measure step starts from, read from the records at ``path``
    (:class:`opgen.tune.measure_fill.MeasureInputs`): the tuned and the pending winners, the earlier
    runs it may keep (none with ``remeasure``), the candidates it leaves out (``drop_below``,
    ``drop_after``) and the rest of its candidate pool."""
    held = read_keyed(spec, chip, path).records
    tuned, _, pending = split_winners(spec, chip, path, held, hashes)
    runs = earlier_runs(held, hashes)
    pool = candidates(spec, chip, {**pending, **tuned})
    left_out = outrun(spec, chip, pool, current_measures(held, hashes), drop_below, drop_after)
    kept_pool = [(k, p) for k, p in pool if p not in {o.point for o in left_out}]
    return MeasureInputs(tuned, pending, {} if remeasure else runs, left_out, kept_pool)


def _measure_fill(r: TuneRun, campaign: Campaign) -> None:
    """Every tuned winner's point re-measured on each untuned bucket of the case set, side by side,
    each bucket reported as it is measured (a run cut short shows where it was)."""
    _pull_shared(r)  # the winners of every host
    tuned, pending, earlier, left_out, pool = measure_inputs(r.spec, r.chip, r.records, campaign.config.kernel_hash,
                                                             r.drop_below, r.drop_after, r.remeasure)
    found = buckets(r.spec, r.rows)
    print(FILL_HEADER, flush=True)
    for o in left_out:
        print(outrun_line(o), flush=True)
    results = campaign.measure_fill(found, tuned, run_name(r.date, pool, found), earlier, pending, left_out,
                                    lambda result: print(bucket_report(r.spec, result), flush=True))
    left = len(bucket_candidates(r.spec, r.chip, found, tuned, pending, left_out)) - len(results)
    if left:
        print(f"the campaign's time (--campaign-seconds) ran out: {left} buckets not measured; "
              "run the step again to measure them (the buckets measured are kept)")
    elif not results:
        print("no untuned bucket in the case set, or no tuned winner legal there")
    _pull_shared(r)
    print(f"records: {r.records}; run `opgen build` to fill the measured buckets with their fastest point")
