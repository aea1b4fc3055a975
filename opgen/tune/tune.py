"""``opgen tune``: a campaign of optuna studies, one per (op, variant, bucket, chip, toolchain,
kernel), and the winner of each bucket.

The steps live in their own modules: planning (``plan``), sharding (``shard``), the dry-run
table (``dry_run``), measuring and batch compiles (``measure``), the optuna loop (``search``),
the side-by-side that picks a winner (``side_by_side``) and the cross-check (``cross_check``).
:class:`Campaign` runs them in order over a campaign's studies, within its time budget, and
hands every trial, winner, cross-check and fill measure to its records sink. Studies live in optuna storage
(a journal file by default, or an RDB URL shared by several hosts), so a killed campaign
resumes where it stopped. On a storage shared by hosts, each bucket is searched by the process
that claims it (``claims``); a bucket claimed by another process is come back to after this
process's own, and searched only if its holder stopped before finishing. Uses ``settings``,
``plan``, ``search``, ``measure``, ``side_by_side``, ``cross_check``, ``worker``, ``space``,
``bench``, ``storage``.
"""
from __future__ import annotations

import hashlib
import sys
import time
from typing import Any, Callable, Iterable, Mapping

from ..run import bench
from ..run.worker import Result, Task, Worker
from ..space.plan import Bucket, StudyPlan, buckets, plan, rival_plans
from ..space.space import Point, Variant, forced_point
from ..spec.keys import key_text
from . import cross_check as cross_check_mod, measure as measure_mod, measure_fill as measure_fill_mod
from . import side_by_side as sbs
from .cross_check import CrossCheck
from .measure_fill import FillMeasure
from .search import Measured, completed, make_sampler, search, stored_points, timed_out_under
from .settings import CampaignConfig, Settings
from .shard import shard_plans
from .side_by_side import tie_break

Sink = Callable[..., None]  # (kind, fields) and, for a winner under a claim, holder=
"""The records writer: (kind, the fields of one record, or a list of them written together)."""

__all__ = ["Campaign", "Sink", "CampaignConfig", "Settings", "Bucket", "StudyPlan", "Measured", "CrossCheck",
           "buckets", "plan", "rival_plans", "shard_plans", "tie_break", "timed_out_under"]


class Campaign:
    """Runs the studies of one op on one chip and writes records.

    Args:
        config: what the campaign runs on (op, chip, device, toolchain, kernels, settings).
        storage: an optuna storage object (journal file or RDB).
        sink: called with (kind, fields) for each winner and cross-check, and with (kind, [fields
            of each case]) for each trial (the records writer).
        claims: the bucket claims of a storage shared by several processes (``opgen.storage.claims.Claims``),
            or None when this process is the only one on its studies.
        table: the records table of such a storage (``opgen.storage.db_records.RecordTable``), where a
            trial of a process that died may be recorded though its study never heard of it.
    """

    claims: Any = None
    table: Any = None

    def __init__(self, config: CampaignConfig, storage: Any, sink: Sink,
                 claims: Any = None, table: Any = None) -> None:
        self.config = config
        self.spec, self.profile, self.settings = config.spec, config.profile, config.settings
        self.storage, self.sink, self.claims, self.table = storage, sink, claims, table
        self.worker = Worker(config.spec, config.root, config.worker_env)
        self.pool = [Worker(config.spec, config.root, config.worker_env)
                     for _ in range(config.settings.compile_workers)]
        self.progress = config.progress
        self.deadline = time.monotonic() + config.settings.campaign_seconds
        self._left = 0  # studies with points still to run (their share of the time left)

    # --- one point --------------------------------------------------------------------------
    def _task(self, point: Point, case: dict[str, Any], timed: bool = True,
              protocol: bench.Protocol | None = None) -> Task:
        c = self.config
        return Task(op=c.spec.op, rendering=c.profile.rendering, variant=point.variant, point=point.values,
                    case=tuple(case.items()), backend=c.backend, device=c.device, programs=c.programs,
                    seed=self.settings.seed, max_rel_l2=c.max_rel_l2.get(str(case.get("dtype"))),
                    timed=timed, protocol=protocol or self.settings.protocol)

    def measure(self, point: Point, bucket: Bucket) -> Measured:
        """Run a point on every case of its bucket; stop at the first failure."""
        return measure_mod.measure(self.worker, self._task, point, bucket, self.settings.point_timeout)

    def measure_batch(self, points_: list[Point], bucket: Bucket) -> list[Measured]:
        """Measure several points, compiled in parallel first (:func:`opgen.tune.measure.measure_batch`)."""
        return measure_mod.measure_batch(self.pool, self.measure, self._task, points_, bucket,
                                         self.settings.point_timeout)

    def check(self, points_: list[Point], bucket: Bucket) -> dict[Point, str]:
        """Each point compiled and checked on the bucket's cases, untimed, in parallel where the
        campaign has compiling workers: the status and reason of its first failure, or ''."""
        found = measure_mod.check_batch(self.pool, self.worker, self._task, points_, bucket,
                                        self.settings.point_timeout)
        return {p: "" if r is None else f"{r.status}: {r.reason}" for p, r in zip(points_, found)}

    def _budget(self, variant: Variant, point: Point, params: dict[str, Any],
                result: Result | None = None) -> dict[str, Any] | None:
        return measure_mod.budget_record(self.spec, self.profile, variant, point, params,
                                         result.reported if result is not None else None)

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

        def measure(points_: list[Point]) -> list[Measured]:
            if self.claims is not None:  # still the bucket's holder: no other process measures these
                self.claims.check()
            return self.measure_batch(points_, plan.bucket)
        return search(study, plan.points, enqueue, self.settings, deadline, measure,
                      lambda number, m: self._emit_trial(name, number, plan, m),
                      (lambda number: self.recorded(name, number)) if self.table is not None else None)

    def recorded(self, study: str, number: int) -> list[Result]:
        """The results the records table holds for a trial of ``study`` (none: not recorded)."""
        found = self.table.trial(self.spec.op, self.profile.name, study, number)
        return [Result(r.status, r.reason, r.median_ms, r.times_ms, dict(r.error)) for r in found]

    def study_name(self, plan: StudyPlan) -> str:
        """The study's identity (:meth:`StudyPlan.name`) on this campaign's toolchain and kernels."""
        kernel = self.config.kernel_hash.get(plan.variant.name, "")
        return plan.name(self.spec.op, self.profile.name, self.config.toolchain, kernel)

    def stored(self, plan: StudyPlan) -> list[Measured]:
        """Every point a study measured in earlier runs (:func:`opgen.tune.search.stored_points`)."""
        return stored_points(self.storage, self.study_name(plan), plan.points)

    def _emit_trial(self, study: str, number: int, plan: StudyPlan, m: Measured) -> None:
        """One trial's records, a record per case, written together."""
        self.sink("trial", [dict(
            study=study, trial=number, key=list(plan.bucket.key), case=case,
            variant=plan.variant.name, point=m.point.config, status=result.status,
            reason=result.reason, median_ms=result.median_ms, times_ms=list(result.times_ms),
            error=result.error, budget=self._budget(plan.variant, m.point, params, result))
            for case, params, result in zip(plan.bucket.cases, plan.bucket.params, m.results)])

    # --- winners ----------------------------------------------------------------------------
    def side_by_side(self, points_: list[Point], bucket: Bucket) -> dict[Point, float]:
        """Geomean over the bucket's cases of interleaved re-measures of several points."""
        return sbs.remeasure(self.worker, self._task, points_, bucket, self.settings)

    def choose(self, bucket: Bucket, by_variant: dict[str, list[Measured]],
               held: Point | None = None, default: Point | None = None) -> dict[str, Any] | None:
        """The bucket's winner (:func:`opgen.tune.side_by_side.choose`), or None."""
        return sbs.choose(self.spec, bucket, by_variant, held, self.settings, self.side_by_side, self._budget,
                          default)

    def cross_check(self, buckets_: list[Bucket], tuned: dict[tuple, Any], margin: float,
                    every: bool = False) -> list[CrossCheck]:
        """The leave-one-out cross-check of the tuned buckets (:func:`opgen.tune.cross_check.cross_check`);
        the workers are closed again afterwards."""
        try:
            return cross_check_mod.cross_check(self.spec, self.profile, buckets_, tuned, margin, every,
                                               self.side_by_side, self.sink)
        finally:
            self.close()

    def measure_fill(self, buckets_: list[Bucket], tuned: dict[tuple, Any], run: str,
                     earlier: Mapping[tuple, tuple] | None = None,
                     pending: Mapping[tuple, Any] | None = None,
                     left_out: Iterable[measure_fill_mod.Outrun] = (),
                     done: Callable[[FillMeasure], None] | None = None) -> list[FillMeasure]:
        """The measure step of the fill on the untuned buckets (:func:`opgen.tune.measure_fill.measure_fill`,
        keeping the ``earlier`` runs that hold every candidate, with the ``pending`` winners as
        candidates and the ``left_out`` ones on their own bucket alone, ``done`` given each bucket's
        result as it comes, no bucket begun past the campaign's deadline); the workers are closed
        again afterwards."""
        try:
            return measure_fill_mod.measure_fill(self.spec, self.profile, buckets_, tuned, run, self.check,
                                                 self.side_by_side, self.sink, earlier, pending, left_out, done,
                                                 self.deadline)
        finally:
            self.close()

    def close(self, kill: bool = False) -> None:
        """Stop the worker processes (at once with ``kill``)."""
        for worker in (self.worker, *self.pool):
            worker.close(kill)

    def run(self, plans: list[StudyPlan], earlier: dict[tuple, list[Point]] | None = None,
            rivals: Iterable[StudyPlan] = (), standing: Mapping[tuple, Point] | None = None) -> list[dict[str, Any]]:
        """Run every study, bucket by bucket, each within its share of the campaign's time, and
        emit one winner per bucket; each study measures the spec's default and ``earlier`` winners
        of its bucket first, and the study holding the default runs first in its bucket. The
        stored points of ``rivals`` (studies of variants this campaign does not search) compete
        for their buckets too, and so do the ``standing`` winner of a bucket (the row the table
        freezes now) and, when its variant is searched, the spec's default point, each measured
        again when no study of this run holds it (a trial record numbered -1 in its variant's
        study): a narrower, shorter or journal-less campaign loses nothing it had, and one that
        searches the default's variant never freezes a row slower than the default. Buckets
        without a standing winner go first.
        With claims, a bucket another process holds is skipped, then come back to at the end:
        once its claim is free, it is searched (resumed) unless its holder finished it."""
        from tqdm import tqdm

        earlier, standing = earlier or {}, standing or {}
        by_bucket: dict[tuple, list[StudyPlan]] = {}
        for p in plans:
            by_bucket.setdefault(p.bucket.key, []).append(p)
        others: dict[tuple, list[StudyPlan]] = {}
        for p in rivals:
            others.setdefault(p.bucket.key, []).append(p)
        winners: list[dict[str, Any]] = []
        self._left = sum(1 for p in plans if p.points)
        bar = tqdm(total=len(plans), desc=f"tune {self.spec.op} on {self.profile.name}",
                   unit="study", disable=not self.progress)
        try:
            # buckets with no frozen winner first: a campaign cut short spends its time where the
            # table knows least (in plan order within each group)
            deferred = []
            for key, group in sorted(by_bucket.items(), key=lambda kv: kv[0] in standing):
                if self.claims is not None and not self._claim(group):
                    deferred.append((key, group))  # another process is at it, or finished it
                    continue
                winners += self._bucket(group, others.get(key, ()), standing.get(key), earlier.get(key), bar)
            for key, group in deferred:  # once free: finished, or left by a process that stopped
                if not self._claim(group, wait=True):
                    bar.update(len(group))
                    continue
                winners += self._bucket(group, others.get(key, ()), standing.get(key), earlier.get(key), bar)
        except BaseException:  # interrupted: no worker outlives the campaign, none is waited for
            self.close(kill=True)
            raise
        finally:
            bar.close()
            self.close()
        return winners

    def claim_name(self, group: list[StudyPlan]) -> str:
        """A bucket's claim: a digest of its studies' names (the same in every process that runs
        the same campaign)."""
        names = "\n".join(sorted(self.study_name(p) for p in group))
        return f"{self.spec.op}|{self.profile.name}|{hashlib.sha256(names.encode()).hexdigest()[:16]}"

    def _claim(self, group: list[StudyPlan], wait: bool = False) -> bool:
        """Claim a bucket for this process: False when another process holds it (unless ``wait``)
        or finished it since this process started (or recorded its winner, then stopped)."""
        name = self.claim_name(group)
        if not self.claims.take(name, wait):
            return False
        left = self.claims.left(name)
        where = key_text(self.spec, group[0].bucket.key)
        if left == "stopped" and self.claims.decided(name, self.study_name(group[0])):
            print(f"{where}: the process that claimed this bucket stopped after recording its winner",
                  file=sys.stderr)
            self.claims.mark(name, "done")
            left = "finished"
        if left == "finished":
            self.claims.release(name)
            return False
        if left == "stopped":
            print(f"{where}: the process that claimed this bucket stopped before finishing it; resuming "
                  "its studies", file=sys.stderr)
        return True

    def _bucket(self, group: list[StudyPlan], rivals: Iterable[StudyPlan], held: Point | None,
                earlier: list[Point] | None, bar: Any) -> list[dict[str, Any]]:
        """Search one bucket's studies, then emit its winner (returned as a list of 0 or 1)."""
        if self.claims is not None:
            self.claims.mark(self.claim_name(group), "running")
        rivals = list(rivals)
        default = next((p.default for p in group if p.default is not None), None)  # its variant searched
        group = sorted(group, key=lambda p: p.default is None)  # the default's study first
        by_variant: dict[str, list[Measured]] = {}
        for p in group:
            if time.monotonic() >= self.deadline:  # no time to search: what it holds competes
                by_variant[p.variant.name] = self.stored(p)
                bar.update(1)
                continue
            enqueue = [x for x in (p.default,) if x is not None]
            if earlier:  # tunables added since: the defaults with this variant forced
                template = forced_point(self.spec, self.profile, p.variant, p.bucket.params[0])
                enqueue += [completed(b, template) for b in earlier]
            seconds = self.settings.study_budget(self.deadline - time.monotonic(), self._left)
            by_variant[p.variant.name] = self.run_study(p, enqueue, seconds)
            self._left -= bool(p.points)
            bar.update(1)
            bar.set_postfix_str(f"{p.variant.name} {len(by_variant[p.variant.name])} pts")
        for p in rivals:
            by_variant.setdefault(p.variant.name, self.stored(p))
        for kept, role in ((held, "standing winner"), (default, "default point")):
            home = next((p for p in (*group, *rivals) if kept is not None and p.variant.name == kept.variant), None)
            if home is None or any(m.point == kept for ms in by_variant.values() for m in ms):
                continue
            again = self.measure_batch([kept], home.bucket)[0]
            self._emit_trial(self.study_name(home), -1, home, again)  # -1: outside the search
            if not again.ok:
                r = next(r for r in again.results if r.status != "ok")
                print(f"{role} {kept.name()} of {group[0].bucket.key} failed: {r.status} {r.reason}",
                      file=sys.stderr)
            by_variant[kept.variant] = [*by_variant.get(kept.variant, []), again]
        winner = self.choose(group[0].bucket, by_variant, held, default)
        if self.claims is not None:
            self.claims.check()  # still the holder: no other process decides this bucket
        if winner is not None:
            winner["study"] = self.study_name(group[0])
            if self.claims is None:
                self.sink("winner", winner)
            else:  # written only while the claim holds, so a process that took the bucket over decides it alone
                self.sink("winner", winner, holder=self.claims.holder(self.claim_name(group)))
        if self.claims is not None:
            self.claims.mark(self.claim_name(group), "done")
            self.claims.release(self.claim_name(group))
        return [winner] if winner is not None else []
