"""The measured fill: an untuned bucket that the measure step (``opgen.tune.measure_fill``) timed the
tuned winners' points on takes the one that ran fastest there over its runs (:func:`run_shares`),
or is kept at the spec's default where that ran fastest (:func:`fill_measured`).
Uses ``bucket_shapes``, ``errors``, ``fill_nearest``, ``fits``, ``hardware``, ``keys``, ``records``,
``space``, ``spec``, ``table_rows``.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, NamedTuple

from ..errors import RecordError
from ..space.space import carried_clamped, default_point, point_id
from ..spec.hardware import ChipProfile
from ..spec.keys import Key, sort_key, split_key_field
from ..spec.spec import OpSpec
from ..storage.records import MeasureRecord, Record, WinnerRecord, latest_measure_runs
from .bucket_shapes import case_params, edge_params
from .fill_nearest import nearest_order
from .fits import point_fits, serves_bucket
from .table_rows import Row

DEFAULT_SOURCE = "spec default"  # a measure record's source when its point is the bucket's default


def current_measures(records: Iterable[Record],
                     kernel_hashes: Mapping[str, str]) -> dict[Key, tuple[MeasureRecord, ...]]:
    """Per key, every measure record of a current kernel, of every run: what
    :func:`opgen.tune.measure_fill.outrun` weighs. A later run that left a candidate out takes none of
    its earlier evidence away, so what one measure step leaves out stays out on the next."""
    out: dict[Key, list[MeasureRecord]] = {}
    for rec in records:
        if isinstance(rec, MeasureRecord) and kernel_hashes.get(rec.variant) == rec.kernel_hash:
            out.setdefault(rec.key, []).append(rec)
    return {key: tuple(recs) for key, recs in out.items()}


class MeasuredFill(NamedTuple):
    """What the measure records decide (:func:`fill_measured`): the rows of the buckets a tuned
    point ran fastest on, and the buckets left to the spec's default, with the record of each."""

    rows: list[Row]
    kept: dict[Key, MeasureRecord]


def fill_measured(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
                  records: Iterable[Record], kernel_hashes: Mapping[str, str],
                  pending: Mapping[Key, WinnerRecord] | None = None) -> MeasuredFill:
    """What the measure records (``opgen tune --measure-fill``) decide for untuned keys: a row of
    the point of the key's latest run that ran fastest there over all its runs (its times over
    each run's fastest, geometric mean, :func:`run_shares`), among the points of ``tuned`` and
    ``pending`` winners (:func:`pending_winners`, which are no tuned keys),
    carried to the measured case as the measure step carries them (:func:`opgen.space.space.carried`),
    measured on their current kernel, that may stand for the key's whole bucket
    (:func:`serves_bucket`). Equal times go to the winner
    nearest the key (the nearest fill's order). A key whose run holds no such point (its
    winners replaced since, or every one failed there) is left to :func:`fill_nearest`. A key
    where the spec's default (measured on its current kernel, and still the default at the
    measured case) ran faster than every such point gets no row: it is kept at the default."""
    bucketed = [i for i, f in enumerate(spec.dispatch.key.values()) if split_key_field(f)[1]]
    tunables = spec.tunables_for(chip.backend)
    records = tuple(records)
    runs = {key: recs for key, recs in latest_measure_runs(records).items() if key not in tuned}
    shares = run_shares(records, kernel_hashes)
    sources = {**(pending or {}), **tuned}
    out = MeasuredFill([], {})
    holders_at: dict[tuple, dict[str, list[Key]]] = {}  # per measured case
    for key in sorted(runs, key=sort_key):
        latest = {(r.source == DEFAULT_SOURCE, point_id(r.variant, r.point)): r for r in runs[key]}
        order = nearest_order(bucketed, key)
        ranked, current = [], 0
        for (is_default, ident), rec in latest.items():
            try:
                params = case_params(spec, rec.case, f"measured fill of {key}")
            except RecordError:
                continue  # a case the spec no longer evaluates
            if is_default:
                if (rec.ms is not None and kernel_hashes.get(rec.variant) == rec.kernel_hash
                        and default_point(spec, chip, params).ident == ident
                        and point_fits(spec, chip, rec.variant, rec.point, params)):
                    ranked.append(((shares[key][True, ident], 1, ()), None, rec))  # a tie goes to a tuned point
                continue
            case = tuple(sorted(rec.case.items()))
            if case not in holders_at:
                largest = edge_params(spec, rec.case, f"measured fill of {key}")
                holders_at[case] = _carried_holders(spec, chip, sources, tunables, params, largest)
            owners = [k for k in holders_at[case].get(ident, ()) if sources[k].kernel_hash == rec.kernel_hash]
            if not owners:
                continue
            current += 1
            src = min(owners, key=lambda k: (_plain_mismatch(bucketed, k, key), order(k)))
            if rec.ms is not None and serves_bucket(spec, chip, rec.variant, rec.point, rec.case):
                score = shares[key][False, ident]
                ranked.append(((score, 0, (_plain_mismatch(bucketed, src, key), order(src))), src, rec))
        if not (ranked and current):  # a run whose tuned points are all stale compares nothing now
            continue
        _, src, rec = min(ranked, key=lambda t: t[0])
        if src is None:
            out.kept[key] = rec
        else:
            out.rows.append(Row(key, rec.variant, {n: rec.point[n] for n in tunables}, sources[src], src, rec))
    return out


def measured_choice(runs: Mapping[str, list[tuple[str, float]]], last: str | None) -> str:
    """The point the measure runs of a key found fastest, as the measured fill takes it: of the
    last run's points, the least share of each run's fastest over all runs (:func:`_shares`);
    "" with no run, or none that ran."""
    shares = _shares(runs)
    ran = {ident for ident, _ in runs.get(last, ())} if last is not None else set()
    return min(sorted(ran), key=lambda ident: shares[ident], default="")


def _shares(runs: Mapping[str, list[tuple[Any, float]]]) -> dict[Any, float]:
    """Each point's time over the fastest of its run, as a geometric mean over the runs that
    timed it (1.0: the fastest of every run it ran in)."""
    logs: dict[Any, list[float]] = {}
    for timed in runs.values():
        if not timed:
            continue
        fastest = min(ms for _, ms in timed)
        for ident, ms in dict(timed).items():
            logs.setdefault(ident, []).append(math.log(ms / fastest))
    return {ident: math.exp(sum(v) / len(v)) for ident, v in logs.items()}


def run_shares(records: Iterable[Record],
               kernel_hashes: Mapping[str, str]) -> dict[Key, dict[tuple[bool, str], float]]:
    """Per measured key, each point's time over the fastest of its run (1.0: the fastest), as a
    geometric mean over every run of the key that timed it on its current kernel: (is the spec's
    default, point identity) -> share. One run's ranking is its times'; over several, a point
    wins on all of them, not on the last alone (runs of one case have differed by 0.6% against 12%
    in ranking two points)."""
    out: dict[Key, dict[tuple[bool, str], float]] = {}
    for key, recs in current_measures(records, kernel_hashes).items():
        runs: dict[str, list[tuple[tuple[bool, str], float]]] = {}
        for rec in recs:
            if rec.ms is not None:
                runs.setdefault(rec.run, []).append(((rec.source == DEFAULT_SOURCE, point_id(rec.variant, rec.point)),
                                                     rec.ms))
        out[key] = _shares(runs)
    return out


def _carried_holders(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord], tunables: Iterable[str],
                     params: Mapping[str, Any], largest: Mapping[str, Any]) -> dict[str, list[Key]]:
    """The tuned keys by the identity of their winner's point carried to ``params``, its tiles
    clamped to ``largest`` (:func:`opgen.space.space.carried_clamped`), in key order: the points the
    measure step ran there."""
    holders: dict[str, list[Key]] = {}
    for key in sorted(tuned, key=sort_key):
        rec = tuned[key]
        config = carried_clamped(spec, chip, rec.variant, {n: rec.point[n] for n in tunables}, params, largest)
        if config is not None:
            holders.setdefault(point_id(rec.variant, config), []).append(key)
    return holders


def _plain_mismatch(bucketed: list[int], src: Key, target: Key) -> int:
    """How many plain (unbucketed) key fields differ between two keys."""
    return sum(1 for i, (a, b) in enumerate(zip(src, target)) if i not in bucketed and a != b)
