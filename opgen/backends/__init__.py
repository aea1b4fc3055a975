"""Backends: where a point runs and how it is timed.

A backend is a small object with ``name``, ``device``, ``toolchain()``, ``cores()``, ``synchronize()``,
``timer()``, ``flush()`` and ``hold()``; :data:`BACKENDS` maps names to their classes, imported
lazily so the driver imports where no device stack is installed. Uses ``errors``.
"""
from __future__ import annotations

import importlib
import math
from typing import Protocol

from ..errors import UnsupportedInput


class Timer(Protocol):
    """Measures the device time of one callable call, in milliseconds."""

    def __call__(self, fn) -> float: ...


class Backend(Protocol):
    """What the tuner needs from a device."""

    name: str
    device: str

    def toolchain(self) -> dict[str, str]:
        """Versions that key the tuning records (triton, torch, driver stack)."""

    def cores(self) -> int | None:
        """Programs of a persistent grid on the device, from its driver (SMs, cube cores); None
        where the chip profile's count stands (the interpreter)."""

    def synchronize(self) -> None:
        """Wait for queued device work."""

    def timer(self) -> Timer:
        """A timer of device work (events on devices, the wall clock in the interpreter)."""

    def flush(self, dirty: bool = False) -> None:
        """Evict the last-level cache so a timed call reads its inputs from memory; ``dirty``
        leaves it full of written lines instead of clean ones."""

    def hold(self, dirty: bool = False, cover_s: float = 0.0) -> None:
        """Queue device work long enough to cover the host's launch overhead, at least ``cover_s``
        seconds of it, so a timer started next measures the device's work, not the host's
        (``dirty``: work that writes)."""


class EventBackend:
    """Timing shared by the device backends: device events, and an L2 flush that reads a buffer
    larger than any last-level cache of the chips profiled (Hopper 60 MB, Atlas A2 192 MB).

    The flush reads, it does not write: a write pass leaves the cache full of dirty lines whose
    write-back the timed call then pays (on an H200 a copy of a bench case's bytes ran at 0.91 of
    the memory floor after a zero-fill, 0.97 after a read, geomean of 10 cases;
    ``scripts/copy_floor.py``; the log ``benchmarks/logs/h200_gla_copy_floor_bench_fla_635d56f.txt``
    at c323277). With ``dirty=True`` the flush and the hold write instead (write-flush timing). ``hold`` passes
    over the buffer ``HOLD_PASSES`` times (about 0.2 ms on an H200, more on slower memory), or as
    many more as cover ``cover_s``: an op that launches several kernels can take longer than that
    to launch them (a mamba3_mimo_bwd_fwd call took 0.39 ms of host time on an H100), and a timer
    of such a call behind too short a hold measures the host.

    Subclasses name ``name`` and return their torch device module (``torch.cuda``, ``torch.npu``).
    """

    name = ""
    FLUSH_BYTES = 256 * 1024 * 1024
    HOLD_PASSES = 3

    def __init__(self, device: str) -> None:
        self.device = device
        self._flush_buffer = None
        self._flush_sink = None
        self._pass_time: float | None = None

    def _module(self):
        raise NotImplementedError

    def synchronize(self) -> None:
        self._module().synchronize(self.device)

    def _pass(self, write: bool) -> None:
        """One pass over the whole flush buffer: a sum into a one-element sink, or a fill."""
        import torch

        if self._flush_buffer is None:
            self._flush_buffer = torch.ones(self.FLUSH_BYTES // 4, dtype=torch.float32, device=self.device)
            self._flush_sink = torch.empty((), dtype=torch.float32, device=self.device)
        if write:
            self._flush_buffer.fill_(1.0)
        else:
            torch.sum(self._flush_buffer, dim=0, out=self._flush_sink)

    def flush(self, dirty: bool = False) -> None:
        self._pass(write=dirty)

    def hold(self, dirty: bool = False, cover_s: float = 0.0) -> None:
        passes = self.HOLD_PASSES
        if cover_s > 0.0:
            passes = max(passes, math.ceil(cover_s * 1e3 / self._pass_ms()))
        for _ in range(passes):
            self._pass(write=dirty)

    def _pass_ms(self) -> float:
        """Milliseconds of one pass over the flush buffer (the faster of two, timed once)."""
        if self._pass_time is None:
            self.synchronize()
            timer = self.timer()
            self._pass_time = min(timer(lambda: self._pass(write=False)) for _ in range(2))
        return self._pass_time

    def timer(self):
        events = self._module().Event

        def measure(fn) -> float:
            start, end = events(enable_timing=True), events(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        return measure


def require_device(backend: str, device: str, module, why: str = "") -> None:
    """Refuse ``device`` where this host has no such ``backend`` device (a tensor made on it would
    fail deep inside torch): not a device name, a device of another kind, an index past the
    devices found, or none at all (``why`` tells why there are none, where it is known).

    Raises:
        UnsupportedInput: naming the device and what this host has.
    """
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise UnsupportedInput(f"device {device!r} is not a torch device name ({exc})") from None
    if parsed.type != backend:
        raise UnsupportedInput(f"device {device!r} is not a {backend} device (backend {backend})")
    count = module.device_count() if module.is_available() else 0
    if (parsed.index or 0) >= count:
        raise UnsupportedInput(f"no {backend} device {device} on this host ({count} found{why})")


BACKENDS = {
    "cuda": "opgen.backends.cuda:CudaBackend",
    "npu": "opgen.backends.npu:NpuBackend",
    "interpreter": "opgen.backends.interpreter:InterpreterBackend",
}


def get_backend(name: str, device: str | None = None) -> Backend:
    """Instantiate the backend called ``name`` (optionally on ``device``).

    Raises:
        UnsupportedInput: for an unknown backend name.
    """
    if name not in BACKENDS:
        raise UnsupportedInput(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    module_name, cls_name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(device) if device else cls()
