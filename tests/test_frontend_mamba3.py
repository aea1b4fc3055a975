"""Every npu kernel of mamba3_mimo_bwd_fwd is accepted by the Ascend front end (TTIR -> Linalg)."""
import importlib
import inspect
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from opgen.space import space
from opgen.evidence.frontend import ascend_frontend
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)


def _cases():
    for variant in space.variants_for(SPEC, "npu"):
        for dtype, has_z in ((torch.bfloat16, True), (torch.float16, False), (torch.float32, True)):
            has_z = has_z and variant.flags["ALGO"] != "aux"  # the aux path has no Z gate
            yield pytest.param(variant.name, dtype, has_z, id=f"{variant.name}-{str(dtype)[6:]}-Z{int(has_z)}")


@pytest.mark.parametrize("variant, dtype, has_z", list(_cases()))
def test_npu_kernels_accepted_by_ascend_front_end(variant, dtype, has_z):
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.npu.{variant}")
    B, S, H, G, N, P, R, C = 2, 40, 4, 2, 16, 32, 4, 16
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, dtype=dtype, has_z=has_z, seed=0)
    NC = -(-S // C)
    f32 = dict(dtype=torch.float32)
    outs = dict(states=torch.empty(B, H, NC, N, P, **f32), qk_dot=torch.empty(B, H, S, R, R, **f32),
                dmimo_o=torch.empty(B, H, R, P, **f32),
                dmimo_z=torch.empty(B, H, R, P, **f32) if has_z else None,
                dz=torch.empty(B, S, H, P, **f32) if has_z else None)
    calls = module.kernel_calls(**x, **outs, num_programs=20, point={"BLOCK_P": 16, "multibuffer": True})
    assert calls
    for kernel, _grid, kwargs, options in calls:
        assert options == {"multibuffer": True}
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{variant} {kernel.__name__ if hasattr(kernel, '__name__') else kernel}: {result.stage}: {result.message[:2000]}"



@pytest.mark.parametrize("variant", ["split_static_separate", "splitscan_static_separate"])
def test_npu_split_gate_and_row_tiles_accepted_by_ascend_front_end(variant):
    """split's chunk kernel with per-token and per-rank tiles storing raw_y, its gate kernel, and a
    state path on N tiles narrower and P tiles wider than the chunk kernel's, its blocks formed
    transposed (split's loading a chunk ahead and its chunk kernel multiplying the rotation halves
    apart)."""
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.npu.{variant}")
    B, S, H, G, N, P, R, C = 2, 40, 4, 2, 32, 32, 4, 16
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, dtype=torch.bfloat16, has_z=True, seed=0)
    NC = -(-S // C)
    f32 = dict(dtype=torch.float32)
    outs = dict(states=torch.empty(B, H, NC, N, P, **f32), qk_dot=torch.empty(B, H, S, R, R, **f32),
                dmimo_o=torch.empty(B, H, R, P, **f32), dmimo_z=torch.empty(B, H, R, P, **f32),
                dz=torch.empty(B, S, H, P, **f32))
    point = {"BLOCK_P": 16, "BLOCK_N": 32, "STATE_BLOCK_N": 16, "STATE_BLOCK_P": 32, "STATE_TRANSPOSED": True,
             "ROW_TILES": True, "GATE_KERNEL": True, "STATE_PREFETCH": True, "multibuffer": True,
             "CHUNK_HALVES": variant.startswith("split_")}
    calls = module.kernel_calls(**x, **outs, num_programs=20, point=point)
    assert any(kernel.__name__.endswith("_gate_kernel") for kernel, *_ in calls)
    for kernel, _grid, kwargs, options in calls:
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{variant} {kernel.__name__}: {result.stage}: {result.message[:2000]}"


_npu = importlib.import_module("generated.mamba3_mimo_bwd_fwd.kernels.npu.stage0_static_separate")
_cuda = importlib.import_module("generated.mamba3_mimo_bwd_fwd.kernels.cuda.stage0_static_separate")
_mm = _npu._mm


@triton.jit
def _mm_probe(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    a = tl.load(a_ptr + tl.arange(0, M)[:, None] * K + tl.arange(0, K)[None, :])
    b = tl.load(b_ptr + tl.arange(0, K)[:, None] * N + tl.arange(0, N)[None, :])
    tl.store(c_ptr + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], _mm(a, b, 16, "ieee"))


def test_small_dot_fallback_stays_a_reduction():
    """Below MIN_DOT, _mm must stay an fp32 multiply-reduce: Triton's combine pass rewrote the
    broadcast form into a dot once M and N reached 16 (tf32 on NVIDIA: stage0's 7.7e-4 error at
    C=8 on the H200). The shapes include the C=8 state update [N, C] x [C, P]."""
    assert inspect.getsource(_cuda._mm.fn) == inspect.getsource(_mm.fn)  # one helper, both renderings
    for M, K, N in ((64, 8, 32), (32, 8, 64), (16, 8, 16), (64, 16, 32)):
        args = dict(a_ptr=torch.empty(M * K), b_ptr=torch.empty(K * N), c_ptr=torch.empty(M * N), M=M, K=K, N=N)
        result = ascend_frontend(_mm_probe, args)
        assert result.accepted, result.message[:2000]
        assert ("linalg.matmul" in result.ops) == (K >= 16), (M, K, N, result.ops)


@pytest.mark.parametrize("variant", ["staged_static_fused", "post_dynamic_separate", "fold_static_separate",
                                     "split_static_separate"])
def test_npu_strided_twin_accepted_by_ascend_front_end(variant):
    """The strided twins of a few npu variants (the staged pre-processing and scan, post's kernels,
    fold, split's with its gate kernel and row tiles) on slices of one fused projection: the
    strides reach the front end as kernel arguments."""
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.npu.strided.{variant}")
    B, S, H, G, N, P, R, C = 2, 32, 4, 2, 16, 32, 2, 16
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, dtype=torch.bfloat16, has_z=True, seed=0)
    fused = torch.cat([x[n].reshape(B, S, -1) for n in ("z", "v", "q", "k", "dout")], dim=-1)
    views, start = dict(x), 0
    for n in ("z", "v", "q", "k", "dout"):
        width = x[n][0, 0].numel()
        views[n] = fused[..., start:start + width].unflatten(-1, x[n].shape[2:])
        start += width
    f32 = dict(dtype=torch.float32)
    outs = dict(states=torch.empty(B, H, S // C, N, P, **f32), qk_dot=torch.empty(B, H, S, R, R, **f32),
                dmimo_o=torch.empty(B, H, R, P, **f32), dmimo_z=torch.empty(B, H, R, P, **f32),
                dz=torch.empty(B, S, H, P, **f32))
    point = {"BLOCK_P": 16, "BLOCK_N": 16, "ROW_TILES": True, "GATE_KERNEL": True, "multibuffer": True}
    calls = module.kernel_calls(**views, **outs, num_programs=20, point=point)
    assert any(k.startswith("stride_") for _, _, kwargs, _ in calls for k in kwargs)
    for kernel, _grid, kwargs, options in calls:
        if "stride_v_t" in kwargs:
            assert kwargs["stride_v_t"] == fused.shape[-1]
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{variant} {kernel.__name__}: {result.stage}: {result.message[:2000]}"
