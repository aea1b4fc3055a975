"""``opgen host-time``: the host work one call of a generated op costs up to its kernels' launch.

Each case calls the op's public function (``generated.<op>.<op>``, the path production code
calls) on the case's inputs, over and over, in rounds of ``calls`` calls, and keeps the median
over the rounds of a round's mean. Two paths are timed: a call whose signature (shapes, dtypes,
devices, scalars) was seen before, which goes straight to the kernels its first call chose, and a
call of a signature not seen before (the op's signature cache emptied before each call): every
check, the table lookup and the default's formulas, with the table and the kernel modules already
loaded. One torch ``add_`` on a small tensor is timed in the same rounds, so the ratio to it
stands on any host.

The kernels' launch is a no-op by default (``launch="none"``): Triton's launch is replaced by a
counter for the measure (:func:`opgen.evidence.launches.intercepted`), so everything before it runs as it
would, the grid, the launch's arguments and ``kernel[grid]`` included, and nothing is compiled or
run; on any host, CPU tensors under the Triton interpreter included. The counter also gives the
launches one call makes. On a device, ``launch="real"`` times the real launch too (Triton's own
launcher: the time until the launch returns, not the kernel's); the device is synchronised before
each round, so the queue never fills. Not a test: the figures depend on the host. Uses
``launches``, ``worker``, ``compare`` (case ids), ``backends``.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..backends import Backend
from ..errors import UsageError
from ..run.worker import case_arguments
from ..spec.spec import OpSpec
from .compare import case_id
from .launches import intercepted

LAUNCHES = ("none", "real")
ADD_ELEMENTS = 16  # the add_ beside the ops: x.add_(y) on two float32 tensors of this many elements
WARMUP = 3  # untimed calls of each callable before its rounds (the first fills the signature cache)
# torch's intra-op threads under the interpreter: a call's small tensor ops (a tail's padding) cost
# their dispatch, as their launch would on a device, not the wake of a thread pool (a 16 x 16 tril
# took 15 ms with 2 threads on a busy 2-core host, 2 us with one).
INTERPRETER_THREADS = 1


@dataclass(frozen=True)
class HostResult:
    """One case: microseconds of host work per call, each path beside the add_ of its rounds."""

    op: str
    case: str
    launches: int  # kernel launches one call makes (counted with the launch a no-op)
    seen_us: float  # a signature seen before: straight to the kernels
    unseen_us: float  # a new signature: the checks, the table lookup, the default's formulas
    add_us: float  # one torch add_, timed in the same rounds

    @property
    def seen_ratio(self) -> float:
        return self.seen_us / self.add_us

    @property
    def unseen_ratio(self) -> float:
        return self.unseen_us / self.add_us


def per_call_us(fns: dict[str, Callable[[], object]], rounds: int, calls: int,
                synchronize: Callable[[], None]) -> dict[str, float]:
    """Median microseconds per call of each callable: ``rounds`` interleaved rounds of ``calls``
    back-to-back calls each, the device synchronised before each (the garbage collector off
    throughout, as ``timeit`` has it), the median over the rounds of a round's mean."""
    for fn in fns.values():
        for _ in range(WARMUP):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, fn in fns.items():
                synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples[name].append((time.perf_counter() - start) / calls * 1e6)
        synchronize()
    finally:
        if collecting:
            gc.enable()
    return {name: statistics.median(times) for name, times in samples.items()}


def _unseen(module: Any, call: Callable[[], object]) -> Callable[[], object]:
    """``call`` made as a call of a signature not seen before: the op's signature cache
    (``_SEEN`` of the generated module) emptied first."""
    cache = module._SEEN

    def unseen() -> object:
        cache.clear()
        return call()
    return unseen


def check_launch(backend: str, launch: str) -> None:
    """Refuse a ``launch`` that is none of :data:`LAUNCHES`, or ``"real"`` on the interpreter.

    Raises:
        UsageError: naming what it takes.
    """
    if launch not in LAUNCHES:
        raise UsageError(f"launch must be one of {', '.join(LAUNCHES)}, got {launch!r}")
    if launch == "real" and backend == "interpreter":
        raise UsageError("--launch real needs a device: the interpreter runs a launched kernel on the host")


def measure(spec: OpSpec, rows: list[dict[str, Any]], backend: Backend, launch: str = "none",
            rounds: int = 201, calls: int = 10, seed: int = 0) -> list[HostResult]:
    """The host work per call of ``spec``'s generated op on each case of ``rows``. Under the
    interpreter torch computes a call's own tensor work (the padding of a sequence tail) on the
    host; the caller sets its intra-op threads (:data:`INTERPRETER_THREADS`).

    Raises:
        UsageError: ``launch`` is not one of :data:`LAUNCHES`, or ``"real"`` under the
            interpreter (where the launch runs the kernel on the host).
    """
    import torch

    check_launch(backend.name, launch)
    module = importlib.import_module(f"generated.{spec.op}")
    op = getattr(module, spec.op)
    names = (*spec.signature.tensors, *spec.signature.scalars)
    x = torch.zeros(ADD_ELEMENTS, device=backend.device)
    y = torch.ones(ADD_ELEMENTS, device=backend.device)
    counted = [0]

    def count(kernel: Any, args: tuple, kwargs: dict) -> None:
        counted[0] += 1

    results = []
    for row in rows:
        _, inputs = case_arguments(spec, row, seed, backend.device)
        arguments = {name: inputs[name] for name in names}

        def call(arguments: dict[str, Any] = arguments) -> object:
            return op(**arguments)
        counted[0] = 0
        with intercepted(count):  # one call, its launches counted (and the signature cached)
            call()
        launches = counted[0]
        noop = intercepted(count) if launch == "none" else contextlib.nullcontext()
        with noop:
            times = per_call_us({"add_": lambda: x.add_(y), "seen": call, "unseen": _unseen(module, call)},
                                rounds, calls, backend.synchronize)
        results.append(HostResult(spec.op, case_id(row), launches, times["seen"], times["unseen"],
                                  times["add_"]))
    return results


def host_description(backend: Backend) -> dict[str, str]:
    """The host and toolchain the figures were measured on: CPU model and count, the backend's
    toolchain (torch, triton, device)."""
    import os
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cpus": str(os.cpu_count()), "python": platform.python_version(), **backend.toolchain()}


def table(results: list[HostResult]) -> str:
    """The results as a plain-text table, one case a row, each path's microseconds beside their
    ratio to the add_ of the same rounds."""
    head = ("op", "case", "launches", "seen us", "x add_", "unseen us", "x add_", "add_ us")
    rows = [(r.op, r.case, str(r.launches), f"{r.seen_us:.1f}", f"{r.seen_ratio:.1f}",
             f"{r.unseen_us:.1f}", f"{r.unseen_ratio:.1f}", f"{r.add_us:.2f}") for r in results]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths))).rstrip() for row in (head, *rows))
