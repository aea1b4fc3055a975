"""The npu kernel of mamba3_mimo_bwd_bwd is accepted by the Ascend front end (TTIR -> Linalg)."""
import importlib

import pytest
import torch

from opgen.evidence.frontend import ascend_frontend
from opgen.references.mamba3_mimo_bwd_bwd import OUTPUTS, golden, make_inputs


@pytest.mark.parametrize("dtype, has_z, has_d, R", [(torch.bfloat16, True, True, 4), (torch.float16, False, False, 1)],
                         ids=["bf16-Z-D-R4", "fp16-noZ-noD-R1"])
def test_npu_kernel_accepted_by_ascend_front_end(dtype, has_z, has_d, R):
    module = importlib.import_module("generated.mamba3_mimo_bwd_bwd.kernels.npu.serial")
    x = make_inputs(2, 40, 4, 2, 32, 32, R, chunk_size=8, dtype=dtype, has_z=has_z, has_d=has_d, seed=0)
    gold = golden(**x)
    outs = {n: torch.empty(gold[n].shape) if gold[n] is not None else None for n in OUTPUTS}
    calls = module.kernel_calls(**x, **outs, num_programs=20, point={"multibuffer": True})
    assert len(calls) == 1
    for kernel, _grid, kwargs, options in calls:
        assert options == {"multibuffer": True}
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{result.stage}: {result.message[:2000]}"


@pytest.mark.parametrize("dtype, has_z, has_d, R, point", [
    (torch.bfloat16, True, True, 4, {"BLOCK_N": 16, "BLOCK_P": 16, "DS_BLOCK_N": 16, "DS_BLOCK_P": 16}),
    (torch.float16, False, False, 1, {"BLOCK_N": 32, "BLOCK_P": 32, "DS_BLOCK_N": 32, "DS_BLOCK_P": 32})],
    ids=["bf16-Z-D-R4-tiles16", "fp16-noZ-noD-R1-whole"])
def test_npu_blocked_kernels_accepted_by_ascend_front_end(dtype, has_z, has_d, R, point):
    module = importlib.import_module("generated.mamba3_mimo_bwd_bwd.kernels.npu.blocked")
    x = make_inputs(2, 40, 4, 2, 32, 32, R, chunk_size=8, dtype=dtype, has_z=has_z, has_d=has_d, seed=0)
    gold = golden(**x)
    outs = {n: torch.empty(gold[n].shape) if gold[n] is not None else None for n in OUTPUTS}
    calls = module.kernel_calls(**x, **outs, num_programs=20, point=dict(point, multibuffer=True))
    assert len(calls) == 4  # the dS scan, the chunk kernel's two parts, the reduction
    for kernel, _grid, kwargs, options in calls:
        assert options == {"multibuffer": True}
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{result.stage}: {result.message[:2000]}"
