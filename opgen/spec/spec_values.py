"""What a spec states, checked past its names and types: YAML without duplicate keys, the op's
name, scalar defaults the generated code can hold, check messages that format, tunable domains
of values of one kind, each once, case values of their declared kinds (dims of at least 1).
Called by :func:`opgen.spec.spec.load_spec`; every error names the file, the key path and what was
expected.
Uses ``errors``.
"""
from __future__ import annotations

import keyword
import math
import string
from typing import Any

import yaml

from ..errors import SpecError

# Names the generated package imports or lives beside: an op of that name would shadow them.
RESERVED_OPS = frozenset({"torch", "triton", "numpy", "math", "os", "sys", "importlib", "functools",
                          "itertools", "typing", "generated", "opgen", "kernels"})


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a mapping with a key twice (YAML itself keeps the last)
    and an integer too long for Python to read, naming its line."""


def _readable_int(loader: UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:  # past Python's limit on the digits of an int read from text
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(node.value)} characters at line {node.start_mark.line + 1}, "
            "too long to read", node.start_mark) from None


def _unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} at line {line} (first at line {seen[key]})",
                key_node.start_mark)
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _readable_int)

# What a tensor's size and a tunable's integer value are: a 64-bit signed int of torch and Triton.
MAX_INT = 2 ** 63 - 1


def check_values(spec: Any, file: str, dtypes: Any) -> None:
    """Raise SpecError on the first value of ``spec`` (an OpSpec) the generated code could not use."""
    if keyword.iskeyword(spec.op) or spec.op in RESERVED_OPS:
        raise SpecError(file, "op", f"a name that is no Python keyword nor one of {sorted(RESERVED_OPS)}",
                        spec.op)
    for name, arg in spec.signature.scalars.items():
        for i, value in enumerate((arg.default, *(arg.choices or ()))):
            at = f"signature.scalars.{name}." + ("default" if i == 0 else f"choices.{i - 1}")
            if not of_kind(arg.type, value, dtypes):
                raise SpecError(file, at, f"a finite {arg.type} value", value)
    names = set(spec.input_names()) | set(spec.params)
    for i, check in enumerate(spec.checks):
        _check_message(file, f"checks.{i}.message", check.message, names)
    for name, tunable in spec.tunables.items():
        for backend, domain in tunable.domain.items():
            _check_domain(file, f"tunables.{name}.domain.{backend}", domain)
    _check_cases(spec, file, dtypes)
    for field, key in spec.dispatch.key.items():
        for j, edge in enumerate(getattr(key, "buckets", None) or ()):
            if not -MAX_INT - 1 <= edge <= MAX_INT:
                raise SpecError(file, f"dispatch.key.{field}.buckets.{j}", "an int in [-2**63, 2**63 - 1]", edge)
        if getattr(key, "buckets", None) == ():
            raise SpecError(file, f"dispatch.key.{field}.buckets", "at least one edge (or no buckets key)", [])
    twice = sorted({a for a in spec.api.launch_args if spec.api.launch_args.count(a) > 1})
    if twice:
        raise SpecError(file, "api.launch_args", "each argument once", f"{twice} given twice")


def _check_cases(spec: Any, file: str, dtypes: Any) -> None:
    """Every case set holds cases (a sampled part may be empty), every value of a row is of its
    kind, among its scalar's choices, and a size at least 1."""
    kinds, dims = value_kinds(spec), set(spec.dim_symbols())
    drawn = set(spec.sampling.part_names()) if spec.sampling else set()
    for set_name, rows in spec.cases.items():
        if not rows and set_name not in drawn:
            raise SpecError(file, f"cases.{set_name}", "at least one case", [])
        for i, row in enumerate(rows):
            for key, value in row.items():
                at = f"cases.{set_name}.{i}.{key}"
                kind = "bool" if key.endswith("_given") else kinds.get(key)
                scalar = spec.signature.scalars.get(key)
                if value == ():
                    raise SpecError(file, at, "a value or a list of at least one", [])
                for v in (value if isinstance(value, tuple) else (value,)):
                    if kind is not None and not of_kind(kind, v, dtypes):
                        raise SpecError(file, at, f"a {kind} value", v)
                    if scalar is not None and scalar.choices is not None and v not in scalar.choices:
                        raise SpecError(file, at, f"one of choices {list(scalar.choices)}", v)
                    if key in dims and not 1 <= v <= MAX_INT:  # a case of no element runs no kernel
                        raise SpecError(file, at, "a size in [1, 2**63 - 1]", v)


def _check_domain(file: str, at: str, domain: tuple[Any, ...]) -> None:
    """A tunable's domain on one backend: some values, each once, all of one kind (bools,
    ints of 64 bits, finite floats or strings)."""
    if not domain:
        raise SpecError(file, at, "at least one value (an empty domain has no point to tune)", [])
    for j, value in enumerate(domain):
        if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT - 1 <= value <= MAX_INT:
            raise SpecError(file, f"{at}.{j}", "an int in [-2**63, 2**63 - 1]", value)
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(file, f"{at}.{j}", "a finite float", value)
    kinds = sorted({type(v).__name__ for v in domain})
    if len(kinds) > 1:
        raise SpecError(file, at, "values of one kind (bool, int, float or str)", f"{list(domain)} ({', '.join(kinds)})")
    twice = sorted({v for v in domain if domain.count(v) > 1}, key=repr)
    if twice:
        raise SpecError(file, at, "each value once", f"{twice} given twice")


def value_kinds(spec: Any) -> dict[str, str]:
    """The kind of each value a call or a case row names: ``int`` for every dim, each scalar's
    declared type, ``dtype`` for ``dtype``, ``bool`` for ``<tensor>_given`` of an optional tensor."""
    kinds = {n: a.type for n, a in spec.signature.scalars.items()}
    kinds |= {d: "int" for d in spec.dim_symbols()} | {"dtype": "dtype"}
    return kinds | {f"{t}_given": "bool" for t, a in spec.signature.tensors.items() if a.optional}


def of_kind(kind: str, value: Any, dtypes: Any) -> bool:
    """Whether ``value`` is a value of a scalar kind: an int, a finite float, a bool, a dtype name."""
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, str) and value in dtypes


def _check_message(file: str, at: str, message: str, names: set[str]) -> None:
    """A check's message must format with the names the check sees (as the generated code does)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(message) if f is not None]
        unknown = [f for f in fields if f not in names]
        if unknown:
            raise SpecError(file, at, f"placeholders among the inputs and params {sorted(names)}", unknown)
        message.format(**{f: 1 for f in fields})
    except (ValueError, IndexError, KeyError) as exc:
        raise SpecError(file, at, "a message str.format can fill ({name} placeholders)",
                        f"{message!r}: {exc}") from None
