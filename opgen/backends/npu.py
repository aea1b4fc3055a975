"""Ascend NPUs through torch_npu and triton-ascend: NPU-event timing, L2 flush.

Written against torch_npu's documented API (``torch.npu.Event``, ``torch.npu.synchronize``);
not yet run on an NPU: its tests run on CPU only.
"""
from __future__ import annotations

import torch

from ..errors import UnsupportedInput
from . import EventBackend, require_device


class NpuBackend(EventBackend):
    """Times device work with NPU events; core count comes from triton-ascend's driver."""

    name = "npu"

    def __init__(self, device: str = "npu:0") -> None:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError as exc:
            raise UnsupportedInput(f"backend npu needs torch_npu, which this Python cannot import ({exc})") from None
        require_device("npu", device, torch.npu)  # type: ignore[attr-defined]
        super().__init__(device)

    def _module(self):
        return torch.npu  # type: ignore[attr-defined]

    def toolchain(self) -> dict[str, str]:
        import torch_npu
        import triton

        return {"triton": triton.__version__, "torch": torch.__version__.split("+")[0],
                "torch_npu": torch_npu.__version__, "device": torch.npu.get_device_name(self.device)}

    def cores(self) -> int:
        """Cube cores of the device, from the driver (a dot kernel launches this many)."""
        import triton

        index = torch.device(self.device).index or 0
        return triton.runtime.driver.active.utils.get_device_properties(index)["num_aicore"]
