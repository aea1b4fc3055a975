"""Ascend NPUs through torch_npu and triton-ascend: NPU-event timing, L2 flush.

Written against torch_npu's documented API (``torch.npu.Event``, ``torch.npu.synchronize``);
never run on an NPU by this project so far (no NPU is reachable from its machines).
"""
from __future__ import annotations

import torch

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # Atlas A2 L2 is 192 MB; flush with more


class NpuBackend:
    """Times device work with NPU events; core count comes from triton-ascend's driver."""

    name = "npu"

    def __init__(self, device: str = "npu:0") -> None:
        import torch_npu  # noqa: F401  (registers torch.npu)

        self.device = device
        self._flush_buffer: torch.Tensor | None = None

    def toolchain(self) -> dict[str, str]:
        import torch_npu
        import triton

        return {"triton": triton.__version__, "torch": torch.__version__.split("+")[0],
                "torch_npu": torch_npu.__version__, "device": torch.npu.get_device_name(self.device)}

    def synchronize(self) -> None:
        torch.npu.synchronize(self.device)

    def flush(self) -> None:
        if self._flush_buffer is None:
            self._flush_buffer = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)
        self._flush_buffer.zero_()

    def timer(self):
        def measure(fn) -> float:
            start = torch.npu.Event(enable_timing=True)
            end = torch.npu.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        return measure

    def cores(self) -> int:
        """Cube cores of the device, from the driver (a dot kernel launches this many)."""
        import triton

        index = torch.device(self.device).index or 0
        return triton.runtime.driver.active.utils.get_device_properties(index)["num_aicore"]
