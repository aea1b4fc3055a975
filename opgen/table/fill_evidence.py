"""The evidence of the ranked fill (:mod:`opgen.table.fill_rank`), gathered from the records.

The candidates are the distinct points of the tuned (and held-back) winners, carried to the target
(:func:`opgen.space.space.carried`: the tunables a variant fixes take the target's values), and the
spec's default. The evidence is what the records timed side by side: on each measured bucket, each
candidate's time over the fastest of its run (geometric mean over the bucket's runs on the current
kernels, :func:`opgen.table.table.run_shares`); on a tuned bucket, the winner's side-by-side re-measure,
its cross-checks and its search's trials (:func:`tuned_shares`). Pure functions over the records:
no device, no clock.
Uses ``bucket_shapes``, ``errors``, ``fill_measured``, ``hardware``, ``keys``, ``records``, ``space``, ``spec``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from ..errors import BuildError, ExprError, RecordError, SpecError
from ..space.space import carried, carried_clamped, default_point, parse_point_name, point_id
from ..spec.hardware import ChipProfile
from ..spec.keys import Key, sort_key
from ..spec.spec import OpSpec
from ..storage.records import CheckRecord, Record, TrialRecord, WinnerRecord, latest_measure_runs
from .bucket_shapes import case_params, edge_params
from .fill_measured import run_shares

__all__ = ["DEFAULT", "Candidate", "Bucket", "Evidence", "candidates", "measured_buckets", "tuned_shares", "gather"]

DEFAULT = "spec default"  # the identity of the spec's default among the candidates


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
        largest call of the bucket, as the measure step runs it; :func:`opgen.space.space.carried_clamped`)
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
    under its own point) the time over the fastest, >= 1 (:func:`opgen.table.table.run_shares` on a
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
    on the current kernels (:func:`opgen.table.table.run_shares`, the default's under its point), on the
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

