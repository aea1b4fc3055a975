"""The kernels' own tf32 split (DOT_PRECISION tf32x3_split): x = hi + lo + a rest below fp32's
reach, hi and lo each a tf32 value (10 mantissa bits) rounded to nearest, so the three tf32
products of the parts are exact in fp32 and only lo @ lo and the rest are left out."""
import importlib

import numpy as np
import torch
import triton
import triton.language as tl

_module = importlib.import_module("generated.mamba3_mimo_bwd_fwd.kernels.cuda.split_static_separate")
_parts = _module._parts


@triton.jit
def _parts_probe(x_ptr, hi_ptr, lo_ptr, n: tl.constexpr, PRECISION: tl.constexpr):
    o = tl.arange(0, n)
    hi, lo = _parts(tl.load(x_ptr + o), PRECISION)
    tl.store(hi_ptr + o, hi)
    tl.store(lo_ptr + o, lo)


def _low_bits(t: torch.Tensor) -> np.ndarray:
    """The 13 mantissa bits a tf32 value has zero."""
    return t.numpy().view(np.uint32) & 0x1FFF


def test_parts_are_tf32_and_sum_to_x_within_fp32_reach():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-30, 30, (4096,), generator=gen).float())
    x[:4] = torch.tensor([1.0, -1.0, 1.0 + 2.0 ** -11, -(1.0 + 2.0 ** -11 + 2.0 ** -23)])  # ties and their neighbours
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    _parts_probe[(1,)](x, hi, lo, n=x.numel(), PRECISION="tf32x3_split")
    assert not _low_bits(hi).any() and not _low_bits(lo).any()
    x64, hi64, lo64 = x.double(), hi.double(), lo.double()
    # hi is the nearest tf32 value: at most half a tf32 ulp (2^-11 relative) away
    assert ((x64 - hi64).abs() <= 2.0 ** -11 * x64.abs()).all()
    # lo rounds the rest, which fp32 holds exactly: what is left is at most 2^-23 of x
    assert ((x64 - hi64 - lo64).abs() <= 2.0 ** -23 * x64.abs()).all()
    assert (hi64 + lo64 != hi64).any()  # lo carries bits


def test_parts_pass_other_precisions_through():
    x = torch.randn(64, generator=torch.Generator().manual_seed(1))
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    _parts_probe[(1,)](x, hi, lo, n=64, PRECISION="ieee")
    assert torch.equal(hi, x) and torch.equal(lo, x)
