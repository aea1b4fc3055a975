"""The spec's cases run, at build time, through what the generated API evaluates at call time:
its params, its checks and every chip's default choice. A rule that cannot be evaluated on a
case (a division by zero, say), a case that fails a check, or a default that breaks is a
BuildError naming the case, instead of code that fails at a user's call.
Uses ``space``, ``spec``, ``hardware``, ``errors``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .errors import BuildError, ExprError, OpgenError
from .hardware import PROFILES, ChipProfile
from .space import case_inputs, cores_or_none, default_point, evaluate_params
from .spec import Check, OpSpec


def check_cases(spec: OpSpec) -> int:
    """Evaluate params, checks and each chip's defaults on every case of every case set;
    return how many cases were checked.

    Raises:
        BuildError: naming the case set, the case and the rule or default that failed.
    """
    count = 0
    for set_name in spec.cases:
        for i, row in enumerate(spec.expand_cases(set_name)):
            problem = case_problem(spec, row)
            if problem is not None:
                raise BuildError(f"{spec.path}: case {set_name}[{i}] {dict(row)}: {problem}")
            count += 1
    return count


def case_problem(spec: OpSpec, row: Mapping[str, Any]) -> str | None:
    """Why a case row cannot stand in a case set of the spec (its params do not evaluate, it
    fails a check, a chip's default choice breaks on it), or None."""
    try:
        params = evaluate_params(spec, case_inputs(spec, row))
    except OpgenError as exc:
        return f"its params do not evaluate: {exc}"
    failed = failing_check(spec, params)
    if failed is not None:
        j, check, error = failed
        if error is not None:
            return f"checks.{j} cannot be evaluated: {error}"
        return f"fails checks.{j} ({check.rule.source}): {check.message.format(**params)}"
    for chip in _chips():
        if chip.backend in spec.dispatch.defaults:
            try:
                default_point(spec, chip, params)
            except OpgenError as exc:
                return f"the {chip.name} default fails: {exc}"
    return None


def failing_check(spec: OpSpec, params: Mapping[str, Any]) -> tuple[int, Check, ExprError | None] | None:
    """The first of the spec's checks that ``params`` (a call's inputs and params) fail, as the
    generated API evaluates them: (its index, the check, the error where the rule cannot be
    evaluated, which the API counts as failing), or None when every check holds."""
    for j, check in enumerate(spec.checks):
        try:
            if not check.rule.evaluate(params):
                return j, check, None
        except ExprError as exc:
            return j, check, exc
    return None


def _chips() -> list[ChipProfile]:
    """Every chip profile; one whose core count the driver reads at run time (no public figure)
    takes each count its backend's other chips have, so its defaults are evaluated too."""
    known = {}
    for chip in PROFILES.values():
        if cores_or_none(chip) is not None:
            known.setdefault(chip.backend, set()).add(cores_or_none(chip))
    out = []
    for chip in PROFILES.values():
        if cores_or_none(chip) is not None:
            out.append(chip)
        else:
            out.extend(dataclasses.replace(chip, cube_cores=n) for n in sorted(known.get(chip.backend, ())))
    return out

