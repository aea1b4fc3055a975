"""Case sets drawn from a spec's ``sampling`` section (``opgen cases``): shapes that stand for
the calls users make, not the bench list, split into a tune, a measure and a holdout part.

Seeded and pure: the same spec and seed give the same cases, and :func:`cases_text` the same
bytes. Every case passes the spec's checks, its ``limit`` and every chip's defaults (what
``opgen build`` asks of a case set); every variant of the sampling's rendering is legal for at
least ``cover`` of the drawn cases. Uses ``spec``, ``space``, ``case_checks``.
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ExprError, SpecError, UsageError
from ..spec.spec import OpSpec, Sampling
from ..spec.spec_model import MAX_DRAW
from .case_checks import case_problem as built_problem
from .space import Variant, case_inputs, evaluate_params, is_legal, variants_for

TRIES = 1000
"""Draws in a row that may fail the spec before the sampling region is called too narrow."""
TOP_UP_TRIES = 20000
"""Further draws for a variant the first draw left short of ``cover`` cases."""
MAX_CASES = MAX_DRAW
"""Cases one draw may hold, extra measure cases apart (:data:`opgen.spec.spec_model.MAX_DRAW`)."""

Case = dict[str, Any]


@dataclass(frozen=True)
class SampledCases:
    """The drawn parts by case set name (tune, measure, holdout, in that order), and the variants
    whose coverage needed extra draws."""

    parts: dict[str, list[Case]]
    topped_up: tuple[str, ...]


def _uniform(rng: random.Random, n: int) -> int:
    """An index below ``n`` from one ``random()`` (stable across Python versions)."""
    return min(n - 1, int(rng.random() * n))


def _log_int(rng: random.Random, low: int, high: int) -> int:
    """An integer of ``[low, high]``, log-uniform."""
    value = math.exp(math.log(low) + rng.random() * (math.log(high + 1) - math.log(low)))
    return max(low, min(high, int(value)))


def draw_case(sampling: Sampling, defaults: dict[str, Any], rng: random.Random) -> Case:
    """One case as the sampling describes it (not yet checked against the spec); ``defaults``
    holds the scalars' defaults, for a ``tails.multiple_of`` the sampling does not draw."""
    row: Case = {}
    for name, values in sampling.values.items():
        if values.choices is not None:
            row[name] = values.choices[_uniform(rng, len(values.choices))]
        else:
            row[name] = _log_int(rng, *values.log_range)
    for pin in sampling.pins:
        if rng.random() < pin.share:
            row.update(pin.values)
    tails = sampling.tails
    if tails is not None:
        unit = int(row.get(tails.multiple_of, defaults.get(tails.multiple_of, 1)))
        whole = max(unit, unit * round(row[tails.symbol] / unit))
        tail = rng.random() < tails.share
        row[tails.symbol] = whole - unit + 1 + _uniform(rng, unit - 1) if tail and unit > 1 else whole
    return row


def case_problem(spec: OpSpec, row: Case) -> str | None:
    """Why a drawn case cannot stand in a case set of the spec (what ``opgen build`` refuses:
    :func:`opgen.space.case_checks.case_problem`), or exceeds the sampling's limit; None if it can."""
    limit = spec.sampling.limit if spec.sampling is not None else None
    try:
        if limit is not None and not limit.evaluate(evaluate_params(spec, case_inputs(spec, row))):
            return f"it exceeds the sampling limit {limit.source}"
    except (SpecError, ExprError) as exc:
        return f"its params or the sampling limit do not evaluate: {exc}"
    return built_problem(spec, row)


def _frozen(row: Case) -> tuple:
    """A case's identity, whatever the order of its keys."""
    return tuple(sorted(row.items()))


class _Drawer:
    """Draws acceptable, distinct cases from one seeded generator."""

    def __init__(self, spec: OpSpec, seed: int, taken: set[tuple]) -> None:
        self.spec, self.sampling = spec, spec.sampling
        self.rng = random.Random(f"{spec.op}/{seed}")
        self.defaults = {n: a.default for n, a in spec.signature.scalars.items()}
        self.taken = taken

    def next(self, tries: int, want: Callable[[Case], bool] | None = None) -> Case | None:
        """The next acceptable case not drawn before (and for which ``want`` holds), or None
        after ``tries`` failed draws."""
        for _ in range(tries):
            row = draw_case(self.sampling, self.defaults, self.rng)
            if _frozen(row) in self.taken:
                continue
            try:
                wanted = want is None or want(row)
            except (SpecError, ExprError):
                continue  # case_problem says why; such a case is never kept
            if wanted and case_problem(self.spec, row) is None:
                self.taken.add(_frozen(row))
                return row
        return None

    def draw(self, count: int, where: str, what: str) -> list[Case]:
        """``count`` acceptable new cases; SpecError at ``where`` if the region runs dry."""
        out: list[Case] = []
        for _ in range(count):
            row = self.next(TRIES)
            if row is None:
                raise SpecError(self.spec.path, where, f"a region where some of {TRIES} draws in a row pass the "
                                "spec's checks, limit and defaults and are new", f"{len(out)} {what}")
            out.append(row)
        return out


def _legal(spec: OpSpec, variant: Variant, row: Case) -> bool:
    """Whether ``variant`` is legal for the case."""
    return is_legal(spec, variant, evaluate_params(spec, case_inputs(spec, row)))


def sample_cases(spec: OpSpec, count: int | None = None, seed: int | None = None,
                 holdout: float | None = None, measure: float | None = None,
                 measure_extra: int | None = None) -> SampledCases:
    """Draw the spec's sampled case sets; arguments left None take the sampling section's values.
    The ``measure_extra`` cases are drawn last, into the measure part.

    Raises:
        UsageError: the spec has no sampling section, or shares that leave no tune part.
        SpecError: the sampling region is too narrow for the spec's checks, or misses a variant.
    """
    sampling = spec.sampling
    if sampling is None:
        raise UsageError(f"{spec.path} has no sampling section to draw cases from")
    count = sampling.count if count is None else count
    seed = sampling.seed if seed is None else seed
    holdout = sampling.holdout if holdout is None else holdout
    measure = sampling.measure if measure is None else measure
    extra = sampling.measure_extra if measure_extra is None else measure_extra
    if not (1 <= count <= MAX_CASES and 0 <= holdout and 0 <= measure and holdout + measure < 1
            and 0 <= extra <= MAX_CASES):
        raise UsageError(f"--sample {count} --holdout {holdout} --measure {measure} --measure-extra {extra}: "
                         f"expected 1 to {MAX_CASES} cases, holdout + measure below 1 and 0 to {MAX_CASES} extra")
    included = [row for name in sampling.include for row in spec.expand_cases(name)]
    drawer = _Drawer(spec, seed, {_frozen(r) for r in included})
    drawn = drawer.draw(count, "sampling", "cases drawn")
    topped = _cover(spec, drawer, drawn)
    tune, meas, hold = _split(drawn, seed, holdout, measure)
    meas += drawer.draw(extra, "sampling.measure_extra", "extra measure cases drawn")
    names = sampling.part_names()
    parts = {names[0]: included + tune, names[1]: meas, names[2]: hold}
    return SampledCases({k: v for k, v in parts.items() if v or k != names[1]}, topped)


def _cover(spec: OpSpec, drawer: _Drawer, drawn: list[Case]) -> tuple[str, ...]:
    """Draw more cases until every variant of the rendering is legal for ``cover`` of them."""
    sampling = spec.sampling
    topped = []
    for variant in variants_for(spec, sampling.rendering):
        have = sum(_legal(spec, variant, row) for row in drawn)
        short = have < sampling.cover
        while have < sampling.cover:
            row = drawer.next(TOP_UP_TRIES, lambda r: _legal(spec, variant, r))
            if row is None:
                break
            drawn.append(row)
            have += 1
        if have < sampling.cover:
            whens = {a: spec.variants.axes[a][o].when.source for a, o in variant.options}
            raise SpecError(spec.path, "sampling", f"a region where variant {variant.name} (legal when "
                            f"{whens}) is legal for {sampling.cover} cases", f"{have} in {TOP_UP_TRIES} more draws")
        if short:
            topped.append(variant.name)
    return tuple(topped)


def _split(rows: list[Case], seed: int, holdout: float, measure: float) -> tuple[list[Case], ...]:
    """Tune, measure and holdout parts, each in draw order; the shares are rounded to whole cases."""
    rng = random.Random(f"split/{seed}")
    order = list(range(len(rows)))
    for i in range(len(order) - 1, 0, -1):  # Fisher-Yates with one random() a step
        j = _uniform(rng, i + 1)
        order[i], order[j] = order[j], order[i]
    n_hold, n_meas = round(holdout * len(rows)), round(measure * len(rows))
    hold, meas = set(order[:n_hold]), set(order[n_hold:n_hold + n_meas])
    pick = lambda keep: [r for i, r in enumerate(rows) if keep(i)]  # noqa: E731
    return pick(lambda i: i not in hold and i not in meas), pick(meas.__contains__), pick(hold.__contains__)


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none", "nan", "inf"}


def _scalar_text(value: Any) -> str:
    """A value as YAML reads it back to the same Python value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and (not _PLAIN.match(value) or value.lower() in _YAML_WORDS):
        return json.dumps(value)
    return str(value)


def cases_text(spec: OpSpec, sampled: SampledCases, command: str) -> str:
    """The case file: a comment naming ``command`` that draws it, then each part as a YAML list."""
    lines = [f"# Drawn by `{command}` from the sampling section of {spec.path}.",
             "# Do not edit: change the sampling section and draw again."]
    for name, rows in sampled.parts.items():
        lines.append(f"{name}:" + ("" if rows else " []"))
        lines.extend("  - {" + ", ".join(f"{k}: {_scalar_text(v)}" for k, v in row.items()) + "}"
                     for row in rows)
    return "\n".join(lines) + "\n"
