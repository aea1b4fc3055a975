"""Cross-reference checks of a spec that the schema alone cannot express: every formula's
names are known, every tunable in a ``fixed`` map exists, every backend has defaults for each
axis and tunable, case and sampling values name inputs of the op. Called by
:func:`opgen.spec.spec.load_spec`; every error is a :class:`~opgen.errors.SpecError` naming the file,
the key path and what was expected.
Uses ``errors``, ``expr``, ``spec_model`` and ``spec_values``.
"""
from __future__ import annotations

from typing import Any

from ..errors import SpecError
from .expr import Expr
from .spec_model import DTYPES, KeyField, OpSpec
from .spec_values import of_kind, value_kinds


def _check_names(file: str, where: str, expr: Expr, known: set[str]) -> None:
    unknown = [n for n in expr.names if n not in known]
    if unknown:
        raise SpecError(file, where, f"formula names among {sorted(known)}", ", ".join(unknown))


def validate_semantics(spec: OpSpec, file: str) -> None:
    """Cross-reference checks that the schema alone cannot express."""
    inputs = set(spec.input_names())
    known = set(inputs)
    for name, expr in spec.params.items():
        _check_names(file, f"params.{name}", expr, known)
        known.add(name)
    params = set(known)
    for i, check in enumerate(spec.checks):
        _check_names(file, f"checks.{i}.rule", check.rule, params)
    _check_signature(spec, file, params)
    _check_variants(spec, file, params)
    _check_dispatch(spec, file, params)
    _check_uses(spec, file, params)
    for set_name, rows in spec.cases.items():
        for i, row in enumerate(rows):
            for key in row:
                if key not in inputs and key != "dtype":
                    raise SpecError(file, f"cases.{set_name}.{i}.{key}",
                                    "a dim symbol, a scalar or dtype", key)
    if spec.sampling is not None:
        _validate_sampling(spec, file, params)


def _check_signature(spec: OpSpec, file: str, params: set[str]) -> None:
    """Optional tensors come last and bind no dim; dtype names, output dims and defaults are known."""
    sig = spec.signature
    optional_seen = False
    bound: set[str] = set()
    for name, arg in sig.tensors.items():
        if optional_seen and not arg.optional:
            raise SpecError(file, f"signature.tensors.{name}.optional",
                            "optional tensors after every required one (they default to None)", False)
        optional_seen = optional_seen or arg.optional
        for dim in arg.dims:
            if arg.optional and dim not in bound and dim not in spec.params:
                raise SpecError(file, f"signature.tensors.{name}.dims",
                                "dims bound by a required tensor (an optional one may be absent)", dim)
            bound.add(dim)
    dtype_scalars = {n for n, a in sig.scalars.items() if a.type == "dtype"}
    for name, arg in sig.scalars.items():
        values = (arg.default, *(arg.choices or ()))
        if arg.type == "dtype" and any(v not in DTYPES for v in values):
            raise SpecError(file, f"signature.scalars.{name}", f"dtype names among {sorted(DTYPES)}",
                            [v for v in values if v not in DTYPES])
    for name, out in sig.outputs.items():
        if out.dtype not in sig.tensors and out.dtype not in DTYPES and out.dtype not in dtype_scalars:
            raise SpecError(file, f"signature.outputs.{name}.dtype",
                            f"a tensor name {sorted(sig.tensors)}, a dtype scalar or a dtype", out.dtype)
        if out.when is not None:
            _check_names(file, f"signature.outputs.{name}.when", out.when, params)
        for d in out.dims:
            if d not in params:
                raise SpecError(file, f"signature.outputs.{name}.dims", "known dim symbols", d)
    for name, arg in sig.scalars.items():
        if arg.choices is not None and arg.default not in arg.choices:
            raise SpecError(file, f"signature.scalars.{name}.default",
                            f"one of choices {list(arg.choices)}", arg.default)


def _check_variants(spec: OpSpec, file: str, params: set[str]) -> None:
    """Axis options, exclusions, constraints and budgets read known names and fix known tunables."""
    axes = spec.variants.axes
    tunable_env = params | set(axes) | set(spec.tunables)
    for axis, options in axes.items():
        for opt_name, opt in options.items():
            at = f"variants.axes.{axis}.{opt_name}"
            _check_names(file, f"{at}.when", opt.when, params)
            for t, expr in opt.fixed.items():
                if t not in spec.tunables:
                    raise SpecError(file, f"{at}.fixed.{t}", f"a tunable {sorted(spec.tunables)}", t)
                _check_names(file, f"{at}.fixed.{t}", expr, params)
    for i, expr in enumerate(spec.variants.exclude):
        _check_names(file, f"variants.exclude.{i}", expr, set(axes))
    for i, expr in enumerate(spec.constraints):
        _check_names(file, f"constraints.{i}", expr, tunable_env)
    for backend, formulas in spec.budgets.items():
        for kind, expr in formulas.items():
            parts = expr if isinstance(expr, dict) else {"": expr}
            if not parts:
                raise SpecError(file, f"budgets.{backend}.{kind}", "a formula or {kernel: formula, ...}", "{}")
            for part, formula in parts.items():
                _check_names(file, f"budgets.{backend}.{kind}" + (f".{part}" if part else ""), formula, tunable_env)


def _check_dispatch(spec: OpSpec, file: str, params: set[str]) -> None:
    """Key fields, their buckets, the fill fields and every backend's defaults."""
    for field, key in spec.dispatch.key.items():
        expr = key.expr if isinstance(key, KeyField) else key
        _check_names(file, f"dispatch.key.{field}", expr, params)
        if isinstance(key, KeyField) and key.buckets is not None:
            if list(key.buckets) != sorted(set(key.buckets)):
                raise SpecError(file, f"dispatch.key.{field}.buckets", "strictly ascending edges",
                                list(key.buckets))
    row_fields = {"dtype", *spec.dim_symbols(), *spec.signature.scalars}
    for field in spec.dispatch.fill_across:  # a fill sets the source case's row field to the target's value
        key = spec.dispatch.key.get(field)
        expr = key.expr if isinstance(key, KeyField) else key
        if (key is None or (isinstance(key, KeyField) and key.buckets is not None) or field not in row_fields
                or expr.source.strip() != field):
            raise SpecError(file, "dispatch.fill_across",
                            "unbucketed key fields, each its own formula, named as case row fields (dtype or an "
                            "input)", field)
    for field in spec.dispatch.fill_moves:
        key = spec.dispatch.key.get(field)
        if not (isinstance(key, KeyField) and key.buckets is not None):
            raise SpecError(file, "dispatch.fill_moves", f"bucketed key fields of {sorted(spec.dispatch.key)}", field)
    for backend, defaults in spec.dispatch.defaults.items():
        _check_defaults(spec, file, params, backend, defaults)


def _check_defaults(spec: OpSpec, file: str, params: set[str], backend: str, defaults: dict[str, Any]) -> None:
    """A backend's defaults: one per axis and tunable of it, each reading names known before it."""
    axes = spec.variants.axes
    needed = list(axes) + list(spec.tunables_for(backend))
    for name in needed:
        if name not in defaults:
            raise SpecError(file, f"dispatch.defaults.{backend}", f"a default for {name!r}",
                            sorted(defaults))
    for name, value in defaults.items():
        at = f"dispatch.defaults.{backend}.{name}"
        if name not in needed:
            raise SpecError(file, at, f"an axis or a {backend} tunable {needed}", name)
        if isinstance(value, Expr):
            # an axis's default may read the axes before it; a tunable's, every axis
            earlier = set(axes) if name not in axes else set(list(axes)[:list(axes).index(name)])
            _check_names(file, at, value, params | {"CORES"} | earlier)
            if not value.names and name in axes:
                literal = value.evaluate({})
                if literal not in axes[name]:
                    raise SpecError(file, at, f"an option of axis {name} {sorted(axes[name])}",
                                    literal)


def _check_uses(spec: OpSpec, file: str, params: set[str]) -> None:
    """The launch arguments, the baselines and the traffic formula name what the spec has."""
    sig, axes = spec.signature, spec.variants.axes
    for name in spec.api.launch_args:
        if name not in sig.tensors and name not in sig.outputs and name not in params:
            raise SpecError(file, "api.launch_args", "tensor, output, scalar or param names", name)
    for name in spec.api.strided:
        if name not in sig.tensors:
            raise SpecError(file, "api.strided", "tensor names", name)
    for name, target in spec.baselines.items():
        forced = forced_axes(target)
        if forced is None and ":" not in target:
            raise SpecError(file, f"baselines.{name}", "module:function or variant:AXIS=OPTION,...", target)
        for axis, option in (forced or {}).items():
            if axis not in axes or option not in axes[axis]:
                raise SpecError(file, f"baselines.{name}", "variant:AXIS=OPTION,... over the spec's axes",
                                f"{axis}={option}")
    if spec.traffic_bytes is not None:
        _check_names(file, "traffic_bytes", spec.traffic_bytes, params)


def _validate_sampling(spec: OpSpec, file: str, params: set[str]) -> None:
    """The sampling section names inputs of the op, draws every dim, and values of their kinds."""
    sampling, kinds = spec.sampling, value_kinds(spec)
    inputs = set(spec.input_names()) | {"dtype"}

    def check_value(at: str, name: str, value: Any) -> None:
        if name not in inputs:
            raise SpecError(file, at, "a dim symbol, a scalar or dtype", name)
        kind = "bool" if name.endswith("_given") else kinds.get(name)
        if kind is not None and not of_kind(kind, value, DTYPES):
            raise SpecError(file, at, f"a {kind} value", value)

    for name, values in sampling.values.items():
        at = f"sampling.values.{name}"
        if name not in inputs:
            raise SpecError(file, at, "a dim symbol, a scalar or dtype", name)
        if values.log_range is not None and kinds.get(name) != "int":
            raise SpecError(file, f"{at}.log_range", "an int input (a dim or an int scalar)", name)
        for i, value in enumerate(values.choices or values.log_range):
            check_value(f"{at}." + (f"choices.{i}" if values.choices else f"log_range.{i}"), name, value)
    required = {d for t in spec.signature.tensors.values() if not t.optional for d in t.dims} - set(spec.params)
    missing = sorted(required - set(sampling.values))
    if missing:
        raise SpecError(file, "sampling.values", f"a way to draw every dim {sorted(required)}", missing)
    for i, pin in enumerate(sampling.pins):
        for name, value in pin.values.items():
            check_value(f"sampling.pins.{i}.values.{name}", name, value)
    tails = sampling.tails
    if tails is not None:
        drawn = sampling.values.get(tails.symbol)
        if drawn is None or drawn.log_range is None:
            raise SpecError(file, "sampling.tails.symbol", "an input drawn from a log_range", tails.symbol)
        if kinds.get(tails.multiple_of) != "int":
            raise SpecError(file, "sampling.tails.multiple_of", "an int input (a dim or an int scalar)",
                            tails.multiple_of)
    if sampling.limit is not None:
        _check_names(file, "sampling.limit", sampling.limit, params)
    for i, name in enumerate(sampling.include):
        if name not in spec.cases or name in sampling.part_names():
            raise SpecError(file, f"sampling.include.{i}", f"a case set of the spec {sorted(spec.cases)}", name)


def forced_axes(target: str) -> dict[str, str] | None:
    """The axes a ``variant:AXIS=OPTION,...`` baseline forces (the op itself with those options),
    or None for a ``module:function`` baseline."""
    if not target.startswith("variant:"):
        return None
    return dict(item.partition("=")[::2] for item in target.removeprefix("variant:").split(","))

