"""The measure step of the table's fill (``opgen tune --measure-fill``): every tuned winner's
point, carried to each untuned bucket of a case set (the tunables its variant fixes, such as
vloop's one K tile, take their values there), deduplicated, and re-measured side by side on the
bucket where it may stand for the whole bucket, as Helion's ahead-of-time "measure" step does,
beside the spec's default for the bucket; one ``measure`` record per point and bucket, and a
bucket an earlier run already covers is kept. The build then fills each such bucket with the
point that ran fastest there, or leaves it to the default where that ran fastest
(:func:`opgen.table.fill_measured.fill_measured`). A candidate that never came near the fastest on
enough measured buckets is left out of the others (:func:`outrun`).

Uses ``bucket_shapes``, ``fill_measured``, ``fits``, ``hardware``, ``keys``, ``plan``, ``records``,
``space``, ``spec``.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from ..space.plan import Bucket
from ..space.space import Point, carried_clamped, case_inputs, default_point, evaluate_params, point_id
from ..spec.hardware import ChipProfile
from ..spec.keys import Key, key_text, sort_key
from ..spec.spec import OpSpec
from ..storage.records import MeasureRecord, Record, WinnerRecord, latest_measure_runs
from ..table.bucket_shapes import edge_params
from ..table.fill_measured import DEFAULT_SOURCE
from ..table.fits import point_fits, serves_bucket


@dataclass(frozen=True)
class FillMeasure:
    """One untuned bucket's candidates and their times (inf: failed there, for the reason given),
    fastest first; ``earlier`` names the run they come from when this one kept it."""

    key: Key
    times: tuple[tuple[str, Point, float, str], ...]  # (source, point, ms, reason)
    earlier: str = ""
    seconds: tuple[float, float] = (0.0, 0.0)  # spent compiling and checking, then timing


def earlier_runs(records: Iterable[Record], kernel_hashes: Mapping[str, str]) -> dict[Key, tuple[MeasureRecord, ...]]:
    """Per key, the records of its latest measure run, where each of them measured its variant's
    current kernel: a measure step keeps such a run where it holds every candidate of now."""
    return {key: latest for key, latest in latest_measure_runs(records).items()
            if all(kernel_hashes.get(r.variant) == r.kernel_hash for r in latest)}


def candidates(spec: OpSpec, profile: ChipProfile, tuned: Mapping[Key, Any]) -> list[tuple[Key, Point]]:
    """The distinct points of the tuned winners, each with the first key (in key order) it won."""
    tunables = spec.tunables_for(profile.backend)
    out: dict[Point, Key] = {}
    for key in sorted(tuned, key=sort_key):
        out.setdefault(Point.of(tuned[key].variant, tuned[key].point, tunables), key)
    return [(key, point) for point, key in out.items()]


@dataclass(frozen=True)
class Outrun:
    """A candidate the measure step leaves out: measured on ``buckets`` buckets of the current
    kernels, it ran at most ``best`` of the fastest candidate's speed on any of them."""

    key: Key
    point: Point
    buckets: int
    best: float


class MeasureInputs(NamedTuple):
    """What a measure step starts from: the tuned and the pending winners by key, the earlier runs
    it may keep (:func:`earlier_runs`), the candidates it leaves out (:func:`outrun`) and the rest
    of its candidate pool (:func:`candidates`)."""

    tuned: dict[Key, WinnerRecord]
    pending: dict[Key, WinnerRecord]
    earlier: dict[Key, tuple[MeasureRecord, ...]]
    left_out: list[Outrun]
    pool: list[tuple[Key, Point]]


def outrun(spec: OpSpec, profile: ChipProfile, pool: list[tuple[Key, Point]],
           runs: Mapping[Key, tuple[MeasureRecord, ...]], below: float, after: int) -> list[Outrun]:
    """The candidates of ``pool`` that ran under ``below`` of the fastest candidate's speed on every
    bucket of ``runs`` where they were measured, on ``after`` buckets or more (a failure counts as
    0): successive halving across buckets, since a point that never came near on that many shapes
    is not worth its compiles on the next. ``runs`` holds per key its records of one run or more
    (:func:`opgen.table.fill_measured.current_measures`); a run compares within itself, and a bucket
    counts its candidate's best share over its runs. ``below`` 0 leaves none out."""
    if below <= 0:
        return []
    ratios: dict[Point, list[float]] = {p: [] for _, p in pool}
    for recs in runs.values():
        best: dict[Point, float] = {}  # per candidate, its best share of the fastest over the key's runs
        for run in dict.fromkeys(r.run for r in recs):
            mine = [r for r in recs if r.run == run]
            ran = [r.ms for r in mine if r.ms is not None]
            if not ran:
                continue
            fastest = min(ran)
            times = {point_id(r.variant, r.point): r.ms for r in mine}
            params = evaluate_params(spec, case_inputs(spec, mine[0].case))
            largest = edge_params(spec, mine[0].case, f"measure run {run}")
            for _, point in pool:
                moved = carried_point_at(spec, profile, point, params, largest)
                if moved is not None and moved.ident in times:
                    ms = times[moved.ident]
                    best[point] = max(best.get(point, 0.0), 0.0 if ms is None else fastest / ms)
        for point, share in best.items():
            ratios[point].append(share)
    return [Outrun(key, point, len(ratios[point]), max(ratios[point]))
            for key, point in pool if len(ratios[point]) >= after and max(ratios[point]) < below]


def carried_point_at(spec: OpSpec, profile: ChipProfile, point: Point, params: Mapping[str, Any],
                     largest: Mapping[str, Any]) -> Point | None:
    """``point`` carried to one shape, its tiles clamped to ``largest``, the largest call of the
    bucket it is to serve (:func:`opgen.space.space.carried_clamped`); None where that fails."""
    config = carried_clamped(spec, profile, point.variant, point.config, params, largest)
    return None if config is None else Point.of(point.variant, config, spec.tunables_for(profile.backend))


def run_name(date: str, pool: list[tuple[Key, Point]], buckets_: list[Bucket]) -> str:
    """A run's name: its date and a digest of its candidates and cases."""
    text = json.dumps([[p.name() for _, p in pool], [b.cases for b in buckets_]], sort_keys=True, default=repr)
    return f"{date}/{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def bucket_candidates(spec: OpSpec, profile: ChipProfile, buckets_: list[Bucket], tuned: Mapping[Key, Any],
                      pending: Mapping[Key, Any] | None = None, left_out: Iterable[Outrun] = ()
                      ) -> list[tuple[Bucket, list[tuple[str, str, Point]]]]:
    """What the measure step (:func:`measure_fill`) runs on each untuned bucket of ``buckets_``:
    (source, study, point) per candidate carried there, then the spec's default where it is no
    candidate's point; buckets with none are left out."""
    sources = {**(pending or {}), **tuned}
    tunables = spec.tunables_for(profile.backend)
    won: dict[Point, set[Key]] = {}  # the keys each point won
    for key, w in sources.items():
        won.setdefault(Point.of(w.variant, w.point, tunables), set()).add(key)
    out_of = {o.point for o in left_out}
    pool = candidates(spec, profile, sources)
    out = []
    for bucket in buckets_:
        if bucket.key in tuned:
            continue
        here: list[tuple[str, str, Point]] = []
        for k, p in pool:
            if p in out_of and bucket.key not in won.get(p, ()):
                continue
            point = carried_point(spec, profile, p, bucket)
            if point is not None and all(point != q for _, _, q in here):
                here.append((f"winner of {k!r}", sources[k].study, point))
        default = _default_here(spec, profile, bucket)
        if default is not None and all(p != default for _, _, p in here):
            here.append((DEFAULT_SOURCE, "", default))
        if here:
            out.append((bucket, here))
    return out


def measure_plan(spec: OpSpec, profile: ChipProfile, buckets_: list[Bucket], tuned: Mapping[Key, Any],
                 earlier: Mapping[Key, tuple[MeasureRecord, ...]], pending: Mapping[Key, Any] | None = None,
                 left_out: Iterable[Outrun] = ()) -> str:
    """What ``opgen tune --measure-fill --dry-run`` prints: per untuned bucket, the candidates a
    measure step would compile, check and time there, or that an earlier run keeps it; then the
    totals (the compiles are per candidate and case), to plan a device's time by."""
    lines, kept, measured, points, tasks = [], 0, 0, 0, 0
    for bucket, here in bucket_candidates(spec, profile, buckets_, tuned, pending, left_out):
        if _kept(spec, profile, bucket, here, earlier.get(bucket.key, ())) is not None:
            kept += 1
            lines.append(f"{key_text(spec, bucket.key)}: kept (measured in run {earlier[bucket.key][0].run})")
            continue
        measured += 1
        points += len(here)
        tasks += len(here) * len(bucket.cases)
        cases = len(bucket.cases)
        lines.append(f"{key_text(spec, bucket.key)}: {len(here)} candidates on {cases} case{'s' * (cases != 1)}")
    lines.append(f"{measured} buckets to measure, {points} candidates, {tasks} compile-and-check tasks; {kept} kept")
    return "\n".join(lines)


def measure_fill(spec: OpSpec, profile: ChipProfile, buckets_: list[Bucket], tuned: Mapping[Key, Any],
                 run: str, check: Callable[[list[Point], Bucket], dict[Point, str]],
                 again: Callable[[list[Point], Bucket], dict[Point, float]],
                 sink: Callable[[str, dict[str, Any]], None],
                 earlier: Mapping[Key, tuple[MeasureRecord, ...]] | None = None,
                 pending: Mapping[Key, Any] | None = None, left_out: Iterable[Outrun] = (),
                 done: Callable[[FillMeasure], None] | None = None,
                 deadline: float | None = None) -> list[FillMeasure]:
    """On each bucket of ``buckets_`` that no winner holds, every candidate carried to the bucket
    (:func:`carried_point`: legal there and within budget on every case of the bucket), and the
    spec's default at the bucket's first case where it is no candidate's point and fits every
    case too: compiled and checked on its cases (``check``:
    per point, the reason it failed, empty if it passed), then the ones that passed re-measured
    side by side (``again``: geomean over the bucket's cases of interleaved runs); one ``measure``
    record per point (``run``: :func:`run_name`), a failed one with its reason. A bucket whose
    ``earlier`` run (:func:`earlier_runs`) measured every candidate of now on its first case is
    kept as it is: nothing is run or recorded there, so a measure step cut short resumes. The
    ``pending`` winners (:func:`opgen.table.table_records.pending_winners`) are candidates too, and their
    keys are measured as untuned ones. The points of ``left_out`` (:func:`outrun`) are measured on the
    bucket they won alone. ``done`` is given each bucket's result as soon as it has one. Past
    ``deadline`` (``time.monotonic()``) no other bucket is measured (kept ones are still returned):
    the results then hold fewer buckets than :func:`bucket_candidates` lists, and a later run
    resumes with the rest."""
    out = []
    for bucket, here in bucket_candidates(spec, profile, buckets_, tuned, pending, left_out):
        kept = _kept(spec, profile, bucket, here, (earlier or {}).get(bucket.key, ()))
        if kept is not None:
            out.append(kept)
            if done is not None:
                done(kept)
            continue
        if deadline is not None and time.monotonic() >= deadline:
            continue
        start = time.monotonic()
        failed = check([p for _, _, p in here], bucket)
        passed = [p for _, _, p in here if not failed[p]]
        checked = time.monotonic()
        times = again(passed, bucket) if passed else {}
        timed = time.monotonic()
        rows = []
        for source, study, point in here:
            ms = times.get(point, math.inf)
            reason = failed[point] or ("" if math.isfinite(ms) else "failed when timed")
            sink("measure", dict(key=list(bucket.key), case=bucket.cases[0], variant=point.variant,
                                 point=point.config, study=study, ms=ms if math.isfinite(ms) else None,
                                 source=source, run=run, reason=reason))
            rows.append((source, point, ms, reason))
        out.append(FillMeasure(bucket.key, tuple(sorted(rows, key=lambda t: (t[2], t[0]))),
                               seconds=(checked - start, timed - checked)))
        if done is not None:
            done(out[-1])
    return out


def _kept(spec: OpSpec, profile: ChipProfile, bucket: Bucket, here: list[tuple[str, str, Point]],
          earlier: tuple[MeasureRecord, ...]) -> FillMeasure | None:
    """The bucket's earlier run as its result, if it measured each of ``here`` on the bucket's
    first case; None otherwise."""
    tunables = spec.tunables_for(profile.backend)
    ran = {point_id(r.variant, r.point): r for r in earlier if r.case == bucket.cases[0]}
    if not earlier or any(p.ident not in ran for _, _, p in here):
        return None
    rows = [(r.source, Point.of(r.variant, r.point, tunables), math.inf if r.ms is None else r.ms, r.reason)
            for r in (ran[p.ident] for _, _, p in here)]
    return FillMeasure(bucket.key, tuple(sorted(rows, key=lambda t: (t[2], t[0]))), earlier[0].run)


def carried_point(spec: OpSpec, profile: ChipProfile, point: Point, bucket: Bucket) -> Point | None:
    """A tuned winner's point carried to the bucket (:func:`carried_point_at`: the tunables its
    variant fixes evaluated at the bucket's first case, its tiles clamped to the bucket's largest
    shape), if it may stand for the bucket from each of its cases
    (:func:`opgen.table.fits.serves_bucket`: legal and within budget there and on the bucket's largest
    shape); None otherwise."""

    moved = carried_point_at(spec, profile, point, bucket.params[0],
                             edge_params(spec, bucket.cases[0], f"bucket {bucket.key}"))
    if moved is None:
        return None
    return moved if all(serves_bucket(spec, profile, moved.variant, moved.config, case)
                        for case in bucket.cases) else None


def _default_here(spec: OpSpec, profile: ChipProfile, bucket: Bucket) -> Point | None:
    """The spec's default at the bucket's first case, if it is legal and fits every case of the
    bucket (None otherwise: the table cannot keep it there)."""
    point = default_point(spec, profile, bucket.params[0])
    return point if all(point_fits(spec, profile, point.variant, point.config, params)
                        for params in bucket.params) else None


FILL_HEADER = f"{'ms':>11}  candidate (the build fills each bucket with the fastest)"


def bucket_report(spec: OpSpec, r: FillMeasure) -> str:
    """One bucket's result for a person: its shapes, how it was measured (or kept), each
    candidate's time, fastest first."""
    how = (f" (measured in run {r.earlier}, kept)" if r.earlier else
           f" (checked in {r.seconds[0]:.0f} s, timed in {r.seconds[1]:.0f} s)")
    lines = [f"{key_text(spec, r.key)}:{how}"]
    lines.extend(f"  {ms:>9.4f}  {source}: {point.name()}" + (f" ({reason.splitlines()[0][:160]})" if reason else "")
                 for source, point, ms, reason in r.times)
    return "\n".join(lines)


def outrun_line(o: Outrun) -> str:
    """A candidate left out (:func:`outrun`), for a person."""
    return (f"left out (measured on the bucket it won alone): winner of {o.key!r}: {o.point.name()}, at most "
            f"{o.best:.3f} of the fastest's speed on {o.buckets} measured buckets")
