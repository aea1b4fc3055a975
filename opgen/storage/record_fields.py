"""Field converters of the tuning records (``opgen.storage.records``): each checks a JSON (or
Python) value and returns its stored form, or raises a RecordError saying what was expected; the
on-chip ``Budget`` of a point; ``plain_value``, a stored value's JSON form. Uses ``errors``,
``expr``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import RecordError
from ..spec.expr import is_finite_number

__all__ = ["BUDGET_KINDS", "Budget", "Conv", "as_budget", "as_date", "as_int", "as_num", "as_scalar",
           "as_str", "check", "dict_of", "one_of", "optional", "plain_value", "tuple_of"]

BUDGET_KINDS = ("ub_bytes", "smem_bytes")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

Conv = Callable[[Any], Any]


def check(test: Callable[[Any], bool], expected: str, out: Conv = lambda v: v) -> Conv:
    """A converter: ``out(v)`` if ``test(v)``, else a RecordError saying what was expected."""
    def convert(v: Any) -> Any:
        if not test(v):
            raise RecordError(f"expected {expected}, got {v!r}")
        return out(v)
    return convert


def optional(conv: Conv) -> Conv:
    """``conv``, letting None through."""
    return lambda v: None if v is None else conv(v)


def one_of(*choices: str) -> Conv:
    """A converter that takes only the given strings."""
    return check(lambda v: v in choices, f"one of {list(choices)}")


def tuple_of(conv: Conv) -> Conv:
    """A list converted element by element into a tuple."""
    return check(lambda v: isinstance(v, (list, tuple)), "a list", lambda v: tuple(map(conv, v)))


def dict_of(conv: Conv) -> Conv:
    """An object with string keys, its values converted."""
    return check(lambda v: isinstance(v, Mapping) and all(isinstance(k, str) for k in v),
                  "an object with string keys", lambda v: {k: conv(x) for k, x in v.items()})


as_str = check(lambda v: isinstance(v, str), "a string")
as_int = check(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
as_num = check(is_finite_number, "a finite number", float)
as_scalar = check(lambda v: isinstance(v, (str, bool, int)) or is_finite_number(v),
                 "a string, boolean or finite number")
as_date = check(lambda v: isinstance(v, str) and bool(_DATE.match(v)), "a date YYYY-MM-DD")


@dataclass(frozen=True)
class Budget:
    """On-chip bytes of a point: the spec's estimate and, where the toolchain reports it, the real
    figure; on CUDA also the registers per thread and the spilled registers the compiler reports."""

    kind: str
    estimate: int
    reported: int | None = None
    regs: int | None = None
    spills: int | None = None

    def __post_init__(self) -> None:
        one_of(*BUDGET_KINDS)(self.kind)
        as_int(self.estimate)
        for v in (self.reported, self.regs, self.spills):
            optional(as_int)(v)

    def plain(self) -> dict[str, Any]:
        """The JSON form: the three budget keys always, regs and spills where known."""
        out = {"kind": self.kind, "estimate": self.estimate, "reported": self.reported}
        out.update({k: v for k, v in (("regs", self.regs), ("spills", self.spills)) if v is not None})
        return out


as_budget = check(
    lambda v: v is None or isinstance(v, Budget)
    or (isinstance(v, Mapping) and {"kind", "estimate", "reported"} <= set(v)
        <= {"kind", "estimate", "reported", "regs", "spills"}),
    "null or an object with keys estimate, kind, reported (and optionally regs, spills)",
    lambda v: v if v is None or isinstance(v, Budget) else Budget(**v))


def plain_value(v: Any) -> Any:
    """The JSON form of a stored field value."""
    if isinstance(v, Budget):
        return v.plain()
    if isinstance(v, (list, tuple)):
        return [plain_value(x) for x in v]
    if isinstance(v, Mapping):
        return {k: plain_value(x) for k, x in v.items()}
    return v
