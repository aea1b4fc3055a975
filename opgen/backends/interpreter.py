"""The Triton CPU interpreter: numerics only; its timer is the wall clock (for driver tests)."""
from __future__ import annotations

import time


class InterpreterBackend:
    """Runs kernels on CPU tensors under ``TRITON_INTERPRET=1``; timings mean nothing."""

    name = "interpreter"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def cores(self) -> None:
        """The interpreter has no cores to count: the chip profile's ``programs`` stand."""
        return None

    def toolchain(self) -> dict[str, str]:
        """Read without importing torch (the tuner's own process never needs it here)."""
        from importlib.metadata import version

        import triton

        return {"triton": triton.__version__, "torch": version("torch").split("+")[0], "device": "cpu"}

    def synchronize(self) -> None:
        return None

    def flush(self, dirty: bool = False) -> None:
        return None

    def hold(self, dirty: bool = False, cover_s: float = 0.0) -> None:
        return None

    def timer(self):
        def measure(fn) -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return measure
