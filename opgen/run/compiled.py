"""What the compiler made of a launch: the compiled kernels a variant's ``launch`` ran
(:func:`kept_kernels`) and the on-chip usage they report (:func:`reported`), which the tuner
records with every trial (``budget.reported``, ``regs``, ``spills``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["kept_kernels", "reported"]


def reported(kernels: list[Any]) -> dict[str, int]:
    """Real on-chip usage of a point where the compiler reports it: the largest shared memory, UB
    bits, registers a thread and spill bytes over the compiled kernels its launch ran."""
    out: dict[str, int] = {}
    for compiled in kernels:
        meta = getattr(compiled, "metadata", None)
        for name, source in (("shared", meta), ("required_ub_bits", meta), ("n_regs", compiled),
                             ("n_spills", compiled)):
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int):
                out[name] = max(out.get(name, value), value)
    return out


@contextmanager
def kept_kernels() -> Iterator[list[Any]]:
    """While open, the compiled kernel of each JIT launch (what ``JITFunction.run`` returns) is
    appended to the yielded list; the launches run as they would. A launch of several kernels
    returns at most one of them itself."""
    from triton.runtime.jit import JITFunction

    run = JITFunction.run
    kept: list[Any] = []

    def run_and_keep(self: Any, *args: Any, **kwargs: Any) -> Any:
        compiled = run(self, *args, **kwargs)
        kept.append(compiled)
        return compiled

    JITFunction.run = run_and_keep  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        JITFunction.run = run  # type: ignore[method-assign]
