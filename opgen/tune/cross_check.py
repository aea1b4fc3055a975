"""The leave-one-out cross-check of a frozen table: each tuned bucket's winner re-measured beside
the row the table would fill that bucket with from the other winners alone (and, with
``--cross-check-all``, beside every other bucket's winner), its records and its report.

Uses ``fill_nearest``, ``fits``, ``hardware``, ``keys``, ``plan``, ``space``, ``spec``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..space.plan import Bucket
from ..space.space import Point
from ..spec.hardware import ChipProfile
from ..spec.keys import key_text, sort_key
from ..spec.spec import OpSpec
from ..table.fill_nearest import leave_one_out_fill
from ..table.fits import fits_case


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


def cross_check(spec: OpSpec, profile: ChipProfile, buckets_: list[Bucket], tuned: Mapping[tuple, Any],
                margin: float, every: bool, again: Callable[[list[Point], Bucket], dict[Point, float]],
                sink: Callable[[str, dict[str, Any]], None]) -> list[CrossCheck]:
    """Re-measure (``again``) each tuned bucket's winner beside the choice the table would give
    that bucket from the other buckets' winners alone (how a shape between tuned points fares)
    and, with ``every``, beside every other bucket's winner that is legal and fits there; one
    record per point measured beside the winner (``margin``: the loss that flags the table)."""
    tunables = spec.tunables_for(profile.backend)
    out = []
    for bucket in buckets_:
        winner = tuned.get(bucket.key)
        if winner is None:
            continue
        own = Point.of(winner.variant, winner.point, tunables)
        variant, point, source = leave_one_out_fill(spec, profile, tuned, bucket.key, bucket.params[0])
        fill = Point.of(variant, point, tunables)
        beside = {fill: source} if fill != own else {}
        for key, other in (sorted(tuned.items(), key=lambda kv: sort_key(kv[0])) if every else ()):
            p = Point.of(other.variant, other.point, tunables)
            if p != own and p not in beside and fits_case(spec, profile, other, bucket.params[0]):
                beside[p] = f"winner of {key!r}"
        times = again([own, *beside], bucket)
        others = tuple((src, p, times[p]) for p, src in beside.items() if p != fill)
        out.append(CrossCheck(bucket.key, own, source, fill, times[own], times.get(fill, times[own]), others))
        for p, src in ({own: source, **beside} if fill == own else beside).items():
            sink("cross_check", dict(
                key=list(bucket.key), case=bucket.cases[0], variant=own.variant, point=own.config,
                study=winner.study, fill_variant=p.variant, fill_point=p.config, fill_from=src,
                own_ms=_finite(times[own]), fill_ms=_finite(times[p]), margin=margin))
    return out


def _finite(t: float) -> float | None:
    """A re-measured time as a record keeps it (None: the point failed its re-measure)."""
    return t if math.isfinite(t) else None


def cross_report(spec: OpSpec, checks: list[CrossCheck], margin: float) -> str:
    """The cross-check table and its verdict: flagged when the worst loss exceeds ``margin``.
    Each bucket is named by the shapes it stands for (:func:`opgen.spec.keys.key_text`)."""
    lines = [f"{'own ms':>11} {'fill ms':>9} {'loss':>8}  fill from"]
    for c in checks:
        lines.append(f"{key_text(spec, c.key)}:")
        lines.append(f"  {c.own_ms:>9.4f} {c.fill_ms:>9.4f} {c.loss:>8.1%}  "
                     f"{c.fill_from or 'spec default'}: {c.fill.name()}")
    if checks:
        worst = max(checks, key=lambda c: c.loss)
        verdict = "FLAGGED" if worst.loss > margin else "ok"
        lines.append(f"{verdict}: worst leave-one-out loss {worst.loss:.1%} at {key_text(spec, worst.key)} "
                     f"(margin {margin:.0%})")
    every = [c for c in checks if c.others]
    if every:  # --cross-check-all: the fastest of all the points measured beside each own winner
        lines.append(f"{'own ms':>11} {'best ms':>9} {'loss':>8}  fastest other winner there")
        beaten = 0
        for c in every:
            source, point, ms = c.best_other
            beaten += ms * (1.0 + margin) < c.own_ms
            lines.append(f"{key_text(spec, c.key)}:")
            lines.append(f"  {c.own_ms:>9.4f} {ms:>9.4f} {ms / c.own_ms - 1.0:>8.1%}  {source}: {point.name()}")
        lines.append(f"{beaten} of {len(every)} own winners beaten by another bucket's winner by more than "
                     f"the margin (their searches missed it)")
    return "\n".join(lines)
