"""What the compiler made of a launch: the compiled kernels a variant's ``launch`` ran
(:func:`kept_kernels`) and the on-chip usage they report (:func:`reported`), which the tuner
records with every trial (``budget.reported``, ``regs``, ``spills``). :func:`swapped` replaces a
method of Triton's for the span of a block (here ``JITFunction.run``; ``opgen.evidence.launches``
swaps the launch for a record of it).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["kept_kernels", "reported", "swapped"]


@contextmanager
def swapped(owner: type, name: str, replacement: Callable[[Callable[..., Any]], Callable[..., Any]]
            ) -> Iterator[None]:
    """While open, ``owner.name`` is ``replacement(the method it replaces)``; restored on leaving,
    whatever happens inside."""
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


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

    kept: list[Any] = []

    def keeping(run: Callable[..., Any]) -> Callable[..., Any]:
        def run_and_keep(self: Any, *args: Any, **kwargs: Any) -> Any:
            compiled = run(self, *args, **kwargs)
            kept.append(compiled)
            return compiled
        return run_and_keep

    with swapped(JITFunction, "run", keeping):
        yield kept
