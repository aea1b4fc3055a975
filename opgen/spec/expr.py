"""Safe formulas: constraints, budgets, defaults and dispatch keys are data, whitelisted trees.

A formula is parsed with :mod:`ast` and checked against a whitelist: literals, names, tuples,
arithmetic (``+ - * / // % **``), comparisons (including ``in``), ``and``/``or``/``not``, the
conditional expression and calls of the functions in :data:`FUNCTIONS`. Attribute access,
subscripts, lambdas, comprehensions and any other call are refused at parse time. The source is
never given to ``eval``: a parsed formula evaluates as its checked tree, compiled with
:func:`compile` and run by ``eval`` with no builtins and the whitelisted functions and bounded
operators alone in its globals, and renders back to Python source for the generated dispatch code.
Both bound what an evaluation builds (integers of at most :data:`MAX_BITS` bits, strings and tuples
of at most :data:`MAX_ITEMS` items, no ``%`` formatting), refusing a value before it is built. One
transformer (:class:`_Bounded`) routes the bounded operators for both. Imports only
:mod:`opgen.errors`.
"""
from __future__ import annotations

import ast
import copy
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import ExprError


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


# What one evaluation may build, checked as each value is built (so no formula exhausts time or
# memory): an integer of at most MAX_BITS bits, a string or tuple of at most MAX_ITEMS items (the
# strings and tuples inside a tuple counted too). The helpers repeat the figures as literals: their
# source is rendered into generated modules, which cannot import opgen.
MAX_BITS = 4096
MAX_ITEMS = 4096


def bounded(x):
    """x, if a formula may build it: an integer of at most 4096 bits, a string or tuple of at most
    4096 items (those of the strings and tuples inside a tuple counted); else a ValueError."""
    if isinstance(x, int):
        if x.bit_length() > 4096:
            raise ValueError(f"an integer of {x.bit_length()} bits (at most 4096)")
    elif isinstance(x, (str, tuple)):
        items, parts = 0, [x]
        while parts:
            part = parts.pop()
            items += len(part)
            if items > 4096:
                raise ValueError("a string of more than 4096 characters" if isinstance(x, str)
                                 else "a tuple of more than 4096 items (nested ones counted)")
            if isinstance(part, tuple):
                parts.extend(p for p in part if isinstance(p, (str, tuple)))
    return x


def bounded_pow(a, b):
    """a ** b with the exponent at most 64 in size and an integer result of at most 4096 bits,
    refused before it is computed."""
    if abs(b) > 64:
        raise ValueError(f"exponent {b} exceeds 64")
    if isinstance(a, int) and isinstance(b, int) and (a.bit_length() - 1) * b > 4096:
        raise ValueError(f"an integer of more than {(a.bit_length() - 1) * b} bits (at most 4096)")
    return bounded(a ** b)


def bounded_mul(a, b):
    """a * b with an integer product of at most 4096 bits, a string or tuple repeated at most 4096
    times into at most 4096 items, refused before it is built."""
    if isinstance(a, int) and isinstance(b, int):  # the product has bits or bits - 1 bits
        bits = a.bit_length() + b.bit_length()
        if bits > 4097:
            raise ValueError(f"an integer of at least {bits - 1} bits (at most 4096)")
        return a * b if bits <= 4096 else bounded(a * b)
    seq, count = (b, a) if isinstance(b, (str, tuple)) else (a, b)
    if isinstance(seq, (str, tuple)) and isinstance(count, int):
        if count > 4096:
            raise ValueError("a sequence repeated more than 4096 times")
        if len(seq) * count > 4096:
            raise ValueError(f"a string of {len(seq) * count} characters (at most 4096)" if isinstance(seq, str)
                             else f"a tuple of {len(seq) * count} items (at most 4096)")
        return bounded(seq * count)
    return a * b


def bounded_add(a, b):
    """a + b with a joined string or tuple of at most 4096 items."""
    c = a + b
    return bounded(c) if isinstance(c, (str, tuple)) else c


def bounded_mod(a, b):
    """a % b of numbers: % formatting of a string is refused (its widths can fill memory)."""
    if isinstance(a, str):
        raise ValueError("% formatting of a string is not allowed in a formula")
    return a % b


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min, "max": max, "abs": abs, "cdiv": cdiv, "pow2": pow2, "log2": log2,
}
# Operators the evaluator runs through a bounded helper. Generated code calls them too, except
# where the operands are numbers (``to_python``'s ``numbers``): a product or sum of numbers grows
# with the formula's length alone, while ``**`` always goes through its helper.
_BOUNDED: dict[type, Callable[[Any, Any], Any]] = {
    ast.Pow: bounded_pow, ast.Mult: bounded_mul, ast.Add: bounded_add, ast.Mod: bounded_mod}
_HELPERS: dict[str, Callable[..., Any]] = {**FUNCTIONS, "bounded": bounded,
                                           **{f.__name__: f for f in _BOUNDED.values()}}
_MAX_SOURCE = 4000  # characters of one formula
_MAX_DEPTH = 64  # nesting of its syntax tree

_BUILTINS = ("min", "max", "abs")  # generated modules call these without a definition

# The operators a formula may use; each evaluates as Python's own (``*``, ``+``, ``%`` and ``**``
# through the bounded helpers above).
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

    def to_python(self, numbers: frozenset[str] | set[str] = frozenset()) -> str:
        """Python source of the formula (for generated code): helpers keep their names, ``**``
        calls the bounded helper the evaluator uses, and so do ``*``, ``+`` and ``%`` wherever an
        operand may be a string or tuple. ``numbers`` are the names whose values are numbers or
        booleans in the generated code (dims, numeric scalars, params of numbers)."""
        return ast.unparse(_Bounded(numbers).visit(copy.deepcopy(self._tree.body)))

    def python_calls(self, numbers: frozenset[str] | set[str] = frozenset()) -> frozenset[str]:
        """The functions :meth:`to_python` with these ``numbers`` calls: the whitelisted ones and
        the bounded helpers."""
        bounded = _Bounded(numbers)
        bounded.visit(copy.deepcopy(self._tree.body))
        return frozenset(self.calls) | bounded.used

    def is_number(self, numbers: frozenset[str] | set[str]) -> bool:
        """Whether the formula's value is never a string or tuple where ``numbers`` hold numbers
        or booleans (a number, a boolean, None, or an error)."""
        return _is_number(self._tree.body, numbers)


def _is_number(node: ast.AST, numbers: frozenset[str] | set[str]) -> bool:
    """Whether a checked subtree never gives a string or tuple, where ``numbers`` name numbers
    (an operation on a sequence that cannot give one raises instead)."""
    if isinstance(node, ast.Constant):
        return not isinstance(node.value, str)
    if isinstance(node, ast.Name):
        return node.id in numbers
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Add, ast.Mult)):  # str + str, str * int
            return _is_number(node.left, numbers) and _is_number(node.right, numbers)
        if isinstance(node.op, ast.Mod):  # str % x formats
            return _is_number(node.left, numbers)
        return True  # -, /, //, ** of a sequence raise
    if isinstance(node, (ast.UnaryOp, ast.Compare)):
        return True
    if isinstance(node, ast.BoolOp):  # gives one of its operands
        return all(_is_number(v, numbers) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _is_number(node.body, numbers) and _is_number(node.orelse, numbers)
    if isinstance(node, ast.Call):  # min, max of one sequence give an item of it
        return node.func.id not in ("min", "max") or all(_is_number(a, numbers) for a in node.args)  # type: ignore[union-attr]
    return False  # a tuple or list


class _Bounded(ast.NodeTransformer):
    """Replaces the bounded operators by calls of their helpers, named with ``prefix``,
    collecting the helpers it calls in ``used``. With ``numbers`` (generated code), ``**`` always
    and the others where an operand may be a string or tuple; with None (evaluation), all."""

    def __init__(self, numbers: frozenset[str] | set[str] | None, prefix: str = "") -> None:
        self.numbers, self.prefix, self.used = numbers, prefix, set()

    def _wraps(self, node: ast.BinOp) -> bool:
        op = type(node.op)
        if op not in _BOUNDED:
            return False
        if self.numbers is None or op is ast.Pow:
            return True
        if op is ast.Mod:
            return not _is_number(node.left, self.numbers)
        return not (_is_number(node.left, self.numbers) and _is_number(node.right, self.numbers))

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        wrap = self._wraps(node)  # before the operands turn into helper calls
        self.generic_visit(node)
        if not wrap:
            return node
        name = _BOUNDED[type(node.op)].__name__
        self.used |= {name, "bounded"}
        return ast.Call(ast.Name(self.prefix + name, ast.Load()), [node.left, node.right], [])


# The compiled formulas' globals: the whitelisted functions and bounded operators under a prefix
# (a name of ``env`` never shadows them), and no builtins.
_PREFIX = "_opgen_"
_GLOBALS: dict[str, Any] = {"__builtins__": {}, **{_PREFIX + k: f for k, f in FUNCTIONS.items()},
                            **{_PREFIX + f.__name__: f for f in _BOUNDED.values()}}


class _Compiled(_Bounded):
    """The checked tree as :func:`compile` runs it: calls and every bounded operator go to the
    prefixed helpers, lists become tuples."""

    def __init__(self) -> None:
        super().__init__(None, _PREFIX)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.func = ast.Name(_PREFIX + node.func.id, ast.Load())  # type: ignore[union-attr]
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
    return Expr(source, tuple(sorted(names)), tuple(sorted(calls)), tree, _compiled(tree, source))


def python_helpers(calls: set[str] | frozenset[str]) -> str:
    """Source defining the helper functions that rendered formulas call (sorted, stable), with
    ``bounded``, which the bounded helpers call: the source of the very functions formulas
    evaluate with, so the two never drift apart."""
    if any(name.startswith("bounded_") for name in calls):
        calls = {*calls, "bounded"}
    return "\n\n".join(inspect.getsource(_HELPERS[name])
                       for name in sorted(calls) if name not in _BUILTINS)


def is_finite_number(x: object) -> bool:
    """True for an int or float (not bool) that is finite (an int a float cannot hold is not)."""
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:  # an int past float's range
        return False
