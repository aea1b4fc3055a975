"""A fill rule learned from the records: an untuned bucket takes the candidate that ran nearest
the fastest on the measured buckets around it, each bucket weighed by its distance, instead of the
single nearest winner.

The candidates and their evidence are :mod:`opgen.table.fill_evidence`'s. A candidate may stand
for the target if it serves the whole bucket (:func:`opgen.table.fits.serves_bucket`: legal and within
budget on the target's case and on the bucket's largest shape, legal on its smallest), meets the
spec's ``constraints`` on the bucket's largest shape (no tile wider than the dims it covers there;
:attr:`RankParams.clamp` narrows such a tile instead of dropping the candidate) and was timed on at
least one bucket of the target's own plain key fields (dtype, chunk size, ...): no row crosses
a dtype or a variant family without a measurement in the target's own. Of those, the rule takes the
one whose log share over the evidence, weighed ``exp(-distance / tau)``, is least (:func:`rank_fill`).
Far buckets keep a little weight: a candidate that ran near the fastest on most shapes beats one
that won a single neighbour (on the H200 records, a reach of 2 to 4 bucket steps lost more buckets).

Pure functions over the evidence: no device, no clock. The evidence's names are importable from here.
Uses ``bucket_shapes``, ``errors``, ``fill_evidence``, ``fits``, ``hardware``, ``keys``, ``space``, ``spec``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from ..errors import RecordError
from ..space.space import carried, clamped as clamp_to, constraint_failed
from ..spec.hardware import ChipProfile
from ..spec.keys import Key, sort_key, split_key_field
from ..spec.spec import OpSpec
from .bucket_shapes import bucket_corner, case_params, edge_params
from .fill_evidence import DEFAULT, Bucket, Candidate, Evidence, candidates, gather, measured_buckets, tuned_shares
from .fits import serves_bucket

__all__ = ["RankParams", "Candidate", "Bucket", "Evidence", "Choice", "DEFAULT", "candidates", "gather",
           "measured_buckets", "tuned_shares", "distance", "rank_fill", "target_case", "fill_ranked"]


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
    """The sort key of an evidence bucket's key (:func:`opgen.spec.keys.sort_key`), computed once."""
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
    bucketed fields moved into the target's buckets by :func:`opgen.table.bucket_shapes.bucket_corner`),
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

