"""The dispatch table frozen from the tuning records: one row per tuned bucket, the others filled.

``frozen_rows`` keys the records by where the spec buckets their cases now, then takes each
bucket's winner in force (the latest one that met the one before it, or on a measured bucket the
point measured fastest there) whose kernel (content hash) and tunables still match (else it is a
stale winner, reported in the table, never frozen), then fills each untuned bucket that the
records measured the winners' points on with the fastest of them there (where the spec's default
measured faster, the bucket keeps it), and every other bucket of the dispatch key by the spec's
fill rule; ``cross_checked`` finds which tuned rows have a current leave-one-out check in the
records. Read by ``opgen build`` (``freeze``) and the tuner's cross-check.

The table's pieces, each in a module of its own:

- ``table_rows``: the rows and what the table says of them (:class:`FrozenTable`);
- ``table_records``: the records keyed as the spec buckets cases now, each key's winner in force;
- ``fill_measured``: the fill of the buckets the measure step timed (``measure_fill`` times them);
- ``fill_nearest``: the nearest fill, the default rule and the cross-check's rival;
- ``fill_rank``: the ranked fill (``dispatch.fill_rule: ranked``);
- ``bucket_shapes``, ``fits``, ``keys``: the shapes of a bucket, what fits there, the keys;
- ``table_layout``: the table as the source of the generated module.

Uses ``bucket_shapes``, ``fill_measured``, ``fill_nearest``, ``fill_rank``, ``hardware``, ``keys``,
``records``, ``spec``, ``table_records``, ``table_rows``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..spec.hardware import ChipProfile
from ..spec.keys import Key, sort_key
from ..spec.spec import OpSpec
from ..storage.records import CheckRecord, Record, WinnerRecord
from .bucket_shapes import case_params
from .fill_measured import MeasuredFill, fill_measured
from .fill_nearest import default_source, fill_nearest, fill_targets, leave_one_out_fill, nearest_rows, stand_ins
from .fill_rank import fill_ranked, gather
from .table_records import once, read_keyed, read_keyed_moved, records_key, split_winners
from .table_rows import CrossChecked, FrozenTable, Row, StaleWinner, measured_by, measured_kind, toolchains_of

# fill_nearest, default_source and read_keyed are read through this module by ``report`` and ``explain``
__all__ = ["frozen_rows", "stale", "cross_checked", "checked_frozen_winner", "filled_rows", "FrozenTable",
           "fill_nearest", "default_source", "read_keyed", "fill_measured", "split_winners"]


def frozen_rows(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str],
                *, fill: bool = True) -> FrozenTable:
    """The table rows frozen from the records at ``path`` (none without a file).

    Records are keyed by where the spec buckets their cases now (:func:`rekeyed`). Each key's
    winner in force (:func:`held_winners`) is frozen unless stale: its variant has no kernel in
    ``kernel_hashes`` (variant name -> hash of the chip's rendering) or another hash, or the
    spec's tunables changed. Stale winners are listed, never silently dropped.

    Args:
        fill: also fill untuned bucket combinations: from measurements on them where the records
            hold some (:func:`fill_measured`), else from the nearest tuned rows (:func:`fill_nearest`).

    Raises:
        RecordError: a malformed or foreign record, or a fresh winner illegal for its own case.
        BudgetError: a fresh winner over the chip's budget.
    """
    memo = (id(spec), records_key(path, chip), tuple(sorted(kernel_hashes.items())), fill)
    return once(_TABLES, memo, spec, lambda: _frozen_rows(spec, chip, path, kernel_hashes, fill))


# (id(spec), records_key, kernel hashes, fill) -> (spec, table): a table takes seconds to freeze
# and is read several times a run
_TABLES: dict[tuple[Any, ...], tuple[OpSpec, FrozenTable]] = {}


def _frozen_rows(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str],
                 fill: bool) -> FrozenTable:
    """:func:`frozen_rows`, uncached."""
    records, stored = read_keyed_moved(spec, chip, path)
    fresh, old, pending = split_winners(spec, chip, path, records.records, kernel_hashes)
    tunables = spec.tunables_for(chip.backend)
    rows = [Row(k, r.variant, {n: r.point[n] for n in tunables}, r) for k, r in fresh.items()]
    by_measure = fill_measured(spec, chip, fresh, records.records, kernel_hashes, pending) if fill \
        else MeasuredFill([], {})
    if not fill:
        filled, defaulted = [], 0
    elif spec.dispatch.fill_rule == "ranked":
        filled, defaulted = _filled_ranked(spec, chip, fresh, pending, by_measure, records.records, kernel_hashes)
    else:
        filled, defaulted = _filled(spec, chip, fresh, by_measure)
    measured = [r for r in filled if r.measured is not None]
    rows = sorted(rows + filled, key=lambda r: sort_key(r.key))
    old.sort(key=lambda s: sort_key(s.record.key))
    checks = cross_checked(spec, chip, records.records, fresh, kernel_hashes) if fill \
        else CrossChecked((), len(fresh))
    order = {id(rec): i for i, rec in enumerate(records.records)}
    moved = tuple((r.key, stored[id(rec)], measured_kind(r))
                  for r in rows if (rec := measured_by(r)) is not None and id(rec) in stored)
    return FrozenTable(tuple(rows), tuple(old), len(filled), records.torn, checks, len(measured),
                       tuple(by_measure.kept), tuple(sorted(pending, key=sort_key)), defaulted,
                       toolchains_of(rows, order), moved)


def cross_checked(spec: OpSpec, chip: ChipProfile, records: Iterable[Record],
                  fresh: Mapping[Key, WinnerRecord], kernel_hashes: Mapping[str, str]) -> CrossChecked:
    """The latest current cross-check of each fresh winner: one that measured this winner, on
    the current kernels, against the fill the table would give its key from the other winners now
    (a check of another point, from ``--cross-check-all``, counts once the fill rule picks it)."""
    fills: dict[Key, tuple[str, dict[str, Any]]] = {}
    latest: dict[Key, CheckRecord] = {}
    for rec in records:
        if not isinstance(rec, CheckRecord) or not checked_frozen_winner(rec, fresh):
            continue
        won = fresh[rec.key]
        if rec.key not in fills:
            params = case_params(spec, won.case, f"cross-check of {rec.key}")
            fills[rec.key] = leave_one_out_fill(spec, chip, fresh, rec.key, params)[:2]
        variant, point = fills[rec.key]
        same_kernel = rec.fill_kernel_hash == kernel_hashes.get(variant)
        if (rec.fill_variant, rec.fill_point) == (variant, point) and same_kernel:
            latest[rec.key] = rec
    return CrossChecked(tuple(sorted(latest.values(), key=lambda r: sort_key(r.key))), len(fresh))


def checked_frozen_winner(rec: CheckRecord, fresh: Mapping[Key, WinnerRecord]) -> bool:
    """Whether a cross-check measured its key's frozen winner (same point, same kernel)."""
    won = fresh.get(rec.key)
    return won is not None and (rec.variant, rec.point, rec.kernel_hash) == (
        won.variant, won.point, won.kernel_hash)


def stale(spec: OpSpec, chip: ChipProfile, path: Path,
          kernel_hashes: Mapping[str, str]) -> list[StaleWinner]:
    """The winners in force at ``path`` that :func:`frozen_rows` does not freeze, sorted by key."""
    return list(frozen_rows(spec, chip, path, kernel_hashes, fill=False).stale)


def filled_rows(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
                measured: MeasuredFill) -> list[Row]:
    """The rows the table fills: the measured buckets (``measured``, :func:`fill_measured`), then
    the nearest fill from the tuned and measured buckets (:func:`fill_nearest`), which leaves the
    buckets kept at the default alone."""
    return _filled(spec, chip, tuned, measured)[0]


def _filled(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
            measured: MeasuredFill) -> tuple[list[Row], int]:
    """:func:`filled_rows`, and how many buckets the nearest fill left to the default because a
    bucket kept at it is nearer than any row (one pass of the nearest fill for both)."""
    sources = {**tuned, **stand_ins(measured.rows)}
    rows, defaulted = nearest_rows(spec, chip, sources, frozenset(measured.kept))
    return measured.rows + rows, defaulted


def _filled_ranked(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
                   pending: Mapping[Key, WinnerRecord], measured: MeasuredFill, records: Iterable[Record],
                   kernel_hashes: Mapping[str, str]) -> tuple[list[Row], int]:
    """The measured rows, then for every other untuned bucket of the nearest fill's categories
    the ranked fill's choice (:func:`opgen.table.fill_rank.fill_ranked`), and how many of those
    buckets it left to the spec's default."""
    evidence = gather(spec, chip, tuple(records), kernel_hashes, tuned, pending)
    winners = {**pending, **tuned}
    tunables = spec.tunables_for(chip.backend)
    taken = {*tuned, *(r.key for r in measured.rows), *measured.kept}
    rows, defaulted = list(measured.rows), 0
    for target in fill_targets(spec, [*taken], None):
        if target in taken:
            continue
        choice = fill_ranked(spec, chip, evidence, target)
        if choice is None or not choice.candidate.variant:
            defaulted += 1
            continue
        src = choice.candidate.sources[0]
        rows.append(Row(target, choice.variant, {n: choice.point[n] for n in tunables}, winners[src], src,
                        ranked=choice))
    return rows, defaulted
