"""Safe formulas: constraints, budgets, defaults and dispatch keys are data, never ``eval``.

A formula is parsed with :mod:`ast` and checked against a whitelist: literals, names, tuples,
arithmetic (``+ - * / // % **``), comparisons (including ``in``), ``and``/``or``/``not``, the
conditional expression and calls of the functions in :data:`FUNCTIONS`. Attribute access,
subscripts, lambdas, comprehensions and any other call are refused at parse time. A parsed
formula evaluates as the checked tree compiled, with no builtins and the whitelisted functions
alone in its globals, and renders back to Python source for the generated dispatch code.
Imports only :mod:`opgen.errors`.
"""
from __future__ import annotations

import ast
import copy
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import ExprError


# The helpers below are also rendered, from this source, into generated modules (which cannot
# import opgen): they use plain Python only.
def cdiv(a, b):
    """Ceiling division of integers."""
    return -(-a // b)


def pow2(x):
    """The smallest power of two that is >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def log2(x):
    """Integer base-2 logarithm, rounded down; x must be positive."""
    if x <= 0:
        raise ValueError(f"log2 of non-positive {x}")
    return int(x).bit_length() - 1


def bounded_pow(a, b):
    """a ** b with the exponent at most 64 in size (a formula cannot build a huge number)."""
    if abs(b) > 64:
        raise ValueError(f"exponent {b} exceeds 64")
    return a ** b


def bounded_mul(a, b):
    """a * b with a string or tuple repeated at most 4096 times (a formula cannot fill memory)."""
    if (isinstance(a, (str, tuple)) and isinstance(b, int) and b > 4096) or \
            (isinstance(b, (str, tuple)) and isinstance(a, int) and a > 4096):
        raise ValueError("a sequence repeated more than 4096 times")
    return a * b


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min, "max": max, "abs": abs, "cdiv": cdiv, "pow2": pow2, "log2": log2,
}
# Operators the evaluator runs through a bounded helper; generated code calls bounded_pow too
# (a sequence repeated by a formula of tensor sizes is opgen's evaluation only).
_BOUNDED: dict[type, Callable[[Any, Any], Any]] = {ast.Pow: bounded_pow, ast.Mult: bounded_mul}
_GENERATED_BOUNDED: dict[type, str] = {ast.Pow: "bounded_pow"}
_HELPERS: dict[str, Callable[..., Any]] = {**FUNCTIONS, "bounded_pow": bounded_pow}
_MAX_SOURCE = 4000  # characters of one formula
_MAX_DEPTH = 64  # nesting of its syntax tree

_BUILTINS = ("min", "max", "abs")  # generated modules call these without a definition

# The operators a formula may use; each evaluates as Python's own (``*`` and ``**`` through the
# bounded helpers above).
_BINOPS = frozenset({ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow})
_CMPOPS = frozenset({ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn})
_UNARY = frozenset({ast.USub, ast.UAdd, ast.Not})


def _depth(node: ast.AST) -> int:
    """Nesting depth of a syntax tree, without recursion (a deep tree cannot overflow the stack)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(current))
    return deepest


def _check(node: ast.AST, source: str, names: set[str], calls: set[str]) -> None:
    """Refuse any node outside the whitelist; collect free names and called functions."""
    if isinstance(node, ast.Expression):
        _check(node.body, source, names, calls)
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, bool, str)) and node.value is not None:
            raise ExprError(source, f"constant {node.value!r} is not allowed")
    elif isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise ExprError(source, f"function {node.id!r} must be called, not used as a value")
        names.add(node.id)
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            _check(elt, source, names, calls)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        _check(node.left, source, names, calls)
        _check(node.right, source, names, calls)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check(node.operand, source, names, calls)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, source, names, calls)
    elif isinstance(node, ast.Compare) and all(type(op) in _CMPOPS for op in node.ops):
        for sub in (node.left, *node.comparators):
            _check(sub, source, names, calls)
    elif isinstance(node, ast.IfExp):
        for sub in (node.test, node.body, node.orelse):
            _check(sub, source, names, calls)
    elif isinstance(node, ast.Call):
        func = node.func
        if not isinstance(func, ast.Name) or func.id not in FUNCTIONS:
            shown = ast.unparse(func)
            raise ExprError(source, f"call of {shown!r} is not allowed "
                                    f"(allowed: {', '.join(sorted(FUNCTIONS))})")
        if node.keywords:
            raise ExprError(source, f"keyword arguments to {func.id!r} are not allowed")
        calls.add(func.id)
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise ExprError(source, "starred arguments are not allowed")
            _check(arg, source, names, calls)
    elif isinstance(node, ast.Attribute):
        raise ExprError(source, f"attribute access {ast.unparse(node)!r} is not allowed")
    elif isinstance(node, ast.Subscript):
        raise ExprError(source, f"subscript {ast.unparse(node)!r} is not allowed")
    else:
        raise ExprError(source, f"{type(node).__name__} is not allowed in a formula")


@dataclass(frozen=True)
class Expr:
    """A parsed, whitelisted formula.

    Attributes:
        source: the formula as written.
        names: free names it reads (sorted).
        calls: whitelisted functions it calls (sorted).
    """

    source: str
    names: tuple[str, ...]
    calls: tuple[str, ...]
    _tree: ast.Expression = field(repr=False, compare=False)
    _code: Any = field(default=None, repr=False, compare=False)

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate against ``env``; an unknown name or a failing operation is an ExprError."""
        try:
            return eval(self._code, _GLOBALS, env)  # noqa: S307 - the checked tree of :func:`_compiled`
        except NameError as exc:
            raise ExprError(self.source, f"unknown name {exc.name!r} (known: {', '.join(sorted(env))})") from None
        except (ArithmeticError, TypeError, ValueError, RecursionError, MemoryError) as exc:
            raise ExprError(self.source, f"{type(exc).__name__}: {exc}") from None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its source (a code object does not pickle): parsed again on loading."""
        return parse, (self.source,)

    def to_python(self) -> str:
        """Python source of the formula (for generated code); helpers keep their names, and
        ``**`` calls the bounded helper the evaluator uses."""
        return ast.unparse(_Bounded().visit(copy.deepcopy(self._tree.body)))


class _Bounded(ast.NodeTransformer):
    """Replaces the bounded operators by calls of their helpers."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if type(node.op) in _GENERATED_BOUNDED:
            name = _GENERATED_BOUNDED[type(node.op)]
            return ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], [])
        return node


# The compiled formulas' globals: the whitelisted functions and bounded operators under a prefix
# (a name of ``env`` never shadows them), and no builtins.
_PREFIX = "_opgen_"
_GLOBALS: dict[str, Any] = {"__builtins__": {}, **{_PREFIX + k: f for k, f in FUNCTIONS.items()},
                            **{_PREFIX + f.__name__: f for f in _BOUNDED.values()}}


class _Compiled(ast.NodeTransformer):
    """The checked tree as :func:`compile` runs it: calls and bounded operators go to the
    prefixed helpers, lists become tuples."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.func = ast.Name(_PREFIX + node.func.id, ast.Load())  # type: ignore[union-attr]
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if type(node.op) in _BOUNDED:
            name = _PREFIX + _BOUNDED[type(node.op)].__name__
            return ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], [])
        return node

    def visit_List(self, node: ast.List) -> ast.AST:
        self.generic_visit(node)
        return ast.Tuple(node.elts, ast.Load())


def _compiled(tree: ast.Expression, source: str) -> Any:
    """The code object of a checked tree (:class:`_Compiled`)."""
    body = _Compiled().visit(copy.deepcopy(tree))
    return compile(ast.fix_missing_locations(body), f"<formula {source[:60]!r}>", "eval")


def parse(source: str | int | float | bool) -> Expr:
    """Parse and check a formula; numbers and booleans are accepted as constant formulas.

    Raises:
        ExprError: on a syntax error or any construct outside the whitelist.
    """
    if isinstance(source, (bool, int, float)):
        source = repr(source)
    if not isinstance(source, str):
        raise ExprError(repr(source), "a formula must be a string or a number")
    if len(source) > _MAX_SOURCE:
        raise ExprError(source[:60] + "...", f"a formula of {len(source)} characters (at most {_MAX_SOURCE})")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(source, f"syntax error: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ExprError(source[:60] + "...", "nested too deeply to parse") from None
    if _depth(tree) > _MAX_DEPTH:
        raise ExprError(source[:60] + "...", f"nested more than {_MAX_DEPTH} levels deep")
    names: set[str] = set()
    calls: set[str] = set()
    _check(tree, source, names, calls)
    calls |= {_GENERATED_BOUNDED[type(n.op)] for n in ast.walk(tree)
              if isinstance(n, ast.BinOp) and type(n.op) in _GENERATED_BOUNDED}
    return Expr(source, tuple(sorted(names)), tuple(sorted(calls)), tree, _compiled(tree, source))


def python_helpers(calls: set[str] | frozenset[str]) -> str:
    """Source defining the helper functions that rendered formulas call (sorted, stable): the
    source of the very functions formulas evaluate with, so the two never drift apart."""
    return "\n\n".join(inspect.getsource(_HELPERS[name])
                       for name in sorted(calls) if name not in _BUILTINS)


def is_finite_number(x: object) -> bool:
    """True for an int or float (not bool) that is finite."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
