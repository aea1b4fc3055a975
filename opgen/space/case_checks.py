"""The spec's cases run, at build time, through every formula of the spec: what the generated API
evaluates at call time (its params, its checks, the dispatch key, the outputs' ``when``, the
variants' legality and fixed values, every chip's default choice and the budget it fits) and
what the driver evaluates (the constraints and budgets of each legal variant at that chip's
default tunables, ``traffic_bytes``, the sampling's ``limit``). A formula that cannot be
evaluated on a case (a division by zero, a value past the formulas' bounds), a key field of a
value no key holds, a case that fails a check, or a default that breaks is a BuildError naming
the case and the formula's key path, instead of code that fails at a user's call.
Uses ``errors``, ``expr``, ``hardware``, ``keys``, ``space``, ``spec``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..errors import BuildError, ExprError, OpgenError
from ..spec.expr import Expr, is_finite_number
from ..spec.hardware import PROFILES, ChipProfile
from ..spec.keys import split_key_field
from ..spec.spec import Check, OpSpec
from .space import (Point, Variant, all_variants, budget_formula, budget_parts, case_inputs, cores_or_none,
                    default_point, evaluate_params, fixed_values, is_legal)


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
    problem = shape_problem(spec, params)
    if problem is not None:
        return problem
    legal = [(v, fixed_values(spec, v, params)) for v in all_variants(spec) if is_legal(spec, v, params)]
    seen: set[tuple[Any, ...]] = set()
    for chip in _chips():
        if chip.backend in spec.dispatch.defaults:
            try:
                default = default_point(spec, chip, params)
            except OpgenError as exc:
                return f"the {chip.name} default fails: {exc}"
            if (chip.rendering, default.values) in seen:
                continue
            seen.add((chip.rendering, default.values))
            problem = point_problem(spec, chip, params, default,
                                    [(v, f) for v, f in legal if chip.rendering in v.backends], seen)
            if problem is not None:
                return problem
    return None


def _fails(path: str, expr: Expr, env: Mapping[str, Any], where: str = "", truth: bool = False) -> str | None:
    """Why ``expr`` (at key path ``path``) cannot be evaluated on ``env`` (``truth``: or gives no
    boolean, a condition's value), or None."""
    try:
        value = expr.evaluate(env)
    except ExprError as exc:
        return f"{path} cannot be evaluated{where}: {exc}"
    if truth and not isinstance(value, bool):
        return f"{path} gives {value!r}{where}, not a boolean: formula {expr.source!r}"
    return None


def shape_problem(spec: OpSpec, params: Mapping[str, Any]) -> str | None:
    """The first formula of the shape alone that does not evaluate on its ``params``, or a key
    field whose value no key can hold: the dispatch key's fields, the outputs' ``when``, every
    variant option's ``when`` and, where it holds, the values it fixes, ``traffic_bytes`` and the
    sampling's ``limit``. None when all evaluate."""
    for name, field in spec.dispatch.key.items():
        expr, edges = split_key_field(field)
        problem = _fails(f"dispatch.key.{name}", expr, params)
        if problem is not None:
            return problem
        value = expr.evaluate(params)
        if edges is not None and (isinstance(value, bool) or not is_finite_number(value)):
            return f"dispatch.key.{name} gives {value!r}, not a finite number to bucket"
        if edges is None and not (isinstance(value, (str, int)) or is_finite_number(value)):
            return f"dispatch.key.{name} gives {value!r}, not a string, boolean or finite number"
    formulas = [(f"signature.outputs.{n}.when", o.when) for n, o in spec.signature.outputs.items()
                if o.when is not None]
    for axis, options in spec.variants.axes.items():
        for option, o in options.items():
            formulas.append((f"variants.axes.{axis}.{option}.when", o.when))
    formulas += [(path, e) for path, e in (("traffic_bytes", spec.traffic_bytes),
                                           ("sampling.limit", spec.sampling and spec.sampling.limit)) if e]
    for path, expr in formulas:
        problem = _fails(path, expr, params, truth=path.endswith(".when"))
        if problem is not None:
            return problem
    for axis, options in spec.variants.axes.items():
        for option, o in options.items():
            if o.when.evaluate(params):
                for name, expr in o.fixed.items():
                    problem = _fails(f"variants.axes.{axis}.{option}.fixed.{name}", expr, params)
                    if problem is not None:
                        return problem
    return None


def point_problem(spec: OpSpec, chip: ChipProfile, params: Mapping[str, Any], default: Point,
                  legal: list[tuple[Variant, dict[str, Any]]], seen: set[tuple[Any, ...]]) -> str | None:
    """The first constraint or budget formula that does not evaluate, or a budget that gives no
    byte count, at ``chip``'s ``default`` tunables with each variant of ``legal`` (those legal on
    ``params`` that the chip renders, each with the values it fixes there), or None. ``seen`` holds
    the values the formulas were evaluated on already (each set of values is evaluated once)."""
    found = budget_formula(spec, chip)
    kind, parts = found if found is not None else ("", {})
    constraint_names = sorted({n for c in spec.constraints for n in c.names})
    budget_names = sorted({n for e in parts.values() for n in e.names})
    for variant, fixed in legal:
        config = {**default.config, **fixed}
        env = {**params, **variant.flags, **config}
        where = f" with {variant.name} at the {chip.name} default {config}"
        values = ("constraints", *(env.get(n) for n in constraint_names))
        if values not in seen:
            seen.add(values)
            for j, constraint in enumerate(spec.constraints):
                problem = _fails(f"constraints.{j}", constraint, env, where, truth=True)
                if problem is not None:
                    return problem
        values = (chip.rendering, *(env.get(n) for n in budget_names))
        if parts and values not in seen:
            seen.add(values)
            try:
                budget_parts(spec, variant, config, params, chip)
            except ExprError as exc:
                return f"budgets.{chip.rendering}.{kind} cannot be evaluated{where}: {exc}"
            except OpgenError as exc:  # a value that is no byte count, naming its key path
                return f"{exc}{where}"
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

