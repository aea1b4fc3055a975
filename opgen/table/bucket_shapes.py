"""The calls a dispatch bucket stands for, at its corners: a row serves every call of its bucket,
so its legality and budget are checked on the bucket's smallest and largest calls, and a fill
checks a source's point on the target bucket's call nearest the source's case.

A corner moves each plain-name bucketed key field (``K``, ``R``) through its bucket, from one end
inward, to the first combination that lands on the bucket's key and passes the spec's checks: a
field such as ``K % 8 == 0 and V % 8 == 0`` or ``pow2(R) == R`` splits a ``K`` or ``R`` bucket, and
the spec may refuse ``N = 33``. Uses ``keys``, ``space``, ``case_checks``, ``spec``.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Literal, Mapping

from ..errors import ExprError, RecordError, SpecError
from ..space.case_checks import failing_check
from ..space.space import case_inputs
from ..spec.keys import Key, bucket_index, key_of, split_key_field
from ..spec.spec import OpSpec

Corner = Literal["low", "high", "case"]


def case_params(spec: OpSpec, case: Mapping[str, Any], where: str,
                override: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Params of a case row, with ``override`` replacing inputs or params by name.

    Raises:
        RecordError: ``where`` and the case, whose params do not evaluate.
    """
    override = override or {}
    try:
        env = {**case_inputs(spec, case), **override}
        for name, expr in spec.params.items():
            env[name] = override[name] if name in override else expr.evaluate(env)
    except (SpecError, ExprError) as exc:
        raise RecordError(f"{where}: case {dict(case)} does not evaluate: {exc}") from None
    return env


def input_deps(spec: OpSpec, names: Iterable[str]) -> set[str]:
    """The inputs that ``names`` (inputs or params) are computed from."""
    out: set[str] = set()
    for name in names:
        out |= input_deps(spec, spec.params[name].names) if name in spec.params else {name}
    return out


def plain_fields(spec: OpSpec) -> dict[int, str]:
    """Bucketed key positions whose formula is one input's name (``K``): position -> name. A
    corner moves these through their buckets."""
    out = {}
    for i, field in enumerate(spec.dispatch.key.values()):
        expr, edges = split_key_field(field)
        if edges and expr.names == (expr.source.strip(),):
            out[i] = expr.names[0]
    return out


def free_fields(spec: OpSpec) -> dict[int, str | None]:
    """Bucketed key positions that a fill may change: position -> plain name, or None.

    A plain-name field (``K``) is moved to a value of the target bucket, and so is a field
    computed from plain-name fields alone (``K % 8 == 0 and V % 8 == 0`` as a bucketed flag). Another formula
    (``B * H * NT``) may change only if one of its inputs is read by no variant's ``when``: the
    target bucket is then reached through that input, which legality does not see.
    """
    when_inputs = input_deps(spec, {n for options in spec.variants.axes.values()
                                    for o in options.values() for n in o.when.names})
    plain = plain_fields(spec)
    out: dict[int, str | None] = dict(plain)
    for i, field in enumerate(spec.dispatch.key.values()):
        expr, edges = split_key_field(field)
        if not edges or i in plain:
            continue
        deps = input_deps(spec, expr.names)
        if deps <= set(plain.values()) or deps - when_inputs:
            out[i] = None
    return out


def _compared(spec: OpSpec) -> list[int]:
    """Key positions a corner must land on: the unbucketed fields and the fields computed from
    what a corner moves (the plain-name fields); a bucketed formula of other inputs (``B * H * NT``)
    stays where the case puts it."""
    moved = set(plain_fields(spec).values())
    out = []
    for i, field in enumerate(spec.dispatch.key.values()):
        expr, edges = split_key_field(field)
        if not edges or input_deps(spec, expr.names) & moved:
            out.append(i)
    return out


def _inward(start: int, lo: int, hi: int | None, up: bool) -> list[int]:
    """Values of ``[lo, hi]`` (``hi`` None: unbounded) from ``start`` inward (up or down), nearest
    first: ``start``, its neighbour, and the nearest multiple of each power of two (the values an
    alignment or a power-of-two rule admits)."""
    out = [start, start + (1 if up else -1)]
    reach = hi if hi is not None else 2 * start
    step = 2
    while step <= 2 * max(reach, 1):
        out.append(-(-start // step) * step if up else start // step * step)
        step *= 2
    return sorted({v for v in out if v >= lo and (hi is None or v <= hi)}, key=lambda v: (abs(v - start), v))


def _ends(edges: tuple[int, ...], index: int, corner: Corner, value: Any) -> list[int]:
    """The values of bucket ``index`` of ``edges`` a corner tries, nearest its end first: the
    smallest value upward (``low``); the largest downward (``high``), or, in the last bucket, one
    past the last edge upward; with ``case``, ``value`` both ways where it is in the bucket."""
    lo = edges[index - 1] + 1 if index > 0 else 1
    hi = edges[index] if index < len(edges) else None
    if corner == "case" and isinstance(value, int) and bucket_index(value, edges) == index:
        down, up = _inward(value, lo, hi, up=False), _inward(value, lo, hi, up=True)
        return sorted(set(down) | set(up), key=lambda v: (abs(v - value), -v))
    if corner == "low" or hi is None:
        return _inward(lo, lo, hi, up=True)
    return _inward(hi, lo, hi, up=False)


def bucket_corner(spec: OpSpec, case: Mapping[str, Any], where: str, key: Key | None,
                  corner: Corner) -> dict[str, Any] | None:
    """The params of the call of bucket ``key`` (the case's own when None) nearest one of its
    corners: ``case`` with each plain-name bucketed field moved to the smallest (``low``) or
    largest (``high``; one past the last edge in the last bucket) value of its bucket in ``key``,
    or kept where it is in that bucket (``case``), then inward to the first combination that lands
    on ``key`` (:func:`_compared`) and passes the spec's checks. None if none does: no call the
    spec takes lands there.

    Raises:
        RecordError: the case's params do not evaluate.
    """
    params = case_params(spec, case, where)
    key = key or key_of(spec, params)
    memo = (id(spec), tuple(sorted(case.items())), key, corner)
    if memo not in _CORNERS:
        if len(_CORNERS) > 200_000:
            _CORNERS.clear()
        _CORNERS[memo] = (spec, _search(spec, case, where, params, key, corner))
    found = _CORNERS[memo][1]
    return None if found is None else dict(found)


# (id(spec), case, key, corner) -> (spec, corner params): the spec is held so that its id stays its own
_CORNERS: dict[tuple[Any, ...], tuple[OpSpec, dict[str, Any] | None]] = {}


def _search(spec: OpSpec, case: Mapping[str, Any], where: str, params: Mapping[str, Any], key: Key,
            corner: Corner) -> dict[str, Any] | None:
    """:func:`bucket_corner`'s search, uncached."""
    fields_ = list(spec.dispatch.key.values())
    names = plain_fields(spec)
    tries = [_ends(split_key_field(fields_[i])[1], key[i], corner, params.get(name)) for i, name in names.items()]
    compared = _compared(spec)
    # Each field's k-th value from a corner is its k-th step inward (a multiple of 2 ** (k - 1)
    # from ``low``): the fields stepped alike come first, as an alignment of K and V asks for
    # both, then every combination, fewest steps first.
    alike = [tuple(min(k, len(t) - 1) for t in tries) for k in range(max(map(len, tries), default=1))]
    rest = sorted(itertools.product(*(range(len(t)) for t in tries)), key=lambda c: (sum(c), c))
    for combo in dict.fromkeys(alike + rest):
        override = {name: tries[j][c] for j, (name, c) in enumerate(zip(names.values(), combo))}
        moved = case_params(spec, case, where, override)
        try:
            got = key_of(spec, moved)
        except ExprError:
            continue
        if all(got[i] == key[i] for i in compared) and failing_check(spec, moved) is None:
            return moved
    return None


def edge_params(spec: OpSpec, case: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The largest call of the bucket of ``case`` (:func:`bucket_corner`), which a row of the
    bucket serves too; the case's own params where no other call lands there."""
    return bucket_corner(spec, case, where, None, "high") or case_params(spec, case, where)


def low_params(spec: OpSpec, case: Mapping[str, Any], where: str, key: Key | None = None) -> dict[str, Any] | None:
    """The smallest call of the bucket of ``key`` (the case's own by default), None if the spec
    takes none there (:func:`bucket_corner`). A variant whose ``when`` is not monotone in a field
    (a descriptor grid's ``K % 8 == 0``) is illegal there whenever the key lets such a call in."""
    return bucket_corner(spec, case, where, key, "low")
