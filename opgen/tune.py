"""``opgen tune``: offline search, one optuna study per (op, variant, bucket, chip, toolchain, kernel).

A bucket is a value of the spec's dispatch key; its representative cases are the case-set rows
that fall into it, and a trial's objective is the geometric mean of its median times over them.
Studies live in optuna storage (a journal file by default, or an RDB URL shared by several
hosts), so a killed campaign resumes where it stopped; every measured trial is also appended to
the tracked tuning records. Exhaustive search where the feasible space is small, seeded TPE
otherwise; the spec's default and earlier winners are enqueued first; a point is never measured
twice in a study. The best few of each study (studies the deadline cut off and studies of
variants left out of the campaign with the points they hold), with the bucket's standing frozen
winner, are re-measured side by side and the winner is chosen by a fixed tie rule. The only
module that imports optuna.
Uses ``spec``, ``space``, ``worker``, ``records``, ``hardware``, ``bench``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from . import bench
from .bench import geomean
from .errors import UsageError
from .hardware import ChipProfile
from .keys import key_of, sort_key
from .space import (Point, SpaceCount, Variant, case_inputs, default_point, evaluate_params,
                    forced_point, is_legal, points, variants_for)
from .spec import OpSpec
from .worker import Result, Task, Worker


@dataclass(frozen=True)
class Settings:
    """Budgets and rules of a campaign (the single source of its defaults).

    Attributes:
        trials: measured points per study at most.
        study_seconds, campaign_seconds: wall-clock budgets; a study gets at most
            ``study_seconds`` and at most an equal share of what the campaign has left
            (:meth:`Settings.study_budget`), so a tight campaign still reaches every study.
        exhaustive_below: feasible spaces this small are searched exhaustively.
        top_k: best points of each study re-measured side by side.
        tie_margin: relative gap under which two times are a tie (broken by the smaller
            on-chip estimate, then by the point's name).
        seed: sampler seed.
        point_timeout: seconds a single point may take (compile, check and timing).
        rounds: interleaved rounds of the side-by-side re-measure.
        compile_workers: extra worker processes that compile and check a batch of points in
            parallel before the timing worker measures them one by one (0: none).
    """

    trials: int = 40
    study_seconds: float = 900.0
    campaign_seconds: float = 3 * 3600.0
    exhaustive_below: int = 64
    top_k: int = 3
    tie_margin: float = 0.02
    seed: int = 0
    point_timeout: float = 300.0
    rounds: int = 5
    compile_workers: int = 0
    protocol: bench.Protocol = bench.DEFAULT

    def study_budget(self, campaign_left: float, studies_left: int) -> float:
        """Seconds for the next study: ``study_seconds``, or an equal share of the campaign's
        remaining seconds over the studies still to run when that is less (time a short study
        leaves unused flows to the later ones)."""
        return max(0.0, min(self.study_seconds, campaign_left / max(1, studies_left)))

    @property
    def batch(self) -> int:
        """Points asked at once: one per compile worker (1 without them)."""
        return max(1, self.compile_workers)


@dataclass(frozen=True)
class Bucket:
    """One dispatch-key value and the case rows that represent it."""

    key: tuple[Any, ...]
    cases: tuple[dict[str, Any], ...]
    params: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class StudyPlan:
    """A study: one variant on one bucket, with its feasible points and what was cut."""

    bucket: Bucket
    variant: Variant
    points: tuple[Point, ...]
    count: SpaceCount
    default: Point | None

    def name(self, op: str, chip: str, toolchain: dict[str, str], kernel: str = "") -> str:
        """The study's identity: op, variant, bucket, chip, toolchain, a digest of the values
        each tunable takes over the feasible points (optuna cannot resume a study whose
        categorical choices changed, so a changed domain starts a new study), a digest of the
        bucket's cases (a study's objective is its geomean over them: other cases, other study)
        and the hash of the variant's rendered kernel (an edited kernel is measured afresh: its
        old timings and wrong results say nothing about it)."""
        tools = ",".join(f"{k}={v}" for k, v in sorted(toolchain.items()) if k != "device")
        key = ",".join(str(k) for k in self.bucket.key)
        domains = {n: sorted({repr(p.config[n]) for p in self.points}) for n, _ in self.points[0].values} \
            if self.points else {}
        space = _digest(domains)
        cases = _digest([sorted(row.items()) for row in self.bucket.cases])
        return f"{op}|{self.variant.name}|{key}|{chip}|{tools}|space={space}|cases={cases}" + \
            (f"|kernel={kernel}" if kernel else "")


def _digest(value: Any) -> str:
    """Eight hex digits of a JSON-able value's sha256."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:8]


def buckets(spec: OpSpec, rows: Iterable[dict[str, Any]]) -> list[Bucket]:
    """Group case rows by dispatch key, in order of first appearance."""
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for row in rows:
        params = evaluate_params(spec, case_inputs(spec, row))
        groups.setdefault(key_of(spec, params), []).append((dict(row), params))
    return [Bucket(k, tuple(r for r, _ in v), tuple(p for _, p in v)) for k, v in groups.items()]


def plan(spec: OpSpec, profile: ChipProfile, rows: Iterable[dict[str, Any]],
         variants: Iterable[str] | None = None) -> list[StudyPlan]:
    """Every study of a campaign: legal variants of each bucket with their feasible points.

    A point is feasible only if it fits the budget for every case of its bucket.

    Raises:
        UsageError: a name in ``variants`` that is no variant of the chip's rendering.
    """
    wanted = set(variants) if variants else None
    known = [v.name for v in variants_for(spec, profile.rendering)]
    if wanted is not None and wanted - set(known):
        raise UsageError(f"{spec.op} has no variant {', '.join(sorted(wanted - set(known)))} on "
                               f"{profile.name} ({profile.rendering} rendering); known: {', '.join(known)}")
    out = []
    for bucket in buckets(spec, rows):
        for variant in variants_for(spec, profile.rendering):
            if wanted is not None and variant.name not in wanted:
                continue
            if not all(is_legal(spec, variant, p) for p in bucket.params):
                continue
            per_case = [points(spec, variant, profile, p) for p in bucket.params]
            common = set(per_case[0][0]).intersection(*(set(pts) for pts, _ in per_case[1:]))
            kept = tuple(p for p in per_case[0][0] if p in common)
            default = default_point(spec, profile, bucket.params[0])
            out.append(StudyPlan(bucket, variant, kept, per_case[0][1],
                                 default if default.variant == variant.name else None))
    return out


def shard_plans(plans: list[StudyPlan], k: int, n: int, cap: int | None = None) -> list[StudyPlan]:
    """The studies of the K-th of N shares of the buckets, weighed by the points they may measure
    (at most ``cap`` per study); every shard computes the same split (``opgen.shard.assign``)."""
    from .shard import assign

    keys = list(dict.fromkeys(p.bucket.key for p in plans))
    weight = {key: 0.0 for key in keys}
    for p in plans:
        weight[p.bucket.key] += min(len(p.points), cap) if cap else len(p.points)
    mine = {key for key, s in zip(keys, assign([weight[key] for key in keys], n)) if s == k}
    return [p for p in plans if p.bucket.key in mine]


def dry_run_table(spec: OpSpec, profile: ChipProfile, plans: list[StudyPlan]) -> str:
    """What ``opgen tune --dry-run`` prints: points per study, what was cut and why."""
    lines = [f"{spec.op} on {profile.name}: {len(plans)} studies",
             f"{'bucket':<44} {'variant':<28} {'points':>6} {'dup':>5} {'constr':>6} "
             f"{'budget':>6} {'feasible':>8} {'cases':>5}  reasons"]
    for p in plans:
        c = p.count
        key = ",".join(str(k) for k in p.bucket.key)
        reasons = "; ".join(f"{r} x{n}" for r, n in c.reasons) or "-"
        lines.append(f"{key:<44} {p.variant.name:<28} {c.total:>6} {c.duplicates:>5} "
                     f"{c.constrained:>6} {c.over_budget:>6} {len(p.points):>8} {len(p.bucket.cases):>5}  {reasons}")
    lines.append("dup, constr, budget and reasons: on each bucket's first case; feasible: the points "
                 "that fit every case of the bucket (the ones searched)")
    return "\n".join(lines)


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


def tie_break(candidates: list[tuple[float, int, str, Any]], margin: float) -> Any:
    """The winner among ``(time, budget_bytes, name, payload)``: the fastest, except that any
    candidate within ``margin`` of the fastest competes on the smaller on-chip estimate, then on
    the name, so a repeated study with noisy times gives the same table."""
    best = min(c[0] for c in candidates)
    close = [c for c in candidates if c[0] <= best * (1.0 + margin)]
    return min(close, key=lambda c: (c[1], c[2]))[3]


class Campaign:
    """Runs the studies of one op on one chip and writes records.

    Args:
        spec, profile: the op and the chip.
        root: project root.
        backend, device, programs: where points run and the device's core count.
        storage: an optuna storage object (journal file or RDB).
        sink: called with (kind, fields) for each trial and winner (the records writer).
        toolchain: versions keying the studies and records.
        settings: budgets and rules.
        kernel_hash: variant name -> content hash of its generated kernel module.
        worker_env: environment of the worker processes (e.g. TRITON_INTERPRET=1).
        max_rel_l2: dtype name -> precision bar (rel L2 against the golden), from the spec.
    """

    def __init__(self, spec: OpSpec, profile: ChipProfile, root: str, backend: str, device: str,
                 programs: int, storage: Any, sink: Callable[[str, dict[str, Any]], None],
                 toolchain: dict[str, str], settings: Settings, kernel_hash: dict[str, str],
                 worker_env: dict[str, str] | None = None,
                 max_rel_l2: dict[str, float] | None = None, progress: bool = True) -> None:
        self.spec, self.profile, self.root = spec, profile, root
        self.backend, self.device, self.programs = backend, device, programs
        self.storage, self.sink, self.toolchain = storage, sink, toolchain
        self.settings, self.kernel_hash = settings, kernel_hash
        self.max_rel_l2 = max_rel_l2 or {}
        self.worker = Worker(spec, root, worker_env)
        self.pool = [Worker(spec, root, worker_env) for _ in range(settings.compile_workers)]
        self.progress = progress
        self.deadline = time.monotonic() + settings.campaign_seconds

    # --- one point --------------------------------------------------------------------------
    def _task(self, point: Point, case: dict[str, Any], timed: bool = True,
              protocol: bench.Protocol | None = None) -> Task:
        return Task(op=self.spec.op, rendering=self.profile.rendering,
                    variant=point.variant, point=point.values, case=tuple(case.items()),
                    backend=self.backend, device=self.device, programs=self.programs,
                    seed=self.settings.seed, max_rel_l2=self.max_rel_l2.get(str(case.get("dtype"))),
                    timed=timed, protocol=protocol or self.settings.protocol)

    def measure(self, point: Point, bucket: Bucket) -> Measured:
        """Run a point on every case of its bucket; stop at the first failure."""
        out = Measured(point)
        for case in bucket.cases:
            result = self.worker.run(self._task(point, case), self.settings.point_timeout)
            out.results.append(result)
            if result.status != "ok":
                break
        return out

    def measure_batch(self, points_: list[Point], bucket: Bucket) -> list[Measured]:
        """Measure several points: compile and check them in parallel first when the campaign
        has compile workers, then time the rest one by one. A failure in the parallel phase is
        final, except a timeout: the workers share the device and the host, so a slow point
        (a large case, a long compile) may only have waited for the others; it is measured
        again alone, under the same timeout, and a real hang costs two timeouts."""
        if not self.pool or len(points_) < 2:
            return [self.measure(p, bucket) for p in points_]
        import queue
        from concurrent.futures import ThreadPoolExecutor

        free: queue.Queue = queue.Queue()
        for worker in self.pool:
            free.put(worker)

        def compile_one(task: Task) -> Result:
            worker = free.get()
            try:
                return worker.run(task, self.settings.point_timeout)
            finally:
                free.put(worker)

        tasks = [self._task(p, case, timed=False) for p in points_ for case in bucket.cases]
        with ThreadPoolExecutor(len(self.pool)) as pool:
            checked = list(pool.map(compile_one, tasks))
        out = []
        for i, point in enumerate(points_):
            results = checked[i * len(bucket.cases):(i + 1) * len(bucket.cases)]
            failed = next((r for r in results if r.status != "ok"), None)
            final = failed is not None and failed.status != "timeout"
            out.append(Measured(point, [failed]) if final else self.measure(point, bucket))
        return out

    # --- one study --------------------------------------------------------------------------
    def run_study(self, plan: StudyPlan, enqueue: Iterable[Point] = (),
                  seconds: float | None = None) -> list[Measured]:
        """Search one variant on one bucket for ``seconds`` at most (``study_seconds`` by
        default); return every point measured (this run or before)."""
        import optuna

        if not plan.points:
            return []
        name = self.study_name(plan)
        study = optuna.create_study(study_name=name, storage=self.storage, direction="minimize",
                                    sampler=make_sampler(self.settings, len(plan.points)),
                                    load_if_exists=True)
        seconds = self.settings.study_seconds if seconds is None else seconds
        deadline = min(self.deadline, time.monotonic() + seconds)
        return search(study, plan.points, enqueue, self.settings, deadline,
                      lambda points_: self.measure_batch(points_, plan.bucket),
                      lambda number, m: self._emit_trial(name, number, plan, m))

    def study_name(self, plan: StudyPlan) -> str:
        """The study's identity (:meth:`StudyPlan.name`) on this campaign's toolchain and kernels."""
        kernel = self.kernel_hash.get(plan.variant.name, "")
        return plan.name(self.spec.op, self.profile.name, self.toolchain, kernel)

    def stored(self, plan: StudyPlan) -> list[Measured]:
        """Every point a study measured in earlier runs, read without measuring or enqueuing (none
        when the study does not exist yet)."""
        import optuna

        name = self.study_name(plan)
        if not plan.points or name not in optuna.study.get_all_study_names(self.storage):
            return []
        study = optuna.load_study(study_name=name, storage=self.storage)
        feasible = {p.values: p for p in plan.points}
        names, fixed = _fixed(plan.points)
        out = []
        for trial in study.get_trials(deepcopy=False):
            if trial.user_attrs.get("measured") and not trial.user_attrs.get("duplicate"):
                values = _trial_values(trial, names, fixed)
                if values in feasible:
                    out.append(_measured_from_attrs(feasible[values], trial.user_attrs))
        return out

    def _emit_trial(self, study: str, number: int, plan: StudyPlan, m: Measured) -> None:
        for case, params, result in zip(plan.bucket.cases, plan.bucket.params, m.results):
            self.sink("trial", dict(
                study=study, trial=number, key=list(plan.bucket.key), case=case,
                variant=plan.variant.name, point=m.point.config, status=result.status,
                reason=result.reason, median_ms=result.median_ms, times_ms=list(result.times_ms),
                error=result.error, budget=self._budget(plan.variant, m.point, params, result)))

    def _budget(self, variant: Variant, point: Point, params: dict[str, Any],
                result: Result | None = None) -> dict[str, Any] | None:
        from .space import budget_bytes

        used = budget_bytes(self.spec, variant, point.config, params, self.profile)
        if used is None:
            return None
        real = result.reported if result is not None else {}
        reported = None
        if "shared" in real:
            reported = real["shared"]
        elif "required_ub_bits" in real:
            reported = real["required_ub_bits"] // 8
        out = {"kind": used[0], "estimate": used[1], "reported": reported}
        out.update({k: real[name] for k, name in (("regs", "n_regs"), ("spills", "n_spills")) if name in real})
        return out

    # --- winners ----------------------------------------------------------------------------
    def side_by_side(self, points_: list[Point], bucket: Bucket) -> dict[Point, float]:
        """Geomean over the bucket's cases of interleaved re-measures of several points."""
        one_round = bench.per_round(self.settings.protocol, self.settings.rounds)
        times: dict[Point, list[float]] = {p: [] for p in points_}
        for case in bucket.cases:
            samples: dict[Point, list[float]] = {p: [] for p in points_}
            for _ in range(self.settings.rounds):
                for p in points_:
                    r = self.worker.run(self._task(p, case, protocol=one_round), self.settings.point_timeout)
                    if r.status == "ok":
                        samples[p].append(r.median_ms)
            for p in points_:
                times[p].append(bench.median(samples[p]) if samples[p] else math.inf)
        return {p: geomean(t) if all(math.isfinite(x) for x in t) else math.inf for p, t in times.items()}

    def choose(self, bucket: Bucket, by_variant: dict[str, list[Measured]],
               held: Point | None = None) -> dict[str, Any] | None:
        """Re-measure the best few of each variant side by side, with the ``held`` point (the
        bucket's standing winner) whenever it measured correct, so a new winner has always met it
        (the build's rule, :func:`opgen.table.held_winners`); return the winner's fields."""
        from .space import find_variant

        candidates: list[Point] = []
        for measured in by_variant.values():
            ok = sorted((m for m in measured if m.ok), key=lambda m: m.value)
            candidates.extend(m.point for m in ok[: self.settings.top_k])
        if held is not None and held not in candidates and any(
                m.point == held and m.ok for ms in by_variant.values() for m in ms):
            candidates.append(held)
        if not candidates:
            return None
        times = self.side_by_side(candidates, bucket)
        rows = []
        for p, t in times.items():
            if not math.isfinite(t):
                continue
            used = self._budget(find_variant(self.spec, p.variant), p, bucket.params[0])
            rows.append((t, used["estimate"] if used else 0, p.name(), p))
        if not rows:
            return None
        winner = tie_break(rows, self.settings.tie_margin)
        ordered = sorted(t for t, *_ in rows)
        margin = (ordered[1] / ordered[0] - 1.0) if len(ordered) > 1 else None
        best = next(m for ms in by_variant.values() for m in ms if m.point == winner)
        return dict(key=list(bucket.key), case=bucket.cases[0], variant=winner.variant,
                    point=winner.config, median_ms=times[winner],
                    remeasured_ms={p.name(): round(t, 6) for p, t in sorted(times.items(), key=lambda kv: kv[0].name())},
                    margin=margin, error=best.results[0].error,
                    budget=self._budget(find_variant(self.spec, winner.variant), winner,
                                        bucket.params[0], best.results[0]))

    def cross_check(self, buckets_: list[Bucket], tuned: dict[tuple, Any], margin: float,
                    every: bool = False) -> list[CrossCheck]:
        """Re-measure each tuned bucket's winner beside the choice the table would give that
        bucket from the other buckets' winners alone (how a shape between tuned points fares)
        and, with ``every``, beside every other bucket's winner that is legal and fits there; one
        record per point measured beside the winner (``margin``: the loss that flags the table).
        The workers are closed again afterwards."""
        from .table import fits_case, leave_one_out_fill

        tunables = self.spec.tunables_for(self.profile.backend)
        out = []
        for bucket in buckets_:
            winner = tuned.get(bucket.key)
            if winner is None:
                continue
            own = Point.of(winner.variant, winner.point, tunables)
            variant, point, source = leave_one_out_fill(self.spec, self.profile, tuned, bucket.key,
                                                        bucket.params[0])
            fill = Point.of(variant, point, tunables)
            beside = {fill: source} if fill != own else {}
            for key, other in (sorted(tuned.items(), key=lambda kv: sort_key(kv[0])) if every else ()):
                p = Point.of(other.variant, other.point, tunables)
                if p != own and p not in beside and fits_case(self.spec, self.profile, other, bucket.params[0]):
                    beside[p] = f"winner of {key!r}"
            times = self.side_by_side([own, *beside], bucket)
            others = tuple((src, p, times[p]) for p, src in beside.items() if p != fill)
            check = CrossCheck(bucket.key, own, source, fill, times[own], times.get(fill, times[own]), others)
            out.append(check)
            finite = lambda t: t if math.isfinite(t) else None  # noqa: E731 - a failed re-measure
            for p, src in ({own: source, **beside} if fill == own else beside).items():
                self.sink("cross_check", dict(
                    key=list(bucket.key), case=bucket.cases[0], variant=own.variant, point=own.config,
                    study=winner.study, fill_variant=p.variant, fill_point=p.config, fill_from=src,
                    own_ms=finite(times[own]), fill_ms=finite(times[p]), margin=margin))
        for worker in (self.worker, *self.pool):
            worker.close()
        return out

    def run(self, plans: list[StudyPlan], earlier: dict[tuple, list[Point]] | None = None,
            rivals: Iterable[StudyPlan] = (), standing: Mapping[tuple, Point] | None = None) -> list[dict[str, Any]]:
        """Run every study, bucket by bucket, each within its share of the campaign's time, and
        emit one winner per bucket; each study measures the spec's default and ``earlier`` winners
        of its bucket first. The stored points of ``rivals`` (studies of variants this campaign
        does not search) compete for their buckets too, and so does the ``standing`` winner of a
        bucket (the row the table freezes now), measured again when no study of this run holds
        it (a trial record numbered -1 in its variant's study): a narrower, shorter or
        journal-less campaign loses nothing it had. Buckets without a standing winner go first."""
        from tqdm import tqdm

        earlier, standing = earlier or {}, standing or {}
        by_bucket: dict[tuple, list[StudyPlan]] = {}
        for p in plans:
            by_bucket.setdefault(p.bucket.key, []).append(p)
        others: dict[tuple, list[StudyPlan]] = {}
        for p in rivals:
            others.setdefault(p.bucket.key, []).append(p)
        winners = []
        left = sum(1 for p in plans if p.points)
        bar = tqdm(total=len(plans), desc=f"tune {self.spec.op} on {self.profile.name}",
                   unit="study", disable=not self.progress)
        try:
            # buckets with no frozen winner first: a campaign cut short spends its time where the
            # table knows least (in plan order within each group)
            for key, group in sorted(by_bucket.items(), key=lambda kv: kv[0] in standing):
                by_variant: dict[str, list[Measured]] = {}
                for p in group:
                    if time.monotonic() >= self.deadline:  # no time to search: what it holds competes
                        by_variant[p.variant.name] = self.stored(p)
                        bar.update(1)
                        continue
                    enqueue = [x for x in (p.default,) if x is not None]
                    if earlier.get(key):  # tunables added since: the defaults with this variant forced
                        template = forced_point(self.spec, self.profile, p.variant, p.bucket.params[0])
                        enqueue += [completed(b, template) for b in earlier[key]]
                    seconds = self.settings.study_budget(self.deadline - time.monotonic(), left)
                    by_variant[p.variant.name] = self.run_study(p, enqueue, seconds)
                    left -= bool(p.points)
                    bar.update(1)
                    bar.set_postfix_str(f"{p.variant.name} {len(by_variant[p.variant.name])} pts")
                for p in others.get(key, ()):
                    by_variant.setdefault(p.variant.name, self.stored(p))
                held = standing.get(key)
                home = next((p for p in (*group, *others.get(key, ()))
                             if held is not None and p.variant.name == held.variant), None)
                if home is not None and not any(m.point == held for ms in by_variant.values() for m in ms):
                    again = self.measure_batch([held], home.bucket)[0]
                    self._emit_trial(self.study_name(home), -1, home, again)  # -1: outside the search
                    if not again.ok:
                        r = next(r for r in again.results if r.status != "ok")
                        print(f"standing winner {held.name()} of {key} failed again: {r.status} {r.reason}",
                              file=sys.stderr)
                    by_variant[held.variant] = [*by_variant.get(held.variant, []), again]
                winner = self.choose(group[0].bucket, by_variant, held)
                if winner is not None:
                    winner["study"] = self.study_name(group[0])
                    self.sink("winner", winner)
                    winners.append(winner)
        finally:
            bar.close()
            for worker in (self.worker, *self.pool):
                worker.close()
        return winners


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
           on_trial: Callable[[int, Measured], None]) -> list[Measured]:
    """The ask-and-tell loop of one study over a finite set of feasible points.

    Resumes what the study already holds (a trial left RUNNING by a killed run is failed and
    measured again, and so is a point that timed out under a shorter ``point_timeout`` than this
    run's: it may only have been slow), enqueues ``enqueue`` first (and every point when the space
    is small), never measures a point twice, prunes suggestions outside the feasible set without
    measuring, and stops at ``settings.trials`` measured points, the deadline or an exhausted
    space. Points are asked ``settings.batch`` at a time (TPE with a constant liar), so
    ``measure`` may compile a batch in parallel before timing its points one by one.

    Returns:
        Every point measured in this study, earlier runs included.
    """
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    names, fixed = _fixed(points_)
    searched = {n: list(dict.fromkeys(p.config[n] for p in points_)) for n in names if n not in fixed}
    feasible = {p.values: p for p in points_}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)  # killed mid-measure: measure again
    seen: dict[tuple, float | None] = {}
    measured: list[Measured] = []
    retry: set[tuple] = set()
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get("measured") and not trial.user_attrs.get("duplicate"):
            values = _trial_values(trial, names, fixed)
            if timed_out_under(trial.user_attrs) < settings.point_timeout:
                retry.add(values)
                continue
            retry.discard(values)
            seen[values] = trial.value if trial.state == TrialState.COMPLETE else None
            if values in feasible:  # a point the spec no longer allows stays out of the results
                measured.append(_measured_from_attrs(feasible[values], trial.user_attrs))
    queue = list(enqueue)
    if len(points_) <= settings.exhaustive_below:
        import random

        rest = list(points_)
        random.Random(settings.seed).shuffle(rest)
        queue += rest
    for point in queue:
        if point.values in feasible and point.values not in seen:
            study.enqueue_trial({n: point.config[n] for n in searched},
                                skip_if_exists=point.values not in retry)
    distributions = {n: CategoricalDistribution(v) for n, v in searched.items()}
    grid = math.prod(len(v) for v in searched.values())
    asked: set[tuple] = set()
    count = len(measured)
    asks, max_asks = 0, 20 * settings.trials + grid
    while count < settings.trials and time.monotonic() < deadline:
        batch: list[tuple[Any, Point]] = []
        pending: set[tuple] = set()
        while (len(batch) < min(settings.batch, settings.trials - count) and asks < max_asks
               and len(asked) < grid and len(seen) + len(pending) < len(feasible)):
            asks += 1
            trial = study.ask(distributions)
            values = _trial_values(trial, names, fixed)
            asked.add(values)
            if values not in feasible or values in pending:
                study.tell(trial, state=TrialState.PRUNED)
                continue
            if values in seen:
                trial.set_user_attr("duplicate", True)
                study.tell(trial, seen[values], state=None if seen[values] is not None else TrialState.FAIL)
                continue
            pending.add(values)
            batch.append((trial, feasible[values]))
        if not batch:
            break
        for (trial, point), result in zip(batch, measure([p for _, p in batch])):
            for key, value in {**_attrs_of(result), "point_timeout": settings.point_timeout}.items():
                trial.set_user_attr(key, value)
            if result.ok:
                study.tell(trial, result.value)
                seen[point.values] = result.value
            else:
                study.tell(trial, state=TrialState.FAIL)
                seen[point.values] = None
            measured.append(result)
            count += 1
            on_trial(trial.number, result)
    return measured


@dataclass(frozen=True)
class CrossCheck:
    """Leave-one-out check of a tuned bucket: its own winner against the row the table would
    fill it with from the other buckets' winners (None: the spec's default would serve it)."""

    key: tuple[Any, ...]
    own: Point
    fill_from: str | None
    fill: Point
    own_ms: float
    fill_ms: float
    others: tuple[tuple[str, Point, float], ...] = ()  # (source, point, ms) of further winners

    @property
    def best_other(self) -> tuple[str, Point, float] | None:
        """The fastest point measured beside the own winner, the fill included (None: none was)."""
        pool = list(self.others) + ([(self.fill_from or "spec default", self.fill, self.fill_ms)]
                                    if self.fill != self.own else [])
        return min(pool, key=lambda o: o[2], default=None)

    @property
    def loss(self) -> float:
        """Relative time lost by the fill choice (0 when it is the bucket's own winner)."""
        return self.fill_ms / self.own_ms - 1.0


def timed_out_under(attrs: dict[str, Any]) -> float:
    """The point timeout under which a stored trial timed out (inf when it did not): its
    ``point_timeout`` attribute, or for trials stored before it existed, the worker's reason."""
    from .worker import timeout_of_reason

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
    return {"measured": True, "status": [r.status for r in m.results],
            "reason": [r.reason[:500] for r in m.results],
            "median_ms": [r.median_ms for r in m.results],
            "error": json.dumps([r.error for r in m.results])}


def _measured_from_attrs(point: Point, attrs: dict[str, Any]) -> Measured:
    m = Measured(point)
    errors = json.loads(attrs.get("error", "[]"))
    for status, reason, median, error in zip(attrs["status"], attrs["reason"], attrs["median_ms"], errors):
        m.results.append(Result(status, reason, median, (), error))
    return m
