"""The optuna loop of one study: ask, measure, tell, over a finite set of feasible points.

Exhaustive search where the feasible space is small, seeded TPE otherwise; given points are
enqueued first; a point is never measured twice in a study, and a study resumes what its storage
holds. The only module that imports optuna's samplers and trial states (``tune`` opens studies,
``storage`` storages). Uses ``space``, ``worker``, ``settings``, ``bench``, ``storage``.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..run.bench import geomean
from ..run.worker import Result, timeout_of_reason
from ..space.space import Point
from ..storage.db import worker_id
from ..storage.storage import Heartbeat, heartbeat_seconds
from .settings import Settings


@dataclass
class Measured:
    """One point's results over its bucket's cases."""

    point: Point
    results: list[Result] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.status == "ok" for r in self.results)

    @property
    def value(self) -> float:
        return geomean(r.median_ms for r in self.results)


def make_sampler(settings: Settings, n_points: int):
    """Seeded TPE for large spaces; for small ones a seeded sampler that only replays the queue
    (every feasible point is enqueued: optuna's BruteForceSampler calls ``study.stop()``, which
    the ask-and-tell loop refuses)."""
    import optuna

    if n_points <= settings.exhaustive_below:
        return optuna.samplers.RandomSampler(seed=settings.seed)
    return optuna.samplers.TPESampler(seed=settings.seed, multivariate=True, constant_liar=settings.batch > 1,
                                      n_startup_trials=min(10, max(2, settings.trials // 3)))


def completed(point: Point, template: Point) -> Point:
    """``point`` with every tunable of ``template``: those it lacks (added to the spec since it was
    recorded) take the template's value, so an earlier winner still seeds a study after an edit."""
    have = point.config
    return Point(point.variant, tuple((name, have.get(name, value)) for name, value in template.values))


def search(study: Any, points_: tuple[Point, ...], enqueue: Iterable[Point], settings: Settings,
           deadline: float, measure: Callable[[list[Point]], list[Measured]],
           on_trial: Callable[[int, Measured], None],
           recorded: Callable[[int], list[Result]] | None = None) -> list[Measured]:
    """The ask-and-tell loop of one study over a finite set of feasible points.

    Resumes what the study already holds (a trial left RUNNING by a killed run is failed and
    measured again, unless it was measured and recorded before its tell; on a storage with
    heartbeats, each running trial beats until its tell, and optuna fails a stale one and queues
    it again, so the point's retry is measured first; a point that timed out
    under a shorter ``point_timeout`` than this run's, which may only have been slow, and one
    whose worker was killed from outside are enqueued again), enqueues ``enqueue`` first
    (and every point when the space is small), never measures a point twice, prunes suggestions outside the feasible set without
    measuring, and stops at ``settings.trials`` measured points, the deadline or an exhausted
    space. Points are asked ``settings.batch`` at a time (TPE with a constant liar), so
    ``measure`` may compile a batch in parallel before timing its points one by one. Each
    measured point goes to ``on_trial`` (the records) before the study stores it, so a run
    that ends between the two loses no measurement.

    ``recorded`` gives the results the records hold for a trial number (none: not recorded):
    a failed trial the records hold was measured by a process that died before marking it so,
    and counts as measured.

    Returns:
        Every point measured in this study, earlier runs included.
    """
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    names, fixed = _fixed(points_)
    searched = {n: list(dict.fromkeys(p.config[n] for p in points_)) for n in names if n not in fixed}
    feasible = {p.values: p for p in points_}
    beats = heartbeat_seconds(study._storage)
    if beats is not None:  # trials of a process that died: failed by their heartbeat, queued again
        _fail_stale(study, beats)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        value = _value_of(trial.user_attrs)  # measured and recorded, the run ended before its tell
        study.tell(trial.number, value, state=None if value is not None else TrialState.FAIL)
    seen, measured, retry = _resumed(study, names, fixed, feasible, settings, recorded)
    _enqueue(study, points_, enqueue, settings, searched, feasible, seen, retry)
    distributions = {n: CategoricalDistribution(v) for n, v in searched.items()}
    grid = math.prod(len(v) for v in searched.values())
    heart = Heartbeat(study._storage, beats) if beats is not None else None
    try:
        _loop(study, settings, deadline, measure, on_trial, names, fixed, feasible, distributions,
              grid, seen, measured, heart)
    finally:
        if heart is not None:
            heart.close()
    return measured


def _resumed(study: Any, names: list[str], fixed: dict[str, Any], feasible: dict[tuple, Point],
             settings: Settings, recorded: Callable[[int], list[Result]] | None
             ) -> tuple[dict[tuple, float | None], list[Measured], dict[tuple, None]]:
    """What the study's finished trials hold: the value of each point measured, the measured
    feasible points, and the points to measure again (in trial order): those that timed out under
    a shorter ``point_timeout`` or whose worker was killed."""
    from optuna.trial import TrialState

    seen: dict[tuple, float | None] = {}
    measured: list[Measured] = []
    retry: dict[tuple, None] = {}  # in trial order
    finished = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    for trial in study.get_trials(deepcopy=False, states=finished):  # a queued retry copies attrs
        attrs = trial.user_attrs
        if (recorded is not None and trial.state == TrialState.FAIL and not attrs.get("measured")
                and not attrs.get("duplicate")):  # a duplicate is never recorded
            results = recorded(trial.number)
            if results:  # recorded, then its process died: measured all the same
                attrs = {**_attrs_of(Measured(Point("", ()), results)), "measured": True}
        if attrs.get("measured") and not attrs.get("duplicate"):
            values = _trial_values(trial, names, fixed)
            if (timed_out_under(attrs) < settings.point_timeout or "killed" in attrs.get("status", ())):
                retry[values] = None
                continue
            retry.pop(values, None)
            seen[values] = _value_of(attrs)  # a measured trial its heartbeat failed too
            if values in feasible:  # a point the spec no longer allows stays out of the results
                measured.append(_measured_from_attrs(feasible[values], attrs))
    return seen, measured, retry


def _enqueue(study: Any, points_: tuple[Point, ...], enqueue: Iterable[Point], settings: Settings,
             searched: dict[str, list[Any]], feasible: dict[tuple, Point], seen: dict[tuple, float | None],
             retry: dict[tuple, None]) -> None:
    """Queue the retries, then ``enqueue``, then (in a small space) every point in seeded order,
    each feasible point not measured yet once."""
    queue = [feasible[v] for v in retry if v in feasible] + list(enqueue)
    if len(points_) <= settings.exhaustive_below:
        rest = list(points_)
        random.Random(settings.seed).shuffle(rest)
        queue += rest
    for point in dict.fromkeys(queue):
        if point.values in feasible and point.values not in seen:
            study.enqueue_trial({n: point.config[n] for n in searched},
                                skip_if_exists=point.values not in retry)


def _fail_stale(study: Any, beats: int) -> None:
    """Wait until no trial of the study runs under a live heartbeat: optuna fails each whose
    heartbeat is older than the grace period and queues it again (the storage's callback). The
    caller holds the study's bucket, so a running trial belongs to a process that stopped;
    after three grace periods, one that never beat is left to the caller."""
    import optuna
    from optuna.trial import TrialState

    grace = getattr(getattr(study._storage, "_backend", study._storage), "grace_period", None) or 2 * beats
    until = time.monotonic() + 3 * grace
    while True:
        optuna.storages.fail_stale_trials(study)
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) or time.monotonic() > until:
            return
        time.sleep(min(beats, 1.0))


def _loop(study: Any, settings: Settings, deadline: float, measure: Callable[[list[Point]], list[Measured]],
          on_trial: Callable[[int, Measured], None], names: list[str], fixed: dict[str, Any],
          feasible: dict[tuple, Point], distributions: dict[str, Any], grid: int,
          seen: dict[tuple, float | None], measured: list[Measured], heart: Heartbeat | None) -> None:
    """Ask, measure and tell until the study's budget, its deadline or its space is spent
    (:func:`search`); ``heart`` beats for each trial from its ask to its tell."""
    from optuna.trial import TrialState

    asked: set[tuple] = set()
    count = len(measured)
    asks, max_asks = 0, 20 * settings.trials + grid
    me = worker_id()
    while count < settings.trials and time.monotonic() < deadline:
        batch: list[tuple[Any, Point]] = []
        pending: set[tuple] = set()
        while (len(batch) < min(settings.batch, settings.trials - count) and asks < max_asks
               and len(asked) < grid and len(seen) + len(pending) < len(feasible)):
            asks += 1
            trial = study.ask(distributions)
            if heart is not None:
                heart.add(trial._trial_id)
            values = _trial_values(trial, names, fixed)
            asked.add(values)
            if values not in feasible or values in pending:
                study.tell(trial, state=TrialState.PRUNED)
                _told(heart, trial)
                continue
            if values in seen:
                trial.set_user_attr("duplicate", True)
                study.tell(trial, seen[values], state=None if seen[values] is not None else TrialState.FAIL)
                _told(heart, trial)
                continue
            pending.add(values)
            trial.set_user_attr("worker", me)  # the host and process measuring it
            batch.append((trial, feasible[values]))
        if not batch:
            break
        for (trial, point), result in zip(batch, measure([p for _, p in batch])):
            on_trial(trial.number, result)  # the record first: a run that ends now loses nothing
            for key, value in {**_attrs_of(result), "point_timeout": settings.point_timeout,
                               "measured": True}.items():  # "measured" last: the others are stored
                trial.set_user_attr(key, value)
            if result.ok:
                study.tell(trial, result.value)
                seen[point.values] = result.value
            else:
                study.tell(trial, state=TrialState.FAIL)
                seen[point.values] = None
            _told(heart, trial)
            measured.append(result)
            count += 1


def _told(heart: Heartbeat | None, trial: Any) -> None:
    """A told trial beats no more."""
    if heart is not None:
        heart.discard(trial._trial_id)


def _value_of(attrs: dict[str, Any]) -> float | None:
    """The objective of a measured trial from its attributes (None: not measured, or failed)."""
    if not attrs.get("measured") or any(s != "ok" for s in attrs["status"]) or not attrs["status"]:
        return None
    return geomean(attrs["median_ms"])


def timed_out_under(attrs: dict[str, Any]) -> float:
    """The point timeout under which a stored trial timed out (inf when it did not): its
    ``point_timeout`` attribute, or for trials stored before it existed, the worker's reason."""
    if "timeout" not in attrs.get("status", ()):
        return math.inf
    if "point_timeout" in attrs:
        return float(attrs["point_timeout"])
    limits = [timeout_of_reason(r) for r in attrs.get("reason", ())]
    return min((x for x in limits if x is not None), default=math.inf)


def _fixed(points_: tuple[Point, ...]) -> tuple[list[str], dict[str, Any]]:
    """The tunable names of a study's feasible points, and those with one value only there (never
    a searched param of its trials)."""
    names = [n for n, _ in points_[0].values]
    domains = {n: list(dict.fromkeys(p.config[n] for p in points_)) for n in names}
    return names, {n: v[0] for n, v in domains.items() if len(v) == 1}


def _trial_values(trial: Any, names: list[str], fixed: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The point a trial measured, as ``Point.values``."""
    return tuple((n, trial.params.get(n, fixed.get(n))) for n in names)


def _attrs_of(m: Measured) -> dict[str, Any]:
    return {"status": [r.status for r in m.results],
            "reason": [r.reason[:500] for r in m.results],
            "median_ms": [r.median_ms for r in m.results],
            "error": json.dumps([r.error for r in m.results])}


def _measured_from_attrs(point: Point, attrs: dict[str, Any]) -> Measured:
    m = Measured(point)
    errors = json.loads(attrs.get("error", "[]"))
    for status, reason, median, error in zip(attrs["status"], attrs["reason"], attrs["median_ms"], errors):
        m.results.append(Result(status, reason, median, (), error))
    return m


def stored_points(storage: Any, name: str, points_: tuple[Point, ...]) -> list[Measured]:
    """Every point of ``points_`` the study ``name`` measured in earlier runs, read without
    measuring or enqueuing (none when the study does not exist yet)."""
    import optuna

    if not points_ or name not in optuna.study.get_all_study_names(storage):
        return []
    study = optuna.load_study(study_name=name, storage=storage)
    feasible = {p.values: p for p in points_}
    names, fixed = _fixed(points_)
    out = []
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get("measured") and not trial.user_attrs.get("duplicate"):
            values = _trial_values(trial, names, fixed)
            if values in feasible:
                out.append(_measured_from_attrs(feasible[values], trial.user_attrs))
    return out
