"""NVIDIA GPUs through upstream Triton: CUDA-event timing with an L2 flush before each call."""
from __future__ import annotations

import torch

from . import EventBackend, require_device


class CudaBackend(EventBackend):
    """Times device work with CUDA events; the SM count comes from torch."""

    name = "cuda"

    def __init__(self, device: str = "cuda:0") -> None:
        require_device("cuda", device, torch.cuda, "" if torch.version.cuda else "; this torch is built without CUDA")
        super().__init__(device)

    def _module(self):
        return torch.cuda

    def toolchain(self) -> dict[str, str]:
        import triton

        return {"triton": triton.__version__, "torch": torch.__version__.split("+")[0],
                "cuda": str(torch.version.cuda), "device": torch.cuda.get_device_name(self.device)}

    def cores(self) -> int:
        """Streaming multiprocessors of the device, as torch reports them."""
        return torch.cuda.get_device_properties(self.device).multi_processor_count
