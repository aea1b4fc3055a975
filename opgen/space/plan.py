"""Planning a campaign: the buckets of a case set and one study per (variant, bucket).

A bucket is a value of the spec's dispatch key; its representative cases are the case-set rows
that fall into it. A study searches one variant's feasible points on one bucket; its name keys
its optuna storage. Uses ``spec``, ``space``, ``keys``, ``hardware``, ``errors``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import UsageError
from ..spec.hardware import ChipProfile
from ..spec.keys import key_of
from ..spec.spec import OpSpec
from .space import (Point, SpaceCount, Variant, case_inputs, default_point, evaluate_params, is_legal,
                    points, variants_for)


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


def known_variants(spec: OpSpec, profile: ChipProfile, variants: Iterable[str] | None) -> set[str] | None:
    """``variants`` as a set (None: all of them).

    Raises:
        UsageError: a name in ``variants`` that is no variant of the chip's rendering.
    """
    wanted = set(variants) if variants else None
    known = [v.name for v in variants_for(spec, profile.rendering)]
    if wanted is not None and wanted - set(known):
        raise UsageError(f"{spec.op} has no variant {', '.join(sorted(wanted - set(known)))} on "
                         f"{profile.name} ({profile.rendering} rendering); known: {', '.join(known)}")
    return wanted


def plan(spec: OpSpec, profile: ChipProfile, rows: Iterable[dict[str, Any]],
         variants: Iterable[str] | None = None) -> list[StudyPlan]:
    """Every study of a campaign: legal variants of each bucket with their feasible points.

    A point is feasible only if it fits the budget for every case of its bucket.

    Raises:
        UsageError: a name in ``variants`` that is no variant of the chip's rendering.
    """
    wanted = known_variants(spec, profile, variants)
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


def rival_plans(spec: OpSpec, profile: ChipProfile, rows: Iterable[dict[str, Any]],
                plans: list[StudyPlan], variants: Iterable[str]) -> list[StudyPlan]:
    """The studies of the variants a campaign narrowed to ``variants`` leaves out, on its buckets:
    the points they hold still compete for those buckets."""
    keys = {p.bucket.key for p in plans}
    wanted = set(variants)
    others = [v.name for v in variants_for(spec, profile.rendering) if v.name not in wanted]
    return [p for p in plan(spec, profile, rows, others) if p.bucket.key in keys] if others else []
