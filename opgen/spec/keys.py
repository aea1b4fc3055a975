"""Dispatch keys: where a shape's params fall in the spec's key, the one place of that rule.

A key is a tuple with one value per ``dispatch.key`` field, in spec order: a plain field's value
(``dtype``, ``H1``), or a bucketed field's bucket index (the first edge >= the value, one past
the last edge above it). The generated dispatch renders :func:`bucket_index` from this source,
so the driver and the generated code bucket alike. Uses ``spec``.
"""
from __future__ import annotations

from typing import Any, Mapping

from .spec import KeyField, OpSpec

Key = tuple[Any, ...]


def bucket_index(value, edges):
    """Index of the first edge >= value; len(edges) above the last edge."""
    for index, edge in enumerate(edges):
        if value <= edge:
            return index
    return len(edges)


def split_key_field(field: Any) -> tuple[Any, tuple[int, ...] | None]:
    """A key field's formula and its bucket edges (None for a plain field)."""
    return (field.expr, field.buckets) if isinstance(field, KeyField) else (field, None)


def key_of(spec: OpSpec, params: Mapping[str, Any]) -> Key:
    """The dispatch key of one shape's params, in ``spec.dispatch.key`` order."""
    out = []
    for field in spec.dispatch.key.values():
        expr, edges = split_key_field(field)
        value = expr.evaluate(params)
        out.append(value if edges is None else bucket_index(value, edges))
    return tuple(out)


def sort_key(key: Key) -> tuple[tuple[str, Any], ...]:
    """A total order over keys of mixed element types (bool, int, str) that never compares types."""
    return tuple((type(v).__name__, v) for v in key)


def bucket_range(name: str, edges: tuple[int, ...], first: int, last: int | None = None) -> str:
    """The values bucket indices ``first`` to ``last`` (default: ``first``) stand for:
    ``K <= 32``, ``K in (96, 128]``, ``K > 256``, ``K any``."""
    last = first if last is None else last
    if first == 0 and last >= len(edges):
        return f"{name} any"
    if first == 0:
        return f"{name} <= {edges[last]}"
    if last >= len(edges):
        return f"{name} > {edges[first - 1]}"
    return f"{name} in ({edges[first - 1]}, {edges[last]}]"


def key_text(spec: OpSpec, key: Key) -> str:
    """A key as a person reads it: plain fields as ``name=value``, buckets as their ranges."""
    parts = []
    for (name, field), value in zip(spec.dispatch.key.items(), key):
        edges = split_key_field(field)[1]
        parts.append(f"{name}={value}" if edges is None else bucket_range(name, edges, value))
    return ", ".join(parts)
