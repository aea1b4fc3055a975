"""The side-by-side that picks a bucket's winner: the best few points of each study re-measured
in interleaved rounds (so drift between them cancels), the fastest taken by a fixed tie rule.

Uses ``bench``, ``plan``, ``search``, ``settings``, ``space``, ``spec``, ``worker``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from ..run import bench
from ..run.bench import geomean
from ..run.worker import Worker
from ..space.plan import Bucket
from ..space.space import Point, Variant, find_variant
from ..spec.spec import OpSpec
from .search import Measured
from .settings import Settings

Remeasure = Callable[[list[Point], Bucket], dict[Point, float]]


def tie_break(candidates: list[tuple[float, int, str, Any]], margin: float) -> Any:
    """The winner among ``(time, budget_bytes, name, payload)``: the fastest, except that any
    candidate within ``margin`` of the fastest competes on the smaller on-chip estimate, then on
    the name, so a repeated study with noisy times gives the same table."""
    best = min(c[0] for c in candidates)
    close = [c for c in candidates if c[0] <= best * (1.0 + margin)]
    return min(close, key=lambda c: (c[1], c[2]))[3]


def remeasure(worker: Worker, task_of: Callable[..., Any], points_: Sequence[Point], bucket: Bucket,
              settings: Settings) -> dict[Point, float]:
    """Geomean over the bucket's cases of interleaved re-measures of several points (inf for a
    point that failed on some case)."""
    one_round = bench.per_round(settings.protocol, settings.rounds)
    times: dict[Point, list[float]] = {p: [] for p in points_}
    for case in bucket.cases:
        samples: dict[Point, list[float]] = {p: [] for p in points_}
        for _ in range(settings.rounds):
            for p in points_:
                r = worker.run(task_of(p, case, protocol=one_round), settings.point_timeout)
                if r.status == "ok":
                    samples[p].append(r.median_ms)
        for p in points_:
            times[p].append(bench.median(samples[p]) if samples[p] else math.inf)
    return {p: geomean(t) if all(math.isfinite(x) for x in t) else math.inf for p, t in times.items()}


def choose(spec: OpSpec, bucket: Bucket, by_variant: dict[str, list[Measured]], held: Point | None,
           settings: Settings, again: Remeasure,
           budget: Callable[[Variant, Point, dict[str, Any], Any], dict[str, Any] | None],
           default: Point | None = None) -> dict[str, Any] | None:
    """Re-measure (``again``) the best few of each variant side by side, with the ``held`` point
    (the bucket's standing winner) and the spec's ``default`` point whenever they measured
    correct, so a new winner has always met both (the build's rule for the standing winner,
    :func:`opgen.table.table_records.held_winners`; a tuned row is never slower than the untuned choice it
    replaces); return the winner record's fields (``budget`` gives its on-chip bytes)."""
    candidates: list[Point] = []
    for measured in by_variant.values():
        ok = sorted((m for m in measured if m.ok), key=lambda m: m.value)
        candidates.extend(m.point for m in ok[: settings.top_k])
    for kept in (held, default):
        if kept is not None and kept not in candidates and any(
                m.point == kept and m.ok for ms in by_variant.values() for m in ms):
            candidates.append(kept)
    if not candidates:
        return None
    times = again(candidates, bucket)
    rows = []
    for p, t in times.items():
        if not math.isfinite(t):
            continue
        used = budget(find_variant(spec, p.variant), p, bucket.params[0], None)
        rows.append((t, used["estimate"] if used else 0, p.name(), p))
    if not rows:
        return None
    winner = tie_break(rows, settings.tie_margin)
    ordered = sorted(t for t, *_ in rows)
    margin = (ordered[1] / ordered[0] - 1.0) if len(ordered) > 1 else None
    best = next(m for ms in by_variant.values() for m in ms if m.point == winner)
    remeasured = {p.name(): round(t, 6) for p, t in sorted(times.items(), key=lambda kv: kv[0].name())}
    return dict(key=list(bucket.key), case=bucket.cases[0], variant=winner.variant,
                point=winner.config, median_ms=times[winner], remeasured_ms=remeasured,
                margin=margin, error=best.results[0].error,
                budget=budget(find_variant(spec, winner.variant), winner, bucket.params[0], best.results[0]))
