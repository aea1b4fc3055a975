"""``opgen tune --dry-run``: the search space of a campaign, study by study, and what was cut.

Uses ``plan``, ``keys``, ``spec``, ``hardware``.
"""
from __future__ import annotations

from ..spec.hardware import ChipProfile
from ..spec.keys import key_text
from ..spec.spec import OpSpec
from .plan import StudyPlan


def dry_run_table(spec: OpSpec, profile: ChipProfile, plans: list[StudyPlan]) -> str:
    """What ``opgen tune --dry-run`` prints: points per study, what was cut and why."""
    lines = [f"{spec.op} on {profile.name}: {len(plans)} studies; per bucket (the values its key "
             "stands for), its studies:",
             f"  {'variant':<28} {'points':>6} {'dup':>5} {'constr':>6} "
             f"{'budget':>6} {'feasible':>8} {'cases':>5}  reasons"]
    shown = None
    for p in plans:
        c = p.count
        if p.bucket.key != shown:
            shown = p.bucket.key
            lines.append(f"bucket {key_text(spec, p.bucket.key)}")
        reasons = "; ".join(f"{r} x{n}" for r, n in c.reasons) or "-"
        lines.append(f"  {p.variant.name:<28} {c.total:>6} {c.duplicates:>5} "
                     f"{c.constrained:>6} {c.over_budget:>6} {len(p.points):>8} {len(p.bucket.cases):>5}  {reasons}")
    lines.append("dup, constr, budget and reasons: on each bucket's first case; feasible: the points "
                 "that fit every case of the bucket (the ones searched)")
    return "\n".join(lines)
