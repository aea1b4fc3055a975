"""Whether a point may stand for a shape or a whole dispatch bucket: its variant legal there (the
tunables the variant fixes as they evaluate there), within the chip's on-chip budget, on the
bucket's smallest and largest calls. Read by the table, the measure step and the ranked fill.
Uses ``bucket_shapes``, ``hardware``, ``keys``, ``records``, ``space``, ``spec``.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..space.space import budget_bytes, find_variant, fixed_values, is_legal
from ..spec.hardware import ChipProfile
from ..spec.keys import Key
from ..spec.spec import OpSpec
from ..storage.records import WinnerRecord
from .bucket_shapes import case_params as _params, edge_params, low_params

__all__ = ["fits_case", "point_fits", "legal_across", "serves_bucket"]


def _fits(spec: OpSpec, chip: ChipProfile, variant_name: str, point: Mapping[str, Any],
          params: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether the variant is legal for ``params`` with this point, and whether the point fits the
    chip's budget. Legal takes the variant's ``when`` and the tunables it fixes: a point holds the
    values they evaluate to at ``params`` (vloop's one K tile of pow2(K) columns, tuned at K = 64,
    cannot stand for K = 96, where that kernel's tile would not cover K)."""
    variant = find_variant(spec, variant_name)
    used = budget_bytes(spec, variant, point, params, chip)
    legal = is_legal(spec, variant, params) and all(
        point.get(name, value) == value for name, value in fixed_values(spec, variant, params).items())
    return legal, used is None or used[1] <= chip.budget(used[0])


def fits_case(spec: OpSpec, chip: ChipProfile, rec: WinnerRecord, params: Mapping[str, Any]) -> bool:
    """Whether a winner's variant is legal for ``params`` and its point within the chip's budget there."""
    return point_fits(spec, chip, rec.variant, rec.point, params)


def point_fits(spec: OpSpec, chip: ChipProfile, variant: str, point: Mapping[str, Any],
               params: Mapping[str, Any]) -> bool:
    """Whether the variant is legal for ``params`` with this point, within the chip's budget there."""
    legal, fits = _fits(spec, chip, variant, point, params)
    return legal and fits


def legal_across(spec: OpSpec, variant: str, case: Mapping[str, Any], where: str, key: Key | None = None) -> bool:
    """Whether ``variant`` is legal on the smallest shape of the bucket of ``key`` (the case's
    by default), beside the shapes the budget checks take (the case, the bucket's largest): a
    row serves every call of its bucket, and the generated API refuses a choice illegal for the
    call's shape."""
    low = low_params(spec, case, where, key)
    return low is None or is_legal(spec, find_variant(spec, variant), low)


def serves_bucket(spec: OpSpec, chip: ChipProfile, variant: str, point: Mapping[str, Any],
                  case: Mapping[str, Any]) -> bool:
    """Whether a point measured on ``case`` may stand for its whole bucket: legal and within
    budget on the case and on the bucket's largest shape (:func:`edge_params`), so that the
    tunables its variant fixes hold across the bucket (vloop's one K tile: 16 columns at K = 16
    would not cover a K = 32 call of the same bucket), and legal on its smallest shape too
    (:func:`legal_across`)."""
    where = f"bucket of case {dict(case)}"
    return all(point_fits(spec, chip, variant, point, params)
               for params in (_params(spec, case, where), edge_params(spec, case, where))) \
        and legal_across(spec, variant, case, where)
