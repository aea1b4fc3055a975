"""The branches of a rendered default function (``_default_<backend>`` of the generated API) that
can change a value: a branch on an option its axis never takes, and an assignment that gives a
tunable the value it holds already, are not rendered.

An axis's formula takes only its constants where it is a constant or a conditional expression of
them (``'a' if K > 64 else 'b'``); any other formula may take any option. An assignment in the
branch on ``axis == option`` does nothing when no earlier branch changed the tunable or a name its
value reads, and its source is the tunable's default with ``axis`` (and every axis of one possible
value) put in and folded: comparisons, ``not``, ``and``/``or`` and conditional expressions of
constants evaluated (``True`` is not ``1``: constants compare by type and value).
Uses nothing from opgen.
"""
from __future__ import annotations

import ast
from typing import Any

Branch = tuple[str, str, list[tuple[str, str]]]
"""(axis, option, [(tunable, source)]): ``if axis == option:`` and its assignments."""

_FOLDABLE = (ast.Constant, ast.Tuple, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.IfExp,
             ast.expr_context, ast.cmpop, ast.boolop, ast.Not, ast.And, ast.Or)


def possible(source: str) -> set[Any] | None:
    """The values the axis formula ``source`` can take, or None where any may be taken."""
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    return _values(node)


def _values(node: ast.expr) -> set[Any] | None:
    if isinstance(node, ast.Constant):
        return {node.value}
    if isinstance(node, ast.IfExp):
        body, orelse = _values(node.body), _values(node.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def may_hold(axis_source: str, option: str) -> bool:
    """Whether the default's axis, computed by ``axis_source``, can take ``option``."""
    values = possible(axis_source)
    return values is None or option in values


def live_branches(fixed: list[Branch], tunables: dict[str, str], axes: dict[str, str]) -> list[Branch]:
    """``fixed`` less its branches on options their axes never take (``axes``: axis -> formula),
    less the assignments that give a tunable the value it holds there (``tunables``: the default
    formulas), less the branches left empty."""
    known = {}
    for axis, source in axes.items():
        values = possible(source)
        if values is not None and len(values) == 1:
            known[axis] = next(iter(values))
    changed: set[str] = set()
    out = []
    for axis, option, assignments in fixed:
        if axis in axes and not may_hold(axes[axis], option):
            continue
        here = {**known, axis: option}
        kept = [(name, source) for name, source in assignments
                if name in changed or name not in tunables or _reads(source) & changed
                or not _same(_fold(tunables[name], here), source)]
        changed |= {name for name, _ in kept}
        if kept:
            out.append((axis, option, kept))
    return out


def _reads(source: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(source, mode="eval")) if isinstance(n, ast.Name)}


def _same(node: ast.expr, source: str) -> bool:
    """Whether ``node`` and ``source`` are the same expression (constants of the same type)."""
    other = ast.parse(source, mode="eval").body
    return _typed_dump(node) == _typed_dump(other)


def _typed_dump(node: ast.expr) -> str:
    """``ast.dump`` with each constant's type named (``True`` is not ``1``, ``1.0`` not ``1``)."""
    return ast.dump(node) + repr([type(n.value).__name__ for n in ast.walk(node) if isinstance(n, ast.Constant)])


def _fold(source: str, known: dict[str, Any]) -> ast.expr:
    """``source`` with the names of ``known`` put in as constants and its constant parts folded."""
    return _Folder(known).visit(ast.parse(source, mode="eval").body)


class _Folder(ast.NodeTransformer):
    """Puts in known names and evaluates the comparisons, ``not``, ``and``/``or`` and conditional
    expressions whose operands are constants."""

    def __init__(self, known: dict[str, Any]) -> None:
        self.known = known

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return ast.Constant(self.known[node.id]) if node.id in self.known else node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Constant):
            return node.body if node.test.value else node.orelse
        if isinstance(node, ast.BoolOp):
            return _fold_boolop(node)
        if isinstance(node, (ast.Compare, ast.UnaryOp)) and all(isinstance(n, _FOLDABLE) for n in ast.walk(node)):
            if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
                return node
            try:
                code = compile(ast.fix_missing_locations(ast.Expression(node)), "<default>", "eval")
                value = eval(code, {"__builtins__": {}})  # noqa: S307
            except TypeError:  # constants that do not compare ('a' < 1): left as they are
                return node
            return ast.Constant(value)
        return node


def _fold_boolop(node: ast.BoolOp) -> ast.expr:
    """``and``/``or`` with its leading constant operands decided: one that ends the chain (falsy
    for ``and``, truthy for ``or``) is the value; one that does not is dropped."""
    values = list(node.values)
    ends = (lambda v: not v) if isinstance(node.op, ast.And) else bool
    while values and isinstance(values[0], ast.Constant):
        if ends(values[0].value) or len(values) == 1:
            return values[0]
        values.pop(0)
    return values[0] if len(values) == 1 else ast.BoolOp(node.op, values)
