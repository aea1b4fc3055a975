"""NVIDIA GPUs through upstream Triton: CUDA-event timing with an L2 flush before each call."""
from __future__ import annotations

import torch

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any Hopper L2 (60 MB on H200), as triton.testing


class CudaBackend:
    """Times device work with CUDA events; flushes L2 by zeroing a 256 MB buffer."""

    name = "cuda"

    def __init__(self, device: str = "cuda:0") -> None:
        self.device = device
        self._flush_buffer: torch.Tensor | None = None

    def toolchain(self) -> dict[str, str]:
        import triton

        return {"triton": triton.__version__, "torch": torch.__version__.split("+")[0],
                "cuda": str(torch.version.cuda), "device": torch.cuda.get_device_name(self.device)}

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def flush(self) -> None:
        if self._flush_buffer is None:
            self._flush_buffer = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)
        self._flush_buffer.zero_()

    def timer(self):
        def measure(fn) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        return measure
