"""Metrics, dual benchmark and domain check of opgen.run.accuracy on constructed and simulated cases."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from opgen.run.accuracy import (CRITERIA, AccuracyError, check_all, criteria_for, domain_check,
                            dual_benchmark, max_abs_rel, max_rel, mere, rel_l2)
from opgen.references.chunk_gla_fwd_o_gk import golden, magnitude, make_inputs, reference_fp32


def gaussian(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# -- metrics ---------------------------------------------------------------------------------------

def test_rel_l2_known_values():
    g = torch.tensor([3.0, 4.0], dtype=torch.float64)          # ||g|| = 5
    delta = torch.tensor([0.3, -0.4], dtype=torch.float64)    # ||delta|| = 0.5
    assert rel_l2(g + delta, g) == pytest.approx(0.1, rel=1e-12)
    assert rel_l2(g.to(torch.float16), g) == 0.0               # any dtype, cast to float64
    zero = torch.zeros(3)
    assert rel_l2(zero, zero) == 0.0
    assert rel_l2(zero + 1e-9, zero) == math.inf


def test_max_abs_rel_mere_max_rel_known_values():
    g = torch.tensor([10.0, -0.001, 2.0], dtype=torch.float64)
    out = g + torch.tensor([0.1, 0.001, 0.0], dtype=torch.float64)
    assert max_abs_rel(out, g) == pytest.approx(0.1 / 10.0)
    # elementwise relative errors with floor 0.01: 0.01, 0.001/0.01 = 0.1, 0
    assert mere(out, g, 0.01) == pytest.approx((0.01 + 0.1 + 0.0) / 3)
    assert max_rel(out, g, 0.01) == pytest.approx(0.1)
    assert max_rel(out, g, 1e-6) == pytest.approx(1.0)          # the near-zero element blows up
    with pytest.raises(AccuracyError):
        mere(out, g, 0.0)


def test_shape_mismatch_raises():
    with pytest.raises(AccuracyError, match="shape"):
        rel_l2(torch.zeros(3), torch.zeros(4))


# -- criteria --------------------------------------------------------------------------------------

def test_criteria_table_derived_from_unit_roundoff():
    table = ((torch.float16, 2**-11, 3), (torch.bfloat16, 2**-8, 3), (torch.float32, 2**-24, 32))
    for dtype, u, e_mult in table:
        cr = criteria_for(dtype)
        assert cr is CRITERIA[dtype] and cr.dtype == str(dtype)[6:]
        assert cr.unit_roundoff == u and cr.term_error == e_mult * u
        c = cr.cancel_ratio
        assert cr.rtol == pytest.approx(u + e_mult * u / c)
        assert cr.rtol_special == pytest.approx(e_mult * u + c * u)
        assert 0 < cr.atol < u * 1e-4
    # the documented defaults
    assert {cr.cancel_ratio for cr in CRITERIA.values()} == {2**-4}
    assert CRITERIA[torch.bfloat16].rtol == 49 * 2**-8
    assert CRITERIA[torch.float32].rtol == 513 * 2**-24
    assert CRITERIA[torch.float16].rtol_special == 3.0625 * 2**-11
    assert {(cr.dual_ratio, cr.dual_floor) for cr in CRITERIA.values()} == {(4.0, 3.0)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        CRITERIA[torch.float16].rtol = 1.0  # type: ignore[misc]
    with pytest.raises(AccuracyError, match="float64"):
        criteria_for(torch.float64)


# -- dual benchmark --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dual_passes_golden_rounded_and_fails_10x_floor(dtype):
    g = gaussian(64, 64)
    ref32 = g.float()
    rounded = g.to(dtype)
    res = dual_benchmark(rounded, ref32, g)
    assert res.passed and res.reason.startswith("dual ok")
    assert res.kernel_rms == pytest.approx(res.round_rms) and res.ref32_rms < res.round_rms / 1000
    floor = CRITERIA[dtype].dual_floor * max(res.round_rms, CRITERIA[dtype].unit_roundoff / 4)
    assert res.allowed_rms == pytest.approx(floor)
    noise = gaussian(64, 64, seed=1)
    bad = g + noise * (10 * floor * g.norm() / noise.norm())   # rel_l2 = 10x the floor
    res = dual_benchmark(bad.to(dtype), ref32, g)
    assert not res.passed and "rel_l2" in res.reason
    assert res.kernel_rms == pytest.approx(10 * floor, rel=0.05)


def test_dual_catches_one_wrong_element_through_max_metric():
    g = gaussian(256, 256)
    out = g.clone()
    out[7, 9] += 0.05 * g.abs().max()          # invisible in rel_l2 over 65k elements
    res = dual_benchmark(out.to(torch.bfloat16), g.float(), g)
    assert res.kernel_rms <= res.allowed_rms and not res.passed and "max_abs_rel" in res.reason


def test_dual_fp32_output_judged_against_fp32_reference():
    g = gaussian(128, 128)
    ref32 = (g + gaussian(128, 128, seed=2) * 1e-7).float()  # an fp32 computation's error
    assert dual_benchmark(ref32, ref32, g).passed
    half_like = ref32.to(torch.bfloat16).float()               # fp32 output with bf16 accuracy
    res = dual_benchmark(half_like, ref32, g)
    assert not res.passed and res.dtype == "float32"


def test_dual_nonfinite_fails():
    g = gaussian(8, 8)
    out = g.clone().to(torch.float16)
    out[0, 0] = math.nan
    res = dual_benchmark(out, g.float(), g)
    assert not res.passed and res.nonfinite == 1 and "non-finite" in res.reason


# -- domain check ----------------------------------------------------------------------------------

def terms_case():
    """Four outputs, each the sum of two terms: two well-conditioned, two cancelling."""
    terms = torch.tensor([[1.0, 0.5], [2.0, -0.25], [1.0, -0.999], [-3.0, 2.9995]],
                         dtype=torch.float64)
    return terms.sum(1), terms.abs().sum(1)


def test_domain_flags_real_mismatch_not_cancellation():
    dtype = torch.float16
    cr = CRITERIA[dtype]
    g, m = terms_case()
    out = g.clone()
    out[0] *= 1.10                                  # normal element 10% off: a real mismatch
    out[2] += 0.5 * cr.unit_roundoff * m[2]         # cancellation: 49% of |golden|, u/2 of m
    assert abs(out[2] - g[2]) / abs(g[2]) > 0.4
    res = domain_check(out, g, m, dtype=dtype)
    assert (res.n_normal, res.n_special) == (2, 2)
    assert res.normal_mismatch_count == 1 and res.special_mismatch_count == 0 and not res.passed
    assert res.worst_normal[0].index == (0,) and res.worst_normal[0].ratio > 1
    assert res.worst_special[0].ratio < 1 and "FAIL" in res.reason
    out[0] = g[0]
    assert domain_check(out, g, m, dtype=dtype).passed


def test_domain_flags_special_mismatch_and_nan():
    g, m = terms_case()
    out = g.clone()
    out[3] += 10 * CRITERIA[torch.bfloat16].unit_roundoff * m[3]   # past rtol_special * m
    out[1] = math.nan
    res = domain_check(out, g, m, dtype=torch.bfloat16)
    assert res.special_mismatch_count == 1 and res.worst_special[0].index == (3,)
    assert res.normal_mismatch_count == 1 and res.nonfinite == 1 and not res.passed
    assert res.worst_normal[0].index == (1,)


def test_domain_zero_golden_and_magnitude():
    z = torch.zeros(4, dtype=torch.float64)
    assert domain_check(z.float(), z, z).passed
    assert not domain_check(z.float() + 1e-3, z, z).passed


# -- simulated kernels on the GLA reference ------------------------------------------------------

def simulated_kernel(inp, dtype, half_operands, drop_diagonal=False):
    """The op in fp32 like a kernel, optionally rounding dot operands to the output dtype (FLA)."""
    q, v, g, A, h, scale, BT = (inp[k] for k in ("q", "v", "g", "A", "h", "scale", "chunk_size"))
    rnd = (lambda t: t.to(dtype).float()) if half_operands else (lambda t: t)
    B, T, H, _ = q.shape
    o = torch.zeros(B, T, H, v.shape[-1])
    for c, s in enumerate(range(0, T, BT)):
        e = min(s + BT, T)
        mask = torch.ones(e - s, e - s, dtype=torch.bool).tril(-1 if drop_diagonal else 0)
        qg = rnd(q[:, s:e].float() * torch.exp(g[:, s:e]))
        a = rnd(A[:, s:e, :, :e - s].where(mask[None, :, None, :], 0.0))
        o[:, s:e] = (torch.einsum("bthk,bhkv->bthv", qg, rnd(h[:, c])) * scale
                     + torch.einsum("bths,bshv->bthv", a, v[:, s:e].float()))
    return o.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("half_operands", [False, True], ids=["fp32-operands", "half-operands"])
def test_sound_kernels_pass_check_all(dtype, half_operands):
    shapes = [(2, 100, 3, 48, 48, 64), (1, 37, 1, 32, 32, 32), (1, 5, 1, 16, 16, 32)]
    for seed, shape in enumerate(shapes):
        inp = make_inputs(*shape, dtype, seed=seed)
        out = simulated_kernel(inp, dtype, half_operands)
        rep = check_all(out, golden(**inp), reference_fp32(**inp), magnitude(**inp))
        assert rep.passed, rep.summary()
        assert rep.summary().startswith("PASS")
        assert rep.domain is not None and rep.domain.n_special > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_mask_bug_fails_check_all(dtype):
    inp = make_inputs(2, 100, 2, 32, 32, 64, dtype, seed=9)
    out = simulated_kernel(inp, dtype, half_operands=False, drop_diagonal=True)
    rep = check_all(out, golden(**inp), reference_fp32(**inp), magnitude(**inp))
    assert not rep.passed and not rep.dual.passed and rep.domain.normal_mismatch_count > 0
    assert rep.summary().startswith("FAIL")


def test_check_all_without_magnitude_notes_skip():
    g = gaussian(16, 16)
    rep = check_all(g.to(torch.bfloat16), g, g.float())
    assert rep.passed and rep.domain is None and "skipped" in rep.summary()
    assert rep.rel_l2 == rep.dual.kernel_rms and rep.mere > 0
