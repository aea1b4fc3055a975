"""The search space: variants (one option per axis) and points (a variant plus tunable values).

Pure enumeration: takes a spec, a chip profile and a concrete shape's params, returns tuples in
declaration order, with counts of what the constraints and the on-chip budget removed and why.
No I/O, no clock, no device. Uses ``spec``, ``expr``, ``hardware``, ``errors``.
"""
from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..errors import BuildError, ExprError, SpecError, UnsupportedInput
from ..spec.expr import Expr
from ..spec.hardware import ChipProfile
from ..spec.spec import OpSpec


@dataclass(frozen=True)
class Variant:
    """One kernel variant: an option per axis.

    Attributes:
        name: option names joined by ``_`` in axis order (``fold_general_tiled``).
        options: ``(axis, option)`` pairs in axis order.
        backends: renderings that produce it.
        template: the kernel template that renders it (the first option's own, else the axes').
    """

    name: str
    options: tuple[tuple[str, str], ...]
    backends: tuple[str, ...]
    template: str = ""

    @property
    def flags(self) -> dict[str, str]:
        """Axis name to chosen option, as the templates and formulas see them."""
        return dict(self.options)


def point_id(variant: str, config: Mapping[str, Any]) -> str:
    """The identity of a point, whatever the order its tunables are stored in: the variant and
    its ``name=value`` pairs sorted by name, values as text (a record's values read back from
    JSON, or from a :meth:`Point.name` the records kept, compare equal)."""
    return variant + ":" + ",".join(f"{k}={v}" for k, v in sorted(config.items()))


def parse_point_name(name: str) -> tuple[str, dict[str, str]]:
    """The variant and values (as text) of a :meth:`Point.name`, as records keep them
    (``WinnerRecord.remeasured_ms``)."""
    variant, _, values = name.partition(":")
    return variant, dict(item.split("=", 1) for item in values.split(",") if "=" in item)


@dataclass(frozen=True)
class Point:
    """A variant with a value for every tunable of a backend (:attr:`ident` is its identity)."""

    variant: str
    values: tuple[tuple[str, Any], ...]

    @property
    def config(self) -> dict[str, Any]:
        """The tunable values as a dict."""
        return dict(self.values)

    def name(self) -> str:
        """``variant:K1=v1,K2=v2`` in tunable declaration order (how it is shown and recorded)."""
        return self.variant + ":" + ",".join(f"{k}={v}" for k, v in self.values)

    @property
    def ident(self) -> str:
        """The point's identity (:func:`point_id`)."""
        return point_id(self.variant, self.config)

    @classmethod
    def of(cls, variant: str, config: Mapping[str, Any], names: Iterable[str]) -> Point:
        """The point of a stored config (a record's), its values in the order of ``names``."""
        return cls(variant, tuple((n, config[n]) for n in names))


@dataclass(frozen=True)
class SpaceCount:
    """How a variant's space shrank for one shape and chip."""

    variant: str
    total: int
    duplicates: int
    constrained: int
    over_budget: int
    feasible: int
    reasons: tuple[tuple[str, int], ...]


# all_variants per spec's variants section (frozen), kept with the section so its id is not reused
_VARIANTS: dict[int, tuple[Any, tuple[Variant, ...]]] = {}


def all_variants(spec: OpSpec) -> tuple[Variant, ...]:
    """Every combination of axis options not excluded by the spec, in declaration order, with
    the renderings it has."""
    held = _VARIANTS.get(id(spec.variants))
    if held is None or held[0] is not spec.variants:
        held = _VARIANTS[id(spec.variants)] = (spec.variants, _all_variants(spec))
    return held[1]


def _all_variants(spec: OpSpec) -> tuple[Variant, ...]:
    axes = spec.variants.axes
    out = []
    for combo in itertools.product(*(list(opts) for opts in axes.values())):
        options = tuple(zip(axes, combo))
        if any(e.evaluate(dict(options)) for e in spec.variants.exclude):
            continue
        backends = tuple(b for b in ("cuda", "npu")
                         if all(b in axes[a][o].backends for a, o in options))
        if backends:
            own = [axes[a][o].template for a, o in options if axes[a][o].template]
            out.append(Variant("_".join(combo), options, backends, (own or [spec.variants.template])[0]))
    return tuple(out)


def variants_for(spec: OpSpec, rendering: str) -> tuple[Variant, ...]:
    """Variants rendered for ``rendering`` (``cuda`` or ``npu``)."""
    return tuple(v for v in all_variants(spec) if rendering in v.backends)


def find_variant(spec: OpSpec, name: str) -> Variant:
    """The variant called ``name``; an unknown name is a BuildError listing the known ones."""
    for variant in all_variants(spec):
        if variant.name == name:
            return variant
    names = ", ".join(v.name for v in all_variants(spec))
    raise BuildError(f"{spec.op}: unknown variant {name!r}; known: {names}")


def case_inputs(spec: OpSpec, row: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs of one case row: dims, scalars (defaults filled) and ``<tensor>_dtype`` names.

    ``dtype`` in a row applies to every tensor that allows it; other tensors take their first dtype.
    An optional tensor is absent unless the row sets ``<name>_given``.
    """
    env: dict[str, Any] = {name: arg.default for name, arg in spec.signature.scalars.items()}
    for key, value in row.items():
        if key != "dtype":
            env[key] = value
    wanted = row.get("dtype")
    allowed = spec.call_dtypes()
    if wanted is not None and wanted not in allowed:
        raise SpecError(spec.path, "cases", f"a dtype of the op's calls ({', '.join(allowed)})", dict(row))
    for name, arg in spec.signature.tensors.items():
        if arg.optional:
            env.setdefault(f"{name}_given", False)
        given = not arg.optional or env[f"{name}_given"]
        env[f"{name}_dtype"] = (wanted if wanted in arg.dtypes else arg.dtypes[0]) if given else None
    missing = [n for n in spec.input_names() if n not in env]
    if missing:
        raise SpecError(spec.path, "cases", f"values for {missing}", dict(row))
    return env


def evaluate_params(spec: OpSpec, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs plus the spec's params, evaluated in order."""
    env = dict(inputs)
    for name, expr in spec.params.items():
        env[name] = expr.evaluate(env)
    return env


def is_legal(spec: OpSpec, variant: Variant, params: Mapping[str, Any]) -> bool:
    """Whether every option of ``variant`` is legal for these params."""
    axes = spec.variants.axes
    return all(bool(axes[a][o].when.evaluate(params)) for a, o in variant.options)


def fixed_values(spec: OpSpec, variant: Variant, params: Mapping[str, Any]) -> dict[str, Any]:
    """Tunables that the variant's options fix, evaluated for these params."""
    axes = spec.variants.axes
    out: dict[str, Any] = {}
    for axis, option in variant.options:
        for name, expr in axes[axis][option].fixed.items():
            if name in out:
                raise SpecError(spec.path, f"variants.axes.{axis}.{option}.fixed.{name}",
                                "a tunable fixed by one axis only", name)
            out[name] = expr.evaluate(params)
    return out


def carried(spec: OpSpec, variant_name: str, config: Mapping[str, Any],
            params: Mapping[str, Any]) -> dict[str, Any] | None:
    """A point's config carried to the shape of ``params``: the tunables its variant fixes take
    the values they evaluate to there, the others keep theirs (a vloop winner tuned at K = 64,
    BK = 64, carried to K = 32 runs BK = 32). None where the fixed tunables do not evaluate."""
    try:
        return {**config, **fixed_values(spec, find_variant(spec, variant_name), params)}
    except (SpecError, ExprError):
        return None


def constraint_failed(spec: OpSpec, variant: str, point: Mapping[str, Any], params: Mapping[str, Any]) -> str | None:
    """The first of the spec's constraints the point fails at ``params`` (its source), else None.
    The constraints prune tiles wider than the dims they cover (``BV <= max(16, pow2(V))``): a
    fill checks them on the target bucket's largest call, so that no filled row runs a tile
    wider than every call it serves."""
    env = {**params, **find_variant(spec, variant).flags, **point}
    try:
        return next((c.source for c in spec.constraints if not c.evaluate(env)), None)
    except ExprError as exc:
        return f"(does not evaluate: {exc})"


def clamped(spec: OpSpec, chip: ChipProfile, variant: str, point: Mapping[str, Any],
            params: Mapping[str, Any]) -> dict[str, Any] | None:
    """``point`` meeting the spec's constraints at ``params`` (a bucket's largest call): while a
    constraint fails (the tunables the variant fixes taken as they evaluate there), the first
    integer tunable it reads that the variant does not fix and that can be lowered to meet it
    takes the largest such value of its domain (tiles clamped to the
    dims they cover: ``BV <= max(16, pow2(V))`` turns BV 128 into 64 at V = 64). None where no
    lowering meets every constraint, or they do not evaluate. Each step lowers a value of a finite
    domain, so the loop ends."""
    flags = find_variant(spec, variant).flags
    try:
        fixed = fixed_values(spec, find_variant(spec, variant), params)
    except (SpecError, ExprError):
        return None
    out = dict(point)

    def meets(constraint: Any, values: Mapping[str, Any]) -> bool:  # the fixed tunables as they run there
        return bool(constraint.evaluate({**params, **flags, **values, **fixed}))

    try:
        while (failed := next((c for c in spec.constraints if not meets(c, out)), None)) is not None:
            lower = [{**out, name: v} for name in failed.names
                     if name in out and name not in fixed and type(out[name]) is int
                     for v in sorted((v for v in spec.tunables[name].domain[chip.rendering]
                                      if type(v) is int and v < out[name]), reverse=True)]
            out = next((trial for trial in lower if meets(failed, trial)), None)
            if out is None:
                return None
    except ExprError:
        return None
    return out


def carried_clamped(spec: OpSpec, profile: ChipProfile, variant_name: str, config: Mapping[str, Any],
                    params: Mapping[str, Any], largest: Mapping[str, Any]) -> dict[str, Any] | None:
    """A point carried from one bucket to another as a fill or the measure step carries it: to
    the shape of ``params`` (:func:`carried`), its tiles clamped to ``largest``, the largest call
    of the bucket it serves (:func:`clamped`); None where either fails."""
    config = carried(spec, variant_name, config, params)
    return None if config is None else clamped(spec, profile, variant_name, config, largest)


def budget_formula(spec: OpSpec, profile: ChipProfile) -> tuple[str, dict[str, Expr]] | None:
    """The ``(kind, {kernel: formula})`` checked on ``profile`` (kernel "" for a single formula),
    or None (no formula, or the interpreter, which has no on-chip memory and no launch options
    such as ``multibuffer``)."""
    if profile.backend == "interpreter":
        return None
    formulas = spec.budgets.get(profile.rendering, {})
    for kind, expr in formulas.items():
        return kind, (dict(expr) if isinstance(expr, dict) else {"": expr})
    return None


def budget_parts(spec: OpSpec, variant: Variant, config: Mapping[str, Any], params: Mapping[str, Any],
                 profile: ChipProfile) -> tuple[str, dict[str, int]] | None:
    """Estimated on-chip bytes of each kernel of a point and the budget kind, or None."""
    found = budget_formula(spec, profile)
    if found is None:
        return None
    kind, parts = found
    env = {**params, **variant.flags, **config}
    return kind, {name: _bytes(spec, profile, kind, name, expr.evaluate(env)) for name, expr in parts.items()}


def _bytes(spec: OpSpec, profile: ChipProfile, kind: str, part: str, value: Any) -> int:
    """A budget formula's value as a byte count: a non-negative int or finite float, nothing else
    (a bool or a string would be a count by accident).

    Raises:
        SpecError: naming the formula's key path and the value it gave.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        where = f"budgets.{profile.rendering}.{kind}" + (f".{part}" if part else "")
        raise SpecError(spec.path, where, "a formula giving a byte count (a number >= 0)", repr(value))
    return int(value)


def budget_bytes(spec: OpSpec, variant: Variant, config: Mapping[str, Any],
                 params: Mapping[str, Any], profile: ChipProfile) -> tuple[str, int] | None:
    """Estimated on-chip bytes of a point (its largest kernel) and the budget kind, or None
    without a formula."""
    found = budget_parts(spec, variant, config, params, profile)
    if found is None:
        return None
    kind, parts = found
    return kind, max(parts.values())


def points(spec: OpSpec, variant: Variant, profile: ChipProfile,
           params: Mapping[str, Any]) -> tuple[tuple[Point, ...], SpaceCount]:
    """The feasible points of ``variant`` for one shape on one chip, and what was cut.

    Points are the cross product of the backend's domains, with the variant's fixed tunables
    substituted (duplicates dropped), filtered by the spec's constraints, then by the budget. The
    product runs over the free tunables' domains alone; the combinations a fixed tunable makes
    equal are counted as duplicates without being formed, and the constraints are decided on the
    product of the tunables they read.
    """
    names = spec.tunables_for(profile.backend)
    fixed = fixed_values(spec, variant, params)
    domains = [spec.tunables[n].domain[profile.rendering] for n in names]
    choices = [[fixed[n]] if n in fixed else list(dict.fromkeys(domain)) for n, domain in zip(names, domains)]
    total = math.prod(len(d) for d in domains)
    dup = total - math.prod(len(c) for c in choices)
    reasons: dict[str, int] = {}
    env_base = {**params, **variant.flags}
    combos, constrained = _passing(spec, names, choices, env_base, reasons)
    formula = budget_formula(spec, profile)
    parts: list[tuple[str, _Memo]] = []
    if formula is not None:
        kind, formulas = formula
        limit = profile.budget(kind)
        parts = [(part, _Memo(expr, env_base, names)) for part, expr in formulas.items()]
    kept: list[Point] = []
    for combo in combos:
        point = tuple(map(list.__getitem__, choices, combo))
        over_parts = [part for part, f in parts if _bytes(spec, profile, kind, part, f(point)) > limit]
        if over_parts:
            key = f"{kind}{'(' + ','.join(over_parts) + ')' if over_parts != [''] else ''} > {limit}"
            reasons[key] = reasons.get(key, 0) + 1
            continue
        kept.append(Point(variant.name, tuple(zip(names, point))))
    over = len(combos) - len(kept)
    return tuple(kept), SpaceCount(variant.name, total, dup, constrained, over, len(kept), tuple(sorted(reasons.items())))


def _passing(spec: OpSpec, names: tuple[str, ...], choices: list[list[Any]], env_base: dict[str, Any],
             reasons: dict[str, int]) -> tuple[list[tuple[int, ...]], int]:
    """The combinations that pass the constraints (indices into ``choices``, in the whole product's
    order) and how many fail, each counted in ``reasons`` under the first constraint it fails."""
    constraints = [(c.source, _Memo(c, env_base, names)) for c in spec.constraints]
    # Which constraint a combination fails first depends only on the tunables the constraints
    # read: decide that on their product, each outcome standing for every value of the others.
    read = [i for i, n in enumerate(names) if any(n in c.names for c in spec.constraints)]
    rest = [i for i in range(len(names)) if i not in read]
    each = math.prod(len(choices[i]) for i in rest)
    passed: list[tuple[int, ...]] = []
    constrained = 0
    values: list[Any] = [None] * len(names)
    for picks in itertools.product(*(range(len(choices[i])) for i in read)):
        for i, k in zip(read, picks):
            values[i] = choices[i][k]
        failed = next((source for source, c in constraints if not c(values)), None)
        if failed is None:
            passed.append(picks)
        else:
            constrained += each
            reasons[failed] = reasons.get(failed, 0) + each
    order = read + rest
    inv = [order.index(i) for i in range(len(names))]
    unorder = operator.itemgetter(*inv) if len(inv) > 1 else (lambda full: tuple(full[j] for j in inv))
    others = list(itertools.product(*(range(len(choices[i])) for i in rest)))
    combos = sorted(unorder(picks + more) for picks in passed for more in others)
    return combos, constrained


class _Memo:
    """A formula's value at a point, evaluated once for each combination of the tunables it reads
    (the rest of its environment, the shape's params and the variant's flags, is fixed)."""

    def __init__(self, expr: Expr, env_base: Mapping[str, Any], tunables: Sequence[str]) -> None:
        self.expr, self.env_base = expr, env_base
        self.reads = [(i, n) for i, n in enumerate(tunables) if n in expr.names]
        self.key = operator.itemgetter(*(i for i, _ in self.reads)) if self.reads else (lambda values: ())
        self.values: dict[Any, Any] = {}

    def __call__(self, values: Sequence[Any]) -> Any:
        """The value where the tunables (in the order given at construction) take ``values``."""
        key = self.key(values)
        if key not in self.values:
            self.values[key] = self.expr.evaluate({**self.env_base, **{n: values[i] for i, n in self.reads}})
        return self.values[key]


def default_point(spec: OpSpec, profile: ChipProfile, params: Mapping[str, Any]) -> Point:
    """The spec's default choice for one shape on one chip (the frozen choice until tuned).

    Default formulas also see ``CORES``, the chip's persistent-grid program count (cube cores,
    SMs); an axis's formula sees the axes before it, a tunable's every axis. A list-valued
    default takes its first value whose point fits the chip's budget.

    Raises:
        BuildError: if the defaults pick an unknown or illegal variant, or nothing fits.
    """
    defaults = spec.dispatch.defaults.get(profile.backend)
    if defaults is None:
        raise BuildError(f"{spec.op}: no dispatch.defaults for backend {profile.backend!r}")
    axes = spec.variants.axes
    params = {**params, "CORES": cores_or_none(profile)}
    combo = []
    for axis in axes:
        value = defaults[axis]
        option = (value if isinstance(value, Expr) else value[0]).evaluate(params)
        if option not in axes[axis]:
            raise BuildError(f"{spec.path}: dispatch.defaults.{profile.backend}.{axis} gave "
                             f"{option!r}, not an option of {sorted(axes[axis])}")
        combo.append(option)
        params[axis] = option
    variant = find_variant(spec, "_".join(combo))
    if profile.rendering not in variant.backends or not is_legal(spec, variant, params):
        raise BuildError(f"{spec.op}: default variant {variant.name} is not legal on "
                         f"{profile.name} for {dict(params)}")
    config = fixed_values(spec, variant, params)
    choices: list[tuple[str, tuple[Any, ...]]] = []
    for name in spec.tunables_for(profile.backend):
        if name in config:
            continue
        value = defaults[name]
        if isinstance(value, Expr):
            config[name] = value.evaluate(params)
        else:
            choices.append((name, tuple(v.evaluate(params) for v in value)))
    for combo_values in itertools.product(*(vals for _, vals in choices)):
        trial = {**config, **dict(zip((n for n, _ in choices), combo_values))}
        ordered = {n: trial[n] for n in spec.tunables_for(profile.backend)}
        used = budget_bytes(spec, variant, ordered, params, profile)
        if used is None or used[1] <= profile.budget(used[0]):
            return Point(variant.name, tuple(ordered.items()))
    raise BuildError(f"{spec.op}: no default of {variant.name} fits {profile.name}'s budget "
                     f"for {dict(params)}")


def forced_point(spec: OpSpec, profile: ChipProfile, variant: Variant, params: Mapping[str, Any]) -> Point:
    """The spec's default tunables for one shape on one chip with ``variant`` forced: the values
    the variant fixes replace the defaults (the point may not fit the budget)."""
    config = {**default_point(spec, profile, params).config, **fixed_values(spec, variant, params)}
    return Point(variant.name, tuple(config.items()))


def cores_or_none(profile: ChipProfile) -> int | None:
    """The chip's persistent-grid program count where the profile knows it (else the driver
    tells at run time, and a build-time default that needs it fails loudly)."""
    try:
        return profile.cores
    except UnsupportedInput:
        return None
