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


@pytest.mark.parametrize("variant, dtype, has_z, has_d, R, point", [
    ("blocked", torch.bfloat16, True, True, 4, {"BLOCK_N": 16, "BLOCK_P": 16, "DS_BLOCK_N": 16, "DS_BLOCK_P": 16}),
    ("blocked", torch.float16, False, False, 1, {"BLOCK_N": 32, "BLOCK_P": 32, "DS_BLOCK_N": 32, "DS_BLOCK_P": 32}),
    ("blocked_pairs", torch.bfloat16, True, True, 4, {"BLOCK_N": 16, "BLOCK_P": 16, "DS_BLOCK_N": 16, "DS_BLOCK_P": 16}),
    ("blocked_pairs", torch.float16, False, True, 2, {"BLOCK_N": 32, "BLOCK_P": 16, "DS_BLOCK_N": 32, "DS_BLOCK_P": 16,
                                                       "PAIR_PRODUCTS": True})],
    ids=["bf16-Z-D-R4-tiles16", "fp16-noZ-noD-R1-whole", "pairs-bf16-Z-D-R4-tiles16", "pairs-products-apart"])
def test_npu_blocked_kernels_accepted_by_ascend_front_end(variant, dtype, has_z, has_d, R, point):
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_bwd.kernels.npu.{variant}")
    x = make_inputs(2, 40, 4, 2, 32, 32, R, chunk_size=8, dtype=dtype, has_z=has_z, has_d=has_d, seed=0)
    gold = golden(**x)
    outs = {n: torch.empty(gold[n].shape) if gold[n] is not None else None for n in OUTPUTS}
    calls = module.kernel_calls(**x, **outs, num_programs=20, point=dict(point, multibuffer=True))
    # the dS scan, the chunk kernel's parts (blocked_pairs: one more, two with the products apart), the reduction
    assert len(calls) == 4 + (variant == "blocked_pairs") + bool(point.get("PAIR_PRODUCTS"))
    for kernel, _grid, kwargs, options in calls:
        assert options == {"multibuffer": True}
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{result.stage}: {result.message[:2000]}"


@pytest.mark.parametrize("variant", ["serial", "blocked", "blocked_pairs"])
def test_npu_strided_twin_accepted_by_ascend_front_end(variant):
    """The strided twins on slices of one fused projection (z, v, q, k, dout) and angles the first
    part of a wider tensor, the Z gate on: the strides reach the front end as kernel arguments
    (blocked's reduction, which reads no input, is its contiguous module's and left out)."""
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_bwd.kernels.npu.strided.{variant}")
    B, S, H, G, N, P, R, C = 2, 24, 4, 2, 16, 16, 2, 8
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, dtype=torch.bfloat16, has_z=True, seed=0)
    names = ("z", "v", "q", "k", "dout")
    fused = torch.cat([x[n].reshape(B, S, -1) for n in names], dim=-1)
    views, start = dict(x), 0
    for n in names:
        width = x[n][0, 0].numel()
        views[n] = fused[..., start:start + width].unflatten(-1, x[n].shape[2:])
        start += width
    views["angles"] = torch.cat([x["angles"], x["angles"]], dim=-1)[..., :x["angles"].shape[-1]]
    gold = golden(**x)
    outs = {n: torch.empty(gold[n].shape) if gold[n] is not None else None for n in OUTPUTS}
    point = {"BLOCK_N": 16, "BLOCK_P": 16, "DS_BLOCK_N": 16, "DS_BLOCK_P": 16, "multibuffer": True}
    calls = [c for c in module.kernel_calls(**views, **outs, num_programs=20, point=point)
             if any(k.startswith("stride_") for k in c[2])]
    assert len(calls) == {"serial": 1, "blocked": 3, "blocked_pairs": 4}[variant]
    for kernel, _grid, kwargs, options in calls:
        assert kwargs["stride_dout_t"] == fused.shape[-1]
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{variant} {kernel.__name__}: {result.stage}: {result.message[:2000]}"
