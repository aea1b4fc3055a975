"""A fill rule learned from the records: an untuned bucket takes the candidate that ran nearest
the fastest on the measured buckets around it, each bucket weighed by its distance, instead of the
single nearest winner.

The candidates are the distinct points of the tuned (and held-back) winners, carried to the target
(:func:`opgen.space.carried`: the tunables a variant fixes take the target's values), and the
spec's default. The evidence is what the records timed side by side: on each measured bucket, each
candidate's time over the fastest of its run (geometric mean over the bucket's runs on the current
kernels, :func:`opgen.table.run_shares`); on a tuned bucket, the winner's side-by-side re-measure,
its cross-checks and its search's trials (:func:`tuned_shares`). A candidate may stand
for the target if it serves the whole bucket (:func:`opgen.table.serves_bucket`: legal and within
budget on the target's case and on the bucket's largest shape, legal on its smallest), meets the
spec's ``constraints`` on the bucket's largest shape (no tile wider than the dims it covers there;
:attr:`RankParams.clamp` narrows such a tile instead of dropping the candidate) and was timed on at
least one bucket of the target's own plain key fields (dtype, chunk size, ...): no row crosses
a dtype or a variant family without a measurement in the target's own. Of those, the rule takes the
one whose log share over the evidence, weighed ``exp(-distance / tau)``, is least (:func:`rank_fill`).
Far buckets keep a little weight: a candidate that ran near the fastest on most shapes beats one
that won a single neighbour (on the H200 records, a reach of 2 to 4 bucket steps lost more buckets).

:func:`leave_one_out` scores a rule on the records alone: each measured bucket filled from the
others, its point looked up among the times of that bucket's own runs (fastest over the point's,
as the measured fill weighs runs); each tuned bucket likewise where the rule's point has a time
there. ``python -m opgen.fill_rank <op> <chip>`` prints it for the nearest fill
(:func:`opgen.table.leave_one_out_fill`) and for this rule. On the H200 records of chunk_gla_fwd_o_gk
at commit 8ed2e5b the rule's point runs at 0.966 of the fastest measured candidate's speed on the
measured buckets (geomean over 71; min 0.846; 7 lose more than 10%; 3 chose a point their runs
never timed), the nearest fill's at 0.920 (min 0.692; 28 of 73). Narrowing a tile instead of
dropping its candidate (``clamp``) picked 3 narrowed points, none of them timed where it was picked.
Pure functions over the records: no
device, no clock. Uses ``table``, ``records``, ``space``, ``keys``, ``bucket_shapes``, ``spec``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .bucket_shapes import bucket_corner, case_params, edge_params
from .errors import BuildError, ExprError, RecordError, SpecError
from .fill_measured import fill_measured, run_shares
from .fill_nearest import leave_one_out_fill, stand_ins
from .fits import serves_bucket
from .hardware import ChipProfile, profile
from .kernels import kernel_hashes
from .keys import Key, key_text, sort_key, split_key_field
from .records import CheckRecord, Record, TrialRecord, WinnerRecord, latest_measure_runs, record_path
from .space import (carried, carried_clamped, clamped as clamp_to, constraint_failed, default_point, parse_point_name,
                    point_id)
from .spec import OpSpec, load_spec
from .table_records import once, read_keyed, records_key, split_winners

__all__ = ["FillGate", "fill_gate", "gate_report", "RankParams", "Candidate", "Bucket", "Evidence", "Choice", "LooRow", "LooSummary", "DEFAULT",
           "candidates", "gather", "distance", "rank_fill", "target_case", "fill_ranked", "leave_one_out",
           "summarize", "loo_report", "tuned_shares", "main"]

DEFAULT = "spec default"  # the identity of the spec's default among the candidates
LOSS = 1.1  # a rule loses a bucket where the fastest ran more than this much faster than its point


@dataclass(frozen=True)
class RankParams:
    """The rule's parameters. The defaults are those a leave-one-out on the H200 records of
    chunk_gla_fwd_o_gk (commit 8ed2e5b) picks over ``tau`` in {0.35, 0.5, 0.75}, ``plain_cost`` in
    {0.5, 0.75, 1} and ``cross_cost`` in {0.25, 0.5}. Picked on the other measured buckets alone
    (6 and 10 folds), the parameters gave the buckets left out 0.964-0.965 of the fastest's speed
    (geomean), min 0.846, 8 of 74 over a 10% loss: what the picked defaults score, 0.966, is no
    artefact of picking them on the buckets they are scored on.

    Attributes:
        tau: an evidence bucket at distance ``d`` weighs ``exp(-d / tau)``.
        cross_cost: distance of a differing field of the spec's ``dispatch.fill_across`` (dtype).
        plain_cost: distance of another differing plain key field (chunk size, ``H == 1``, ...);
            None: evidence of other values of those fields does not count.
        weights: per bucketed key field, the distance of one bucket step (1 where not named).
        min_evidence: buckets a candidate must have been timed on.
        own: the candidate must have been timed on a bucket with the target's plain key fields.
        clamp: a candidate whose point violates the spec's constraints on the target's largest
            shape has the tunables those constraints read narrowed to the widest values of their
            domains that meet them (its evidence stays its own), instead of being dropped.
        tuned: the weight of a tuned bucket's times (:func:`tuned_shares`) as evidence, beside
            a measured bucket's 1 (0: none). A search times few of the pool's points besides its
            winner (2 to 6 of the 24 on the H200 GLA records), so a tuned bucket mostly speaks
            for its own winner.
        reach: evidence farther than this does not count (None: the spec's
            ``dispatch.fill_distance``, which bounds every fill; none there: all of it). At
            mamba3's 0 no other bucket's evidence counts and an untuned bucket runs the default.
    """

    tau: float = 0.5
    cross_cost: float = 0.25
    plain_cost: float | None = 0.5
    weights: tuple[tuple[str, float], ...] = ()
    min_evidence: int = 1
    own: bool = True
    clamp: bool = False
    tuned: float = 1.0
    reach: float | None = None


class Candidate(NamedTuple):
    """A point the rule may give a bucket: a winner's (as it won, before carrying) with the keys
    it won, or the spec's default (``variant`` empty, evaluated at each bucket)."""

    variant: str
    point: dict[str, Any]
    sources: tuple[Key, ...]

    @property
    def ident(self) -> str:
        return DEFAULT if not self.variant else point_id(self.variant, self.point)

    @property
    def label(self) -> str:
        return DEFAULT if not self.variant else f"winner of {self.sources[0]!r}"

    def at(self, spec: OpSpec, chip: ChipProfile, params: Mapping[str, Any],
           largest: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]] | None:
        """The candidate's variant and point at a shape, its tiles clamped to ``largest`` (the
        largest call of the bucket, as the measure step runs it; :func:`opgen.space.carried_clamped`)
        where given (None: its fixed tunables, or the default, do not evaluate there)."""
        if not self.variant:
            try:
                found = default_point(spec, chip, params)
            except (BuildError, SpecError, ExprError):  # the default picks nothing legal there
                return None
            return found.variant, found.config
        moved = (carried(spec, self.variant, self.point, params) if largest is None
                 else carried_clamped(spec, chip, self.variant, self.point, params, largest))
        return None if moved is None else (self.variant, moved)


class Bucket(NamedTuple):
    """What the records timed on one bucket: its case, and per point identity (the default's too,
    under its own point) the time over the fastest, >= 1 (:func:`opgen.table.run_shares` on a
    measured bucket, :func:`tuned_shares` on a tuned one), and where each time comes from."""

    key: Key
    case: dict[str, Any]
    params: dict[str, Any]
    largest: dict[str, Any]  # the bucket's largest call, which the measure step clamps tiles to
    kind: str  # "measured" or "tuned"
    shares: dict[str, float]
    how: dict[str, str]
    default: str  # the identity of the spec's default there ("" where it does not evaluate)


@dataclass(frozen=True)
class Evidence:
    """The candidate pool and the buckets the records timed it on (:func:`gather`)."""

    pool: tuple[Candidate, ...]
    buckets: dict[Key, Bucket]
    _memo: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def logs_of(self, spec: OpSpec, chip: ChipProfile, cand: Candidate) -> tuple[tuple[Key, float], ...]:
        """:meth:`shares_of` as (bucket, log share) pairs, in the evidence's order."""
        memo = "log " + cand.ident
        if memo not in self._memo:
            self._memo[memo] = tuple((k, math.log(v)) for k, v in self.shares_of(spec, chip, cand).items())
        return self._memo[memo]

    def shares_of(self, spec: OpSpec, chip: ChipProfile, cand: Candidate) -> dict[Key, float]:
        """Per bucket that timed the candidate, its time over the fastest: carried there with its
        tiles clamped to the bucket (as the measure step runs it) or, where no run timed that,
        carried as it is (as runs before the clamp timed it)."""
        ident = cand.ident
        if ident not in self._memo:
            out = {}
            for key, bucket in self.buckets.items():
                if not cand.variant:
                    found = [bucket.default or None]
                else:
                    found = [None if f is None else point_id(*f) for f in (
                        cand.at(spec, chip, bucket.params, bucket.largest), cand.at(spec, chip, bucket.params))]
                here = next((f for f in found if f is not None and f in bucket.shares), None)
                if here is not None:
                    out[key] = bucket.shares[here]
            self._memo[ident] = out
        return self._memo[ident]


class Choice(NamedTuple):
    """What the rule gives a target: the candidate, its variant and point as a row keeps them
    (a winner's tunables as it won, a clamped point narrowed; the spec's default, ``candidate``
    with no variant, means no row: the bucket runs the default, evaluated at each call, and
    ``point`` is its value at the target's case), the point carried to the target's case, the
    predicted share (the weighed geometric mean of its time over the fastest on the evidence) and
    the evidence: (key, distance, share)."""

    key: Key
    candidate: Candidate
    variant: str
    point: dict[str, Any]
    carried: dict[str, Any]
    predicted: float
    evidence: tuple[tuple[Key, float, float], ...]
    clamped: bool = False

    @property
    def source(self) -> str:
        near = min(self.evidence, key=lambda e: (e[1], sort_key(e[0])))
        how = " clamped" if self.clamped else ""
        return (f"{self.candidate.label}{how}: {len(self.evidence)} buckets, "
                f"predicted ratio {1 / self.predicted:.3f}, nearest {near[0]!r}")


# --- the evidence ------------------------------------------------------------------------------
def candidates(spec: OpSpec, chip: ChipProfile, winners: Mapping[Key, WinnerRecord]) -> tuple[Candidate, ...]:
    """The distinct points of ``winners`` (in key order of the first key each won, with every key
    it won), then the spec's default."""
    tunables = spec.tunables_for(chip.backend)
    found: dict[str, tuple[str, dict[str, Any], list[Key]]] = {}
    for key in sorted(winners, key=sort_key):
        rec = winners[key]
        point = {n: rec.point[n] for n in tunables}
        found.setdefault(point_id(rec.variant, point), (rec.variant, point, []))[2].append(key)
    return tuple(Candidate(v, p, tuple(keys)) for v, p, keys in found.values()) + (Candidate("", {}, ()),)


def _bucket(spec: OpSpec, chip: ChipProfile, key: Key, case: Mapping[str, Any], kind: str,
            shares: dict[str, float], how: dict[str, str]) -> Bucket | None:
    where = f"{kind} bucket {key}"
    try:
        params = case_params(spec, case, where)
    except RecordError:
        return None  # a case the spec no longer evaluates
    default = Candidate("", {}, ()).at(spec, chip, params)
    return Bucket(key, dict(case), params, edge_params(spec, case, where), kind, shares, how,
                  "" if default is None else point_id(*default))


def measured_buckets(spec: OpSpec, chip: ChipProfile, records: Sequence[Record],
                     kernel_hashes: Mapping[str, str], skip: Iterable[Key] = ()) -> dict[Key, Bucket]:
    """Per measured key (but those of ``skip``, the tuned ones), each point's share over its runs
    on the current kernels (:func:`opgen.table.run_shares`, the default's under its point), on the
    case of the key's latest run."""
    skip = set(skip)
    runs = latest_measure_runs(records)
    out = {}
    for key, shares in run_shares(records, kernel_hashes).items():
        if key in skip or not shares:
            continue
        merged: dict[str, float] = {}
        for (_, ident), share in shares.items():
            merged[ident] = min(share, merged.get(ident, math.inf))
        bucket = _bucket(spec, chip, key, runs[key][0].case, "measured", merged,
                         dict.fromkeys(merged, "measure runs"))
        if bucket is not None:
            out[key] = bucket
    return out


def tuned_shares(spec: OpSpec, chip: ChipProfile, records: Sequence[Record], kernel_hashes: Mapping[str, str],
                 tuned: Mapping[Key, WinnerRecord]) -> dict[Key, Bucket]:
    """Per tuned key, the points timed there on their current kernels, each as the time over the
    fastest of its source, by the first source that timed it: the winner's side-by-side re-measure
    (``remeasured_ms``, points with a trial on their current kernel there), a cross-check beside the
    winner (the fill's time over the winner's, at least 1 against the faster of the two), the
    search's trials (each point's least median over the least of all points, trials under the
    winner's flush)."""
    trials: dict[Key, dict[str, float]] = {}
    checks: dict[Key, list[tuple[str, dict[str, Any], float]]] = {}
    for rec in records:
        won = tuned.get(rec.key)
        if won is None:
            continue
        if isinstance(rec, TrialRecord):
            if (rec.status == "ok" and rec.median_ms and rec.flush == won.flush
                    and kernel_hashes.get(rec.variant) == rec.kernel_hash):
                ident = point_id(rec.variant, rec.point)
                times = trials.setdefault(rec.key, {})
                times[ident] = min(rec.median_ms, times.get(ident, math.inf))
        elif isinstance(rec, CheckRecord):
            if ((rec.variant, rec.point, rec.kernel_hash) == (won.variant, won.point, won.kernel_hash)
                    and kernel_hashes.get(rec.fill_variant) == rec.fill_kernel_hash
                    and rec.own_ms and rec.fill_ms):
                checks.setdefault(rec.key, []).append((rec.fill_variant, rec.fill_point, rec.fill_ms / rec.own_ms))
    out = {}
    for key, won in tuned.items():
        shares: dict[str, float] = {}
        how: dict[str, str] = {}
        timed = trials.get(key, {})
        # point_id writes values as text: a name's "BK=64" is the trial's BK 64
        side = {ident: ms for name, ms in won.remeasured_ms.items()
                if (ident := point_id(*parse_point_name(name))) in timed}
        for source, times in (("side by side", side), ("trials", timed)):
            if not times:
                continue
            fastest = min(times.values())
            for ident, ms in times.items():
                if ident not in shares:
                    shares[ident], how[ident] = ms / fastest, source
        bucket = _bucket(spec, chip, key, won.case, "tuned", shares, how)
        if bucket is None:
            continue
        own = point_id(won.variant, won.point)
        for variant, point, ratio in checks.get(key, ()):  # a row's point, carried to the case as it ran
            moved = carried(spec, variant, point, bucket.params)
            ident = point_id(variant, point if moved is None else moved)
            if ident not in shares:
                shares[ident], how[ident] = max(1.0, ratio) * shares.get(own, 1.0), "cross-check"
        if shares:
            out[key] = bucket
    return out


def gather(spec: OpSpec, chip: ChipProfile, records: Sequence[Record], kernel_hashes: Mapping[str, str],
           tuned: Mapping[Key, WinnerRecord], pending: Mapping[Key, WinnerRecord] | None = None,
           *, with_tuned: bool = True) -> Evidence:
    """The pool (the points of the ``tuned`` and ``pending`` winners, then the default,
    :func:`candidates`) and the buckets the records timed it on: every measured key that is no
    tuned one (:func:`measured_buckets`) and, ``with_tuned``, the tuned keys (:func:`tuned_shares`)."""
    pool = candidates(spec, chip, {**(pending or {}), **tuned})
    buckets = measured_buckets(spec, chip, records, kernel_hashes, skip=tuned)
    if with_tuned:
        buckets.update(tuned_shares(spec, chip, records, kernel_hashes, tuned))
    return Evidence(pool, buckets)


# --- the rule ----------------------------------------------------------------------------------
def distance(spec: OpSpec, a: Key, b: Key, rank: RankParams = RankParams()) -> float | None:
    """How far apart two keys are for the rule: per bucketed field its weight times the bucket
    steps, per differing field of ``dispatch.fill_across`` ``cross_cost``, per other differing plain
    field ``plain_cost`` (None where that is None)."""
    return _distance(_steps(spec, rank), a, b)


def _distance(steps: Sequence[float | None], a: Key, b: Key) -> float | None:
    """:func:`distance` with the per-field costs :func:`_steps` gives."""
    d = 0.0
    for cost, x, y in zip(steps, a, b):
        if x == y:
            continue
        if cost is None:
            return None
        d += cost * abs(x - y) if cost.__class__ is _Step else cost
    return d


class _Step(float):
    """The distance of one bucket step of a bucketed field (times the steps), apart from the flat
    cost of a differing plain field."""


_STEPS: dict[tuple[int, RankParams], tuple[OpSpec, tuple[float | None, ...]]] = {}


def _steps(spec: OpSpec, rank: RankParams) -> tuple[float | None, ...]:
    """Per key field what :func:`distance` adds where two keys differ there (cached per spec)."""
    memo = (id(spec), rank)
    if memo not in _STEPS:
        weights = dict(rank.weights)
        out: list[float | None] = []
        for name, field in spec.dispatch.key.items():
            if split_key_field(field)[1] is not None:
                out.append(_Step(weights.get(name, 1.0)))
            elif name in spec.dispatch.fill_across:
                out.append(rank.cross_cost)
            else:
                out.append(rank.plain_cost)
        _STEPS[memo] = (spec, tuple(out))
    return _STEPS[memo][1]


def _plain_same(spec: OpSpec, a: Key, b: Key) -> bool:
    return all(x == y for cost, x, y in zip(_steps(spec, RankParams()), a, b) if cost.__class__ is not _Step)


def _order(evidence: Evidence, key: Key) -> tuple[Any, ...]:
    """The sort key of an evidence bucket's key (:func:`opgen.keys.sort_key`), computed once."""
    memo = evidence._memo.setdefault("sort keys", {})
    if key not in memo:
        memo[key] = sort_key(key)
    return memo[key]


def _admit(spec: OpSpec, chip: ChipProfile, cand: Candidate, case: Mapping[str, Any], clamp: bool
           ) -> tuple[str, dict[str, Any], dict[str, Any], bool] | None:
    """The candidate's (variant, point as a row keeps it, point carried to ``case``, clamped) if it
    may stand for the bucket of ``case``, else None."""

    where = f"fill of the bucket of {dict(case)}"
    params = case_params(spec, case, where)
    found = cand.at(spec, chip, params)
    if found is None:
        return None
    variant, moved = found
    point = dict(moved) if not cand.variant else dict(cand.point)
    high = edge_params(spec, case, where)
    at_high = carried(spec, variant, point, high)
    clamped = False
    if at_high is None:
        return None
    if constraint_failed(spec, variant, at_high, high) is not None:
        narrow = clamp_to(spec, chip, variant, point, high) if clamp else None
        if narrow is None:
            return None
        point, clamped = narrow, True
        moved = carried(spec, variant, point, params)
        if moved is None:
            return None
    if not serves_bucket(spec, chip, variant, moved, case):
        return None
    return variant, point, moved, clamped


def rank_fill(spec: OpSpec, chip: ChipProfile, evidence: Evidence, key: Key, case: Mapping[str, Any],
              rank: RankParams = RankParams(), *, exclude: Iterable[Key] = ()) -> Choice | None:
    """The row the rule gives bucket ``key`` (``case``: a case row of that bucket, whose shape the
    candidates are carried to and checked on), from the evidence of every other bucket but those
    of ``exclude``; None where no candidate qualifies (the bucket keeps the spec's default).

    A candidate qualifies where it may stand for the bucket (:func:`_admit`: serves the whole
    bucket, meets the constraints on its largest shape or, with ``rank.clamp``, once narrowed) and
    the records timed it on at least ``rank.min_evidence`` buckets within reach (``rank.reach``), one of
    them with the target's plain key fields where ``rank.own`` (but the default, which the bucket
    runs without a row anyway). Its score is the mean of its log
    shares, bucket ``B`` weighed ``exp(-distance(key, B) / tau)`` (:func:`distance`); the least
    score wins, then the most evidence, then the pool's order (key order of the winners, the default
    last). A winner of ``exclude`` keys alone is no candidate (a leave-one-out leaves its search out).
    """
    exclude = set(exclude) | {key}
    reach = rank.reach if rank.reach is not None else spec.dispatch.fill_distance
    steps = _steps(spec, rank)
    plain = [i for i, cost in enumerate(steps) if cost.__class__ is not _Step]
    near = []
    for other, bucket in evidence.buckets.items():
        if other in exclude or (bucket.kind == "tuned" and rank.tuned <= 0):
            continue
        d = _distance(steps, key, other)
        if d is not None and (reach is None or d <= reach):
            weight = math.exp(-d / rank.tau) * (rank.tuned if bucket.kind == "tuned" else 1.0)
            near.append((d, other, weight))
    near.sort(key=lambda t: (t[0], _order(evidence, t[1])))
    own = {other for _, other, _ in near if all(key[i] == other[i] for i in plain)}
    weight = {other: w for _, other, w in near}
    scored = []
    for order, cand in enumerate(evidence.pool):
        if cand.variant and not set(cand.sources) - exclude:
            continue
        total = mass = 0.0
        count, mine = 0, False
        for other, log in evidence.logs_of(spec, chip, cand):
            w = weight.get(other)
            if w is not None:
                total, mass, count, mine = total + w * log, mass + w, count + 1, mine or other in own
        if count < max(1, rank.min_evidence) or (rank.own and cand.variant and not mine):
            continue
        scored.append(((total / mass, -count, order), cand))
    for (score, _, _), cand in sorted(scored, key=lambda t: t[0]):
        admitted = _admit(spec, chip, cand, case, rank.clamp)  # in score order: the first that qualifies
        if admitted is not None:
            variant, point, moved, clamped = admitted
            timed = evidence.shares_of(spec, chip, cand)
            found = tuple((other, d, timed[other]) for d, other, _ in near if other in timed)
            return Choice(key, cand, variant, point, moved, math.exp(score), found, clamped)
    return None


def target_case(spec: OpSpec, evidence: Evidence, key: Key, rank: RankParams = RankParams()) -> dict[str, Any] | None:
    """A case row of bucket ``key`` for :func:`rank_fill`: the case of the nearest bucket of the
    evidence that can be moved there (its ``fill_across`` fields set to the target's, its plain-name
    bucketed fields moved into the target's buckets by :func:`opgen.bucket_shapes.bucket_corner`),
    nearest first; None where none lands there. A bucketed formula of other inputs (``B * H * NT``)
    keeps the source case's value, as the nearest fill's checks do."""
    names = list(spec.dispatch.key)
    across = {i: names[i] for i in range(len(names)) if names[i] in spec.dispatch.fill_across}
    order = []
    strict = _steps(spec, dataclasses.replace(rank, plain_cost=None))
    for other, bucket in evidence.buckets.items():
        d = _distance(strict, key, other)
        if d is not None:
            order.append((d, _order(evidence, other), bucket))
    for _, _, bucket in sorted(order, key=lambda t: t[:2]):
        case = {**bucket.case, **{name: key[i] for i, name in across.items()}}
        try:
            params = bucket_corner(spec, case, f"fill of {key} from {bucket.key}", key, "case")
        except RecordError:
            continue
        if params is not None:
            return {name: params.get(name, value) for name, value in case.items()}
    return None


def fill_ranked(spec: OpSpec, chip: ChipProfile, evidence: Evidence, key: Key,
                rank: RankParams = RankParams()) -> Choice | None:
    """:func:`rank_fill` on a case of the bucket built by :func:`target_case` (None without one)."""
    case = target_case(spec, evidence, key, rank)
    return None if case is None else rank_fill(spec, chip, evidence, key, case, rank)


# --- leave-one-out -----------------------------------------------------------------------------
class LooRow(NamedTuple):
    """One bucket filled from the others: where the rule took its point from, the point, and the
    fastest time there over the point's (None: the records hold no time of it there)."""

    key: Key
    kind: str
    source: str
    variant: str | None
    point: dict[str, Any] | None
    ratio: float | None
    how: str


class LooSummary(NamedTuple):
    """Geometric mean and least of the scored ratios, how many were scored, how many lose more
    than :data:`LOSS`, and how many buckets had no time for the rule's point."""

    geomean: float
    least: float
    scored: int
    over: int
    unscored: int

    def line(self) -> str:
        if not self.scored:
            return f"no bucket scored, {self.unscored} without a time for the rule's point"
        return (f"geomean {self.geomean:.3f}, min {self.least:.3f} over {self.scored} buckets; "
                f"{self.over} lose more than {LOSS - 1:.0%}; {self.unscored} unscored")


def summarize(rows: Iterable[LooRow]) -> LooSummary:
    """The figures of a leave-one-out (:class:`LooSummary`)."""
    rows = list(rows)
    ratios = [r.ratio for r in rows if r.ratio is not None]
    if not ratios:
        return LooSummary(0.0, 0.0, 0, 0, len(rows))
    return LooSummary(math.exp(sum(map(math.log, ratios)) / len(ratios)), min(ratios), len(ratios),
                      sum(1 for r in ratios if r < 1 / LOSS), len(rows) - len(ratios))


def _score(spec: OpSpec, chip: ChipProfile, bucket: Bucket, variant: str, point: Mapping[str, Any]
           ) -> tuple[float | None, str]:
    """The fastest time on ``bucket`` over the time of ``point`` carried there, and its source."""
    moved = carried(spec, variant, point, bucket.params)
    ident = None if moved is None else point_id(variant, moved)
    share = bucket.shares.get(ident) if ident is not None else None
    if share is None:
        return None, "not timed there"
    return 1.0 / share, bucket.how[ident]


class _Records(NamedTuple):
    records: tuple[Record, ...]
    tuned: dict[Key, WinnerRecord]
    pending: dict[Key, WinnerRecord]
    hashes: dict[str, str]


def _read(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str]) -> _Records:
    records = read_keyed(spec, chip, path).records
    tuned, _, pending = split_winners(spec, chip, path, records, kernel_hashes)
    return _Records(records, tuned, pending, dict(kernel_hashes))


def leave_one_out(spec: OpSpec, chip: ChipProfile, records_path: Path, kernel_hashes: Mapping[str, str],
                  *, rule: str = "rank", rank: RankParams = RankParams(), kinds: Sequence[str] = ("measured", "tuned")
                  ) -> list[LooRow]:
    """Each measured bucket, and each tuned bucket, filled from the others by ``rule`` and scored
    on the times the records hold there (:func:`_score`), in key order.

    ``rule``: ``"rank"`` (:func:`rank_fill`: the measured buckets' evidence but the target's, and
    the tuned buckets' where ``rank.tuned``; a winner of the target alone is no candidate) or
    ``"nearest"`` (the table's nearest fill, :func:`opgen.table.leave_one_out_fill`, from the tuned
    rows, the other measured rows as stand-ins, but those of a tuned target's own winner, and the
    buckets kept at the default). A measured
    bucket's time is each of its runs' fastest over the point's, geometric mean over its runs (as
    the measured fill weighs them); a tuned bucket's is the first of its side-by-side re-measure,
    cross-checks and trials that timed the point (:func:`tuned_shares`).
    """
    got = _read(spec, chip, records_path, kernel_hashes)
    measured = measured_buckets(spec, chip, got.records, got.hashes, skip=got.tuned)
    tuned = tuned_shares(spec, chip, got.records, got.hashes, got.tuned)
    targets = {**(measured if "measured" in kinds else {}), **(tuned if "tuned" in kinds else {})}
    pool = candidates(spec, chip, {**got.pending, **got.tuned})
    evidence = Evidence(pool, {**measured, **(tuned if rank.tuned > 0 else {})})
    if rule == "nearest":
        fill = fill_measured(spec, chip, got.tuned, got.records, got.hashes, got.pending)
        sources = {**got.tuned, **stand_ins(fill.rows)}
        won_by = {row.key: row.source for row in fill.rows}  # a measured row's point: that key's winner
        keep = frozenset(fill.kept)
    rows = []
    for key in sorted(targets, key=sort_key):
        bucket = targets[key]
        if rule == "nearest":
            # a tuned key's own winner stands in no measured row either
            mine = {k: w for k, w in sources.items() if won_by.get(k) != key}
            variant, point, source = leave_one_out_fill(spec, chip, mine, key, bucket.params, keep=keep)
            source = source or DEFAULT
        else:
            choice = rank_fill(spec, chip, evidence, key, bucket.case, rank, exclude=[key])
            if choice is None:  # no row: the bucket runs the spec's default
                variant, point = Candidate("", {}, ()).at(spec, chip, bucket.params) or (None, None)
                source = f"{DEFAULT} (no candidate qualifies)"
            else:
                variant, point, source = choice.variant, choice.point, choice.source
            if variant is None:
                rows.append(LooRow(key, bucket.kind, source, None, None, None, "no point"))
                continue
        ratio, how = _score(spec, chip, bucket, variant, point)
        rows.append(LooRow(key, bucket.kind, source, variant, point, ratio, how))
    return rows


class FillGate(NamedTuple):
    """The spec's fill rule scored on the records (:func:`leave_one_out`), as a table ships it:
    the figures per kind of bucket, and each bucket the rule would serve more than :data:`LOSS`
    slower than the fastest point timed there, with the untuned buckets around it that the rule
    fills (one bucket step away, the same plain fields: the buckets to measure)."""

    rule: str
    summaries: dict[str, LooSummary]
    losses: tuple[tuple[LooRow, tuple[Key, ...]], ...]

    @property
    def worst(self) -> LooRow | None:
        return min((row for row, _ in self.losses), key=lambda r: (r.ratio, sort_key(r.key)), default=None)

    def line(self) -> str:
        """One paragraph for the table's docstring."""
        parts = [f"{kind} buckets: {s.line()}" for kind, s in self.summaries.items() if s.scored or s.unscored]
        text = (f"Fill rule: {self.rule}. Each bucket the records timed, filled from the others "
                f"(leave-one-out), against the fastest point timed there: " + ("; ".join(parts) or "none") + ".")
        if self.losses:
            text += (f" FLAGGED: {len(self.losses)} over the {LOSS - 1:.0%} margin, worst "
                     f"{self.worst.ratio:.3f} at {self.worst.key!r} (`opgen records` names the buckets to measure).")
        return text


def fill_gate(spec: OpSpec, chip: ChipProfile, records_path: Path, kernel_hashes: Mapping[str, str],
              filled: Iterable[Key] = ()) -> FillGate:
    """The spec's ``dispatch.fill_rule`` scored by :func:`leave_one_out` on every measured and
    tuned bucket; for each one it loses, the keys of ``filled`` (the table's rule-filled buckets)
    one bucket step from it with its plain fields, to measure (computed once a process for the same
    records, chip figures, kernels and filled keys: a chip that inherits its records shares it)."""
    filled = list(filled)
    memo = (id(spec), records_key(records_path, chip), tuple(sorted(kernel_hashes.items())), tuple(filled))
    return once(_GATES, memo, spec, lambda: _fill_gate(spec, chip, records_path, kernel_hashes, filled))


# (id(spec), records_key, kernel hashes, filled keys) -> (spec, gate): a gate takes seconds (a
# leave-one-out over every bucket)
_GATES: dict[tuple[Any, ...], tuple[OpSpec, FillGate]] = {}


def _fill_gate(spec: OpSpec, chip: ChipProfile, records_path: Path, kernel_hashes: Mapping[str, str],
               filled: list[Key]) -> FillGate:
    """:func:`fill_gate`, uncached."""
    rule = spec.dispatch.fill_rule
    rows = leave_one_out(spec, chip, records_path, kernel_hashes, rule="rank" if rule == "ranked" else "nearest")
    steps = _steps(spec, RankParams(plain_cost=None, cross_cost=None))
    losses = []
    for row in rows:
        if row.ratio is not None and row.ratio < 1 / LOSS:
            around = tuple(sorted((k for k in filled if _distance(steps, row.key, k) == 1), key=sort_key))
            losses.append((row, around))
    summaries = {kind: summarize(r for r in rows if r.kind == kind) for kind in ("measured", "tuned")}
    return FillGate(rule, summaries, tuple(losses))


def gate_report(spec: OpSpec, gate: FillGate, op: str, chip: str) -> list[str]:
    """Lines for ``opgen records``: the rule's figures, then each bucket it loses as an error,
    with the buckets around it to measure."""
    lines = [gate.line()]
    for row, around in gate.losses:
        lines.append(f"ERROR: {key_text(spec, row.key)} ({row.kind}): the {gate.rule} fill's point runs at "
                     f"{row.ratio:.3f} of the fastest timed there ({row.source})")
        if around:
            lines.append(f"  measure the {len(around)} filled buckets around it (`opgen tune {op} --chip {chip} "
                         f"--cases SET --trials 0 --measure-fill` on cases there): "
                         + "; ".join(key_text(spec, k) for k in around[:6]) + (" ..." if len(around) > 6 else ""))
    return lines


def loo_report(spec: OpSpec, results: Mapping[str, Sequence[LooRow]]) -> str:
    """Per bucket its key text, kind and each rule's ratio (fastest over its point's time; ``-``
    where the records hold no time of it there), then a line per rule: where its point came from,
    and how the time was taken; last, each rule's figures per kind of bucket (:class:`LooSummary`)."""
    names = list(results)
    by_key: dict[Key, dict[str, LooRow]] = {}
    for name, rows in results.items():
        for row in rows:
            by_key.setdefault(row.key, {})[name] = row
    width = max((len(key_text(spec, key)) for key in by_key), default=6)
    lines = [f"{'bucket':<{width}} {'kind':<8} " + " ".join(f"{n:>8}" for n in names)]
    for key in sorted(by_key, key=sort_key):
        rows = by_key[key]
        ratios = " ".join(f"{'-' if (r := rows.get(n)) is None or r.ratio is None else f'{r.ratio:.3f}':>8}"
                          for n in names)
        lines.append(f"{key_text(spec, key):<{width}} {next(iter(rows.values())).kind:<8} {ratios}")
        lines.extend(f"    {n}: {rows[n].source} ({rows[n].how})" for n in names if n in rows)
    lines.append(f"fastest over the rule's point (a bucket lost: under {1 / LOSS:.3f}):")
    for name, rows in results.items():
        for kind in ("measured", "tuned"):
            part = [r for r in rows if r.kind == kind]
            if part:
                lines.append(f"  {name:<8} {kind:<8} {summarize(part).line()}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opgen.fill_rank <op> <chip>``: the leave-one-out table of the nearest fill and
    of this rule on the op's records (run from the repository root)."""
    parser = argparse.ArgumentParser(prog="python -m opgen.fill_rank", description=main.__doc__)
    parser.add_argument("op")
    parser.add_argument("chip")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    defaults = RankParams()
    parser.add_argument("--tau", type=float, default=defaults.tau)
    parser.add_argument("--cross-cost", type=float, default=defaults.cross_cost)
    parser.add_argument("--plain-cost", type=float, default=defaults.plain_cost,
                        help="distance of another differing plain key field (negative: such evidence does not count)")
    parser.add_argument("--min-evidence", type=int, default=defaults.min_evidence)
    parser.add_argument("--weight", action="append", default=[], metavar="FIELD=W",
                        help="distance of one bucket step of a bucketed key field (1 by default)")
    parser.add_argument("--any-category", action="store_true",
                        help="no evidence in the target's own plain fields needed")
    parser.add_argument("--clamp", action="store_true", help="narrow a tile wider than the target's dims")
    parser.add_argument("--tuned-evidence", type=float, default=defaults.tuned, metavar="W",
                        help="weight of tuned buckets' times as evidence (0: none)")
    parser.add_argument("--reach", type=float, default=None)
    args = parser.parse_args(argv)
    rank = RankParams(tau=args.tau, cross_cost=args.cross_cost,
                      plain_cost=None if args.plain_cost is not None and args.plain_cost < 0 else args.plain_cost,
                      weights=tuple((n, float(w)) for n, w in (item.split("=", 1) for item in args.weight)),
                      min_evidence=args.min_evidence, own=not args.any_category, clamp=args.clamp,
                      tuned=args.tuned_evidence, reach=args.reach)
    spec = load_spec(args.root / "specs" / f"{args.op}.yaml", args.root)
    chip = profile(args.chip)
    hashes = kernel_hashes(args.root, spec, chip.rendering)
    path = record_path(args.root, chip.name, spec.op)
    results = {rule: leave_one_out(spec, chip, path, hashes, rule=rule, rank=rank) for rule in ("nearest", "rank")}
    print(loo_report(spec, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
