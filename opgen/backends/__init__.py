"""Backends: where a point runs and how it is timed.

A backend is a small object with ``name``, ``device``, ``toolchain()``, ``synchronize()``,
``timer()`` and ``flush()``; :data:`BACKENDS` maps names to their classes, imported lazily so
the driver imports where no device stack is installed. Uses ``errors``.
"""
from __future__ import annotations

import importlib
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

    def synchronize(self) -> None:
        """Wait for queued device work."""

    def timer(self) -> Timer:
        """A timer of device work (events on devices, the wall clock in the interpreter)."""

    def flush(self) -> None:
        """Evict the last-level cache so a timed call reads its inputs from memory."""


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
