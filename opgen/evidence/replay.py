"""``opgen replay``: how well the search would have done on a recorded exhaustive sweep.

A sweep is every feasible point of one variant measured on one case (``opgen tune`` with a
large ``--trials`` and ``--records`` pointing to its own file). The replay reruns the tuner's
search loop (the same sampler and loop as :func:`opgen.tune.tune.search`) with the recorded times as
its measurements, for several seeds, and reports the best time found within a trial budget
against the exhaustive best. Uses ``records``, ``space``, ``tune``.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import RecordError
from ..run.bench import geomean
from ..run.worker import Result
from ..space.space import Point
from ..storage.records import TrialRecord, read
from ..tune.tune import Measured, Settings, make_sampler, search


@dataclass(frozen=True)
class Sweep:
    """Recorded times of every point of one variant (None where the point failed)."""

    variant: str
    times: dict[Point, float | None]

    @property
    def best(self) -> float:
        return min(t for t in self.times.values() if t is not None)


@dataclass(frozen=True)
class ReplayRun:
    """One seed's search: how many points it measured and the best it found."""

    seed: int
    measured: int
    best: float


def load_sweep(path: Path, op: str, chip: str, variant: str) -> Sweep:
    """The sweep of ``variant`` in a record file; geomean over cases where a point has several.

    Raises:
        RecordError: when the file holds no trial of that variant.
    """
    per_point: dict[Point, list[float | None]] = {}
    for rec in read(path, op=op, chip=chip).records:
        if isinstance(rec, TrialRecord) and rec.variant == variant:
            point = Point(variant, tuple(rec.point.items()))
            per_point.setdefault(point, []).append(rec.median_ms if rec.status == "ok" else None)
    if not per_point:
        raise RecordError(f"{path}: no trial records of variant {variant!r}")
    times = {p: (None if any(t is None for t in ts) else geomean(ts)) for p, ts in per_point.items()}
    return Sweep(variant, dict(sorted(times.items(), key=lambda kv: kv[0].name())))


def replay(sweep: Sweep, budget: int, seeds: range, settings: Settings = Settings()) -> list[ReplayRun]:
    """Run the tuner's search on the sweep's points with ``budget`` measured points per seed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    points = tuple(sweep.times)
    runs = []
    for seed in seeds:
        local = replace(settings, seed=seed, trials=budget, exhaustive_below=0)
        study = optuna.create_study(direction="minimize", sampler=_sampler(local, len(points)))

        def measure(point: Point) -> Measured:
            t = sweep.times[point]
            result = Result("ok", "", t) if t is not None else Result("compile_error", "recorded failure")
            return Measured(point, [result])

        done = search(study, points, [], local, math.inf, lambda batch: [measure(p) for p in batch],
                      lambda n, m: None)
        found = [m.value for m in done if m.ok]
        runs.append(ReplayRun(seed, len(done), min(found) if found else math.inf))
    return runs


def _sampler(settings: Settings, n_points: int):
    return make_sampler(settings, n_points)


def report(sweep: Sweep, runs: list[ReplayRun], budget: int, within: float) -> str:
    """Per-seed results and the summary line."""
    best = sweep.best
    lines = [f"sweep of {sweep.variant}: {len(sweep.times)} points, "
             f"{sum(t is None for t in sweep.times.values())} failed, exhaustive best {best:.4f} ms; "
             f"budget {budget} trials ({budget / len(sweep.times):.0%})",
             f"{'seed':>4} {'measured':>8} {'best ms':>9} {'gap':>7}"]
    for r in runs:
        lines.append(f"{r.seed:>4} {r.measured:>8} {r.best:>9.4f} {r.best / best - 1:>7.2%}")
    hits = sum(r.best <= best * (1 + within) for r in runs)
    gaps = [r.best / best - 1 for r in runs]
    lines.append(f"within {within:.0%} of the exhaustive best on {hits}/{len(runs)} seeds; "
                 f"median gap {statistics.median(gaps):.2%}, worst {max(gaps):.2%}")
    return "\n".join(lines)
