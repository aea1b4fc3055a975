"""The float64 golden of chunk_gla_fwd_o_gk against an independent per-token loop; its helpers."""
from __future__ import annotations

import math

import pytest
import torch

from opgen.run.accuracy import rel_l2
from opgen.errors import OpgenError
from opgen.references.chunk_gla_fwd_o_gk import golden, magnitude, make_inputs, reference_fp32, reference_half


def naive(q, v, g, A, h, scale, chunk_size, use_exp2=False):
    """One token, one head at a time, in plain float64 Python loops over k and s."""
    q, v, g, A, h = (t.double() for t in (q, v, g, A, h))
    B, T, H, K = q.shape
    o = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            c = t // chunk_size
            cs = c * chunk_size
            for hh in range(H):
                acc = torch.zeros(v.shape[-1], dtype=torch.float64)
                for k in range(K):
                    x = g[b, t, hh, k].item()
                    gate = 2.0 ** x if use_exp2 else math.exp(x)
                    acc += scale * q[b, t, hh, k].item() * gate * h[b, c, hh, k]
                for s in range(cs, t + 1):
                    acc += A[b, t, hh, s - cs].item() * v[b, s, hh]
                o[b, t, hh] = acc
    return o


ID = "B{}-T{}-H{}-K{}-V{}-BT{}"
SHAPES = [  # B, T, H, K, V, BT
    (2, 13, 1, 5, 3, 4),    # T not a multiple of BT, H=1, odd K and V
    (1, 16, 2, 3, 7, 8),    # T a multiple of BT
    (1, 3, 3, 4, 5, 8),     # T shorter than one chunk
    (2, 9, 2, 6, 1, 2),     # V=1, many short chunks, last one of length 1
]


@pytest.mark.parametrize("shape", SHAPES, ids=[ID.format(*x) for x in SHAPES])
@pytest.mark.parametrize("use_exp2", [False, True], ids=["exp", "exp2"])
def test_golden_matches_naive_loop(shape, use_exp2):
    B, T, H, K, V, BT = shape
    inp = make_inputs(B, T, H, K, V, BT, torch.float16, seed=7)
    got = golden(**inp, use_exp2=use_exp2)
    want = naive(**inp, use_exp2=use_exp2)
    assert got.dtype == torch.float64 and got.shape == (B, T, H, V)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


def test_exp2_equals_exp_with_g_scaled_by_ln2():
    inp = make_inputs(2, 50, 2, 16, 8, 16, torch.bfloat16, seed=3)
    via_exp2 = golden(**inp, use_exp2=True)
    scaled = dict(inp, g=inp["g"].double() * math.log(2.0))
    torch.testing.assert_close(via_exp2, golden(**scaled, use_exp2=False), rtol=1e-12, atol=1e-14)
    assert rel_l2(via_exp2, golden(**inp)) > 1e-3  # the flag does change the result


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp32_reference_close_to_golden(dtype):
    inp = make_inputs(2, 100, 2, 32, 32, 32, dtype, seed=1)
    ref = reference_fp32(**inp)
    assert ref.dtype == torch.float32
    err = rel_l2(ref, golden(**inp))
    assert 0 < err < 1e-6


def test_reads_only_lower_triangle_of_its_chunk():
    B, T, H, K, V, BT = 1, 10, 1, 4, 3, 4  # chunks [0,4) [4,8) [8,10)
    inp = make_inputs(B, T, H, K, V, BT, torch.float16, seed=5)
    base = golden(**inp)
    A = inp["A"].clone()
    for t in range(T):
        cs = t // BT * BT
        n = min(BT, T - cs)
        for col in range(BT):
            if col > t - cs or col >= n:   # above the diagonal or past the short last chunk
                A[0, t, 0, col] = math.nan
    torch.testing.assert_close(golden(**dict(inp, A=A)), base, rtol=0, atol=0)
    A[0, 9, 0, 1] += 1.0  # row 9 (chunk 2, position 1): its diagonal is read
    changed = golden(**dict(inp, A=A)) - base
    assert torch.allclose(changed[0, 9, 0], inp["v"][0, 9, 0].double())
    assert changed[0, :9].abs().max() == 0


def test_uses_state_of_own_chunk():
    inp = make_inputs(1, 12, 1, 4, 4, 4, torch.float16, seed=2)
    h = inp["h"].clone()
    h[:, 1] += 1.0
    diff = (golden(**dict(inp, h=h)) - golden(**inp)).abs().amax(dim=(0, 2, 3))
    assert diff[:4].max() == 0 and diff[8:].max() == 0 and diff[4:8].min() > 0


def test_magnitude_bounds_golden_and_equals_it_for_positive_terms():
    inp = make_inputs(2, 37, 2, 8, 8, 16, torch.float16, seed=4)
    mag, gold = magnitude(**inp), golden(**inp)
    assert mag.dtype == torch.float64
    assert bool((mag >= gold.abs() * (1 - 1e-12)).all())
    assert bool((mag > gold.abs() * 4).any())  # cancellation does occur in random inputs
    pos = {k: (t.abs() if k in "qvAh" else t) for k, t in inp.items()}
    torch.testing.assert_close(magnitude(**pos), golden(**pos), rtol=1e-12, atol=0)


def test_make_inputs_deterministic_and_realistic():
    a = make_inputs(2, 70, 3, 16, 24, 32, torch.bfloat16, seed=11)
    b = make_inputs(2, 70, 3, 16, 24, 32, torch.bfloat16, seed=11)
    c = make_inputs(2, 70, 3, 16, 24, 32, torch.bfloat16, seed=12)
    for k in "qvgAh":
        assert torch.equal(a[k], b[k]), k
        assert not torch.equal(a[k], c[k]), k
    assert a["q"].dtype == a["v"].dtype == torch.bfloat16
    assert a["g"].dtype == a["A"].dtype == a["h"].dtype == torch.float32
    assert a["h"].shape == (2, 3, 3, 16, 24) and a["A"].shape == (2, 70, 3, 32)
    assert a["scale"] == 16 ** -0.5 and a["chunk_size"] == 32
    g = a["g"]
    assert bool((g < 0).all())  # exp(g) in (0, 1)
    for cs in range(0, 70, 32):  # non-increasing within a chunk, restarting at each chunk
        chunk = g[:, cs:cs + 32]
        assert bool((chunk[:, 1:] <= chunk[:, :-1]).all())
        assert bool((chunk[:, 0] > -1.0).all())  # one step: logsigmoid(x) / 16


def test_shape_errors_name_the_tensor():
    inp = make_inputs(1, 8, 1, 4, 4, 4, torch.float16, seed=0)
    with pytest.raises(OpgenError, match=r"\bh must have shape"):
        golden(**dict(inp, h=inp["h"][:, :1]))
    with pytest.raises(OpgenError, match=r"\bA must have shape"):
        golden(**dict(inp, chunk_size=8))
    with pytest.raises(OpgenError, match="chunk_size"):
        golden(**dict(inp, chunk_size=True))


@pytest.mark.parametrize("dtype, chunk", [(torch.bfloat16, 64), (torch.float16, 32)])
def test_traffic_formula_counts_each_operand_once_and_the_lower_triangle_of_A(dtype, chunk):
    """The memory floor's bytes, from the tensors themselves: q, v, g, h read and o written once;
    of A only the entries the op reads (s <= t within a chunk)."""
    from pathlib import Path

    from opgen.space import space
    from opgen.spec.spec import load_spec

    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "specs" / "chunk_gla_fwd_o_gk.yaml", root)
    B, T, H, K, V = 2, 4 * chunk, 3, 48, 40
    x = make_inputs(B, T, H, K, V, chunk, dtype=dtype, seed=0)
    used = torch.tril(torch.ones(chunk, chunk)).sum().item() * B * H * (T // chunk)
    expected = sum(x[n].numel() * x[n].element_size() for n in ("q", "v", "g", "h"))
    expected += x["v"].numel() * x["v"].element_size() + used * x["A"].element_size()
    row = {"B": B, "T": T, "H": H, "K": K, "V": V, "chunk_size": chunk, "dtype": str(dtype).removeprefix("torch.")}
    params = space.evaluate_params(spec, space.case_inputs(spec, row))
    assert spec.traffic_bytes.evaluate(params) == expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_reference_rounds_where_a_half_kernel_rounds(dtype):
    """reference_half is the golden with q * exp(g), h and A rounded to q's dtype and the output
    rounded: exact on operands a half dtype holds (small integers, g = 0), and on the bench-like
    inputs worse than the output's own rounding, more so at scale 2, where the inter-chunk term
    (rounded q * exp(g) against h) carries the output."""
    x = make_inputs(2, 37, 2, 24, 20, 16, dtype=dtype, seed=5)  # a tail: 37 = 2 * 16 + 5
    exact = {**x, "g": torch.zeros_like(x["g"]), "scale": 0.5,
             **{n: x[n].float().mul(4).round().clamp(-8, 8) for n in ("q", "h", "A")}}
    exact["q"] = exact["q"].to(dtype)
    gold = golden(**exact)
    assert torch.equal(reference_half(**exact), gold.to(dtype))
    x = make_inputs(1, 256, 4, 64, 64, 64, dtype=dtype, seed=1)
    gold = golden(**x)
    rounding = rel_l2(gold.to(dtype), gold)
    at_default = rel_l2(reference_half(**x), gold)
    at_two = rel_l2(reference_half(**{**x, "scale": 2.0}), golden(**{**x, "scale": 2.0}))
    assert 1.2 * rounding < at_default < at_two < 2.5 * rounding
