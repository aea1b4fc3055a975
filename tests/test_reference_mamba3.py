"""The float64 golden of mamba3_mimo_bwd_fwd against a per-token recurrence, and its helpers."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opgen.run.accuracy import rel_l2
from opgen.errors import OpgenError
from opgen.references.mamba3_mimo_bwd_fwd import (dacs_segsum, golden, magnitude, make_inputs,
                                                  pad_to_chunks, recompute, reference_fp32)

KEYS = ("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")


def with_dA(inp, seed=0):
    """Replace the chunk-local decay inputs by float64 ones built from a float64 dA; return both."""
    gen = torch.Generator().manual_seed(seed + 1000)
    dA = -inp["dt"].double() * torch.rand(inp["dt"].shape, generator=gen, dtype=torch.float64)
    da_cs, da_cs_rev, segsum = dacs_segsum(dA, inp["chunk_size"])
    return dict(inp, da_cs=da_cs, da_cs_rev=da_cs_rev, segsum=segsum), dA


def rot(x, ang):
    """Rotate the pairs (n, n + N/2) of a vector x for n < len(ang), one pair at a time."""
    out, half = x.clone(), x.shape[0] // 2
    for n in range(ang.shape[0]):
        c, s = math.cos(ang[n].item()), math.sin(ang[n].item())
        out[n] = c * x[n] - s * x[n + half]
        out[n + half] = s * x[n] + c * x[n + half]
    return out


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def naive(inp, dA):
    """Per-token trapezoidal recurrence (no chunks), one batch / head / token at a time.

    h_t = exp(dA_t) (h_{t-1} + dt_t sigmoid(-trap_t) k_{t-1} v_{t-1}^T)
          + dt_t sigmoid(trap_t) k_t v_t^T
    y_t = Q_t h_t + D PsiV_t; the state entering chunk c (start cs) is the pending state
    h_{cs-1} + dt_cs sigmoid(-trap_cs) k_{cs-1} v_{cs-1}^T.
    """
    x = {n: (t.double() if isinstance(t, torch.Tensor) else t) for n, t in inp.items()}
    q, k, v = x["q"], x["k"], x["v"]
    B, S, R, G, N = q.shape
    H, P = v.shape[2], v.shape[3]
    C = x["chunk_size"]
    nc = math.ceil(S / C)
    states = torch.zeros(B, H, nc, N, P, dtype=torch.float64)
    qk = torch.zeros(B, H, S, R, R, dtype=torch.float64)
    y = torch.zeros(B, H, S, R, P, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            state = torch.zeros(N, P, dtype=torch.float64)
            kv_prev = torch.zeros(N, P, dtype=torch.float64)
            for t in range(S):
                qt = [q[b, t, r, g] + x["q_bias"][h, r] for r in range(R)]
                kt = [k[b, t, r, g] + x["k_bias"][h, r] for r in range(R)]
                for r in range(R):
                    for s in range(R):
                        qk[b, h, t, r, s] = sum(qt[r][n] * kt[s][n] for n in range(N))
                ang = x["angles"][b, t, h]
                qr = [rot(a, ang) for a in qt]
                kr = [rot(a, ang) for a in kt]
                psiv = [v[b, t, h] * x["mimo_v"][h, r] for r in range(R)]
                dt, tr = x["dt"][b, h, t].item(), x["trap"][b, h, t].item()
                pending = state + dt * sig(-tr) * kv_prev
                if t % C == 0:
                    states[b, h, t // C] = pending
                kv = sum(torch.outer(kr[r], psiv[r]) for r in range(R))
                state = math.exp(dA[b, h, t].item()) * pending + dt * sig(tr) * kv
                for r in range(R):
                    y[b, h, t, r] = qr[r] @ state
                    if x["d"] is not None:
                        y[b, h, t, r] += x["d"][h] * psiv[r]
                kv_prev = kv
    return {"states": states, "qk_dot": qk, "raw_y": y}


def out_of(y, mimo_o, mimo_z, z):
    """out[b,t,h,p] = sum_r Phi[h,r,p] SiLU(z[b,t,h,p] Zeta[h,r,p]) y[b,h,t,r,p]; gate 1 without z."""
    yy = y.permute(0, 2, 3, 1, 4)  # [B,S,R,H,P]
    phi = mimo_o.permute(1, 0, 2)
    if z is None:
        return (phi * yy).sum(2)
    u = z[:, :, None] * mimo_z.permute(1, 0, 2)
    return (phi * u * torch.sigmoid(u) * yy).sum(2)


ID = "B{}-S{}-H{}-G{}-N{}-P{}-R{}-C{}-div{}"
SHAPES = [  # B, S, H, G, N, P, R, C, rotary_dim_divisor
    (1, 8, 2, 1, 4, 3, 2, 4, 4),      # the brief's tiny case
    (1, 8, 4, 2, 8, 3, 1, 4, 4),      # GQA, R = 1
    (1, 8, 4, 2, 8, 3, 2, 4, 4),      # GQA, R = 2
    (1, 6, 4, 2, 8, 2, 4, 4, 2),      # GQA, R = 4, S not a multiple of C, full rotate-half
    (2, 10, 2, 2, 4, 2, 2, 3, 2),     # B = 2, H = G, last chunk of length 1
]


@pytest.mark.parametrize("shape", SHAPES, ids=[ID.format(*s) for s in SHAPES])
@pytest.mark.parametrize("has_d", [True, False], ids=["D", "noD"])
def test_recompute_matches_per_token_recurrence(shape, has_d):
    B, S, H, G, N, P, R, C, div = shape
    inp, dA = with_dA(make_inputs(B, S, H, G, N, P, R, C, div, torch.float32, has_d=has_d, seed=3))
    got, want = recompute(**inp), naive(inp, dA)
    for key in ("states", "qk_dot", "raw_y"):
        assert got[key].dtype == torch.float64 and got[key].shape == want[key].shape, key
        torch.testing.assert_close(got[key], want[key], rtol=1e-11, atol=1e-12, msg=key)
    assert got["states"][:, :, 0].abs().max() == 0  # nothing enters the first chunk
    assert got["states"][:, :, 1:].abs().min() > 0


@pytest.mark.parametrize("shape", SHAPES[:3], ids=[ID.format(*s) for s in SHAPES[:3]])
def test_golden_states_and_qk_dot_are_recompute(shape):
    B, S, H, G, N, P, R, C, div = shape
    inp = make_inputs(B, S, H, G, N, P, R, C, div, torch.bfloat16, seed=1)
    gold, rec = golden(**inp), recompute(**inp)
    assert set(gold) == set(KEYS)
    for key in ("states", "qk_dot"):
        assert torch.equal(gold[key], rec[key])
    assert gold["states"].shape == (B, H, math.ceil(S / C), N, P)
    assert gold["qk_dot"].shape == (B, H, S, R, R)
    assert gold["dmimo_o"].shape == gold["dmimo_z"].shape == (B, H, R, P)
    assert gold["dz"].shape == (B, S, H, P)
    assert all(t.dtype == torch.float64 for t in gold.values())


def test_qk_dot_before_rotation_equals_rotated_dot():
    inp = make_inputs(2, 5, 4, 2, 8, 3, 3, 4, 2, torch.float32, seed=4)
    inp["angles"] = inp["angles"] * 20 - 10  # any angles, not just [0, 1)
    qk = golden(**inp)["qk_dot"]
    q, k = inp["q"].double(), inp["k"].double()
    B, S, R, G, N = q.shape
    H = inp["v"].shape[2]
    rotated = torch.zeros_like(qk)
    for b in range(B):
        for h in range(H):
            for t in range(S):
                ang = inp["angles"][b, t, h].double()
                qr = [rot(q[b, t, r, h // 2] + inp["q_bias"][h, r], ang) for r in range(R)]
                kr = [rot(k[b, t, r, h // 2] + inp["k_bias"][h, r], ang) for r in range(R)]
                for r in range(R):
                    for s in range(R):
                        rotated[b, h, t, r, s] = qr[r] @ kr[s]
    torch.testing.assert_close(qk, rotated, rtol=1e-12, atol=1e-12)
    plain = torch.einsum("btrhn,btshn->bhtrs", (q + 0)[:, :, :, [0, 0, 1, 1]]
                         + inp["q_bias"].permute(1, 0, 2), (k + 0)[:, :, :, [0, 0, 1, 1]]
                         + inp["k_bias"].permute(1, 0, 2))
    torch.testing.assert_close(qk, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("has_z", [True, False], ids=["Z", "noZ"])
def test_gradients_by_finite_differences(has_z):
    inp = make_inputs(2, 5, 2, 1, 4, 3, 2, 2, 4, torch.float64, has_z=has_z, seed=6)
    gold = golden(**inp)
    y = recompute(**inp)["raw_y"]
    dout = inp["dout"]
    mo = inp["mimo_o"].double()
    mz = inp["mimo_z"].double() if has_z else None
    z = inp["z"]

    def loss(b, mo_, mz_, z_):  # the loss of batch b alone
        return (dout[b] * out_of(y, mo_, mz_, z_)[b]).sum().item()

    eps = 1e-6
    fd_o = torch.zeros_like(gold["dmimo_o"])
    for b in range(2):
        for idx in torch.cartesian_prod(*(torch.arange(n) for n in mo.shape)).tolist():
            hi, lo = mo.clone(), mo.clone()
            hi[tuple(idx)] += eps
            lo[tuple(idx)] -= eps
            fd_o[(b, *idx)] = (loss(b, hi, mz, z) - loss(b, lo, mz, z)) / (2 * eps)
    torch.testing.assert_close(gold["dmimo_o"], fd_o, rtol=1e-6, atol=1e-8)
    if not has_z:
        assert gold["dmimo_z"] is None and gold["dz"] is None
        want = torch.einsum("bhtrp,bthp->bhrp", y, dout)
        torch.testing.assert_close(gold["dmimo_o"], want, rtol=1e-13, atol=1e-14)
        return
    fd_z, fd_dz = torch.zeros_like(gold["dmimo_z"]), torch.zeros_like(gold["dz"])
    for b in range(2):
        for idx in torch.cartesian_prod(*(torch.arange(n) for n in mz.shape)).tolist():
            hi, lo = mz.clone(), mz.clone()
            hi[tuple(idx)] += eps
            lo[tuple(idx)] -= eps
            fd_z[(b, *idx)] = (loss(b, mo, hi, z) - loss(b, mo, lo, z)) / (2 * eps)
    for idx in torch.cartesian_prod(*(torch.arange(n) for n in z.shape)).tolist():
        hi, lo = z.clone(), z.clone()
        hi[tuple(idx)] += eps
        lo[tuple(idx)] -= eps
        fd_dz[tuple(idx)] = (loss(idx[0], mo, mz, hi) - loss(idx[0], mo, mz, lo)) / (2 * eps)
    torch.testing.assert_close(gold["dmimo_z"], fd_z, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(gold["dz"], fd_dz, rtol=1e-6, atol=1e-8)


def test_outputs_do_not_depend_on_chunk_size():
    base = make_inputs(1, 12, 2, 1, 8, 4, 2, 4, 4, torch.float32, seed=8)
    _, dA = with_dA(base)
    ref = None
    for C in (1, 3, 4, 5, 12, 16):
        da_cs, da_cs_rev, segsum = dacs_segsum(dA, C)
        gold = golden(**dict(base, da_cs=da_cs, da_cs_rev=da_cs_rev, segsum=segsum, chunk_size=C))
        if ref is None:
            ref = gold
        for key in ("qk_dot", "dmimo_o", "dmimo_z", "dz"):
            torch.testing.assert_close(gold[key], ref[key], rtol=1e-11, atol=1e-12, msg=key)


def test_dacs_segsum_definitions_with_tail():
    dA = -torch.rand(2, 3, 11, dtype=torch.float64)
    C = 4  # chunks [0,4) [4,8) [8,11)
    da_cs, da_cs_rev, segsum = dacs_segsum(dA, C)
    assert segsum.shape == (2, 3, 3, C, C)
    for t in range(11):
        cs, ce = t // C * C, min(t // C * C + C, 11)
        torch.testing.assert_close(da_cs[..., t], dA[..., cs:t + 1].sum(-1), rtol=1e-14, atol=1e-15)
        torch.testing.assert_close(da_cs_rev[..., t], dA[..., t + 1:ce].sum(-1), rtol=1e-14,
                                   atol=1e-15)
    ext = F.pad(dA, (0, 1))  # dA = 0 past S
    for c in range(3):
        for i in range(C):
            for j in range(C):
                want = ext[..., c * C + j + 1:c * C + i + 1].sum(-1) if i > j else 0 * ext[..., 0]
                torch.testing.assert_close(segsum[..., c, i, j], want, rtol=1e-14, atol=1e-15)
    f32 = dacs_segsum(dA.float(), C)
    assert all(t.dtype == torch.float32 for t in f32)


def test_reads_no_segsum_entry_outside_the_strict_lower_triangle_of_valid_rows():
    inp = make_inputs(1, 10, 2, 1, 4, 3, 2, 4, 4, torch.float32, seed=9)  # chunks 4, 4, 2
    base = golden(**inp)
    seg = inp["segsum"].clone()
    C, lengths = 4, [4, 4, 2]
    for c, L in enumerate(lengths):
        for i in range(C):
            for j in range(C):
                if not (i < L and j < i):
                    seg[:, :, c, i, j] = math.nan
    gold = golden(**dict(inp, segsum=seg))
    for key in KEYS:
        torch.testing.assert_close(gold[key], base[key], rtol=0, atol=0, msg=key)
    seg[:, :, 2, 1, 0] += 1.0  # read: token 9 from token 8
    changed = golden(**dict(inp, segsum=seg))
    assert (changed["dz"] - base["dz"])[:, 9].abs().min() > 0
    assert (changed["dz"] - base["dz"])[:, :9].abs().max() == 0
    assert torch.equal(changed["states"], base["states"])  # segsum never enters the state


@pytest.mark.parametrize("S,C", [(10, 4), (13, 8), (5, 8), (9, 3)])
def test_tail_padding_contract(S, C):
    inp = make_inputs(2, S, 4, 2, 8, 3, 2, C, 4, torch.bfloat16, seed=S)
    padded = pad_to_chunks(inp, C)
    Sp = math.ceil(S / C) * C
    assert padded["q"].shape[1] == padded["dout"].shape[1] == padded["angles"].shape[1] == Sp
    assert all(padded[n].shape[-1] == Sp for n in ("dt", "trap", "da_cs", "da_cs_rev"))
    assert padded["segsum"].shape == inp["segsum"].shape
    if Sp > S:
        assert padded["z"][:, S:].abs().max() == 0 and padded["dt"][..., S:].abs().max() == 0
        assert torch.equal(padded["da_cs"][..., S:], inp["da_cs"][..., -1:].expand(2, 4, Sp - S))
        assert padded["da_cs_rev"][..., S:].abs().max() == 0
    # the rebuild agrees with make_inputs' zero-extended tail exactly
    assert torch.equal(padded["segsum"], inp["segsum"])
    assert torch.equal(padded["da_cs_rev"][..., :S], inp["da_cs_rev"])
    gp, g = golden(**padded), golden(**inp)
    crop = {"states": lambda t: t, "qk_dot": lambda t: t[:, :, :S], "dmimo_o": lambda t: t,
            "dmimo_z": lambda t: t, "dz": lambda t: t[:, :S]}
    for key in KEYS:
        torch.testing.assert_close(crop[key](gp[key]), g[key], rtol=1e-12, atol=1e-13, msg=key)
    assert gp["dz"][:, S:].abs().max() == 0 if Sp > S else True


def test_pad_to_chunks_without_tail_and_with_bad_chunk_size():
    inp = make_inputs(1, 8, 2, 1, 4, 3, 2, 4, 4, torch.float16, seed=0)
    same = pad_to_chunks(inp, 4)
    assert same is not inp and all(same[k] is inp[k] for k in inp)
    with pytest.raises(OpgenError, match="chunk_size"):
        pad_to_chunks(inp, 8)


def test_make_inputs_deterministic_and_realistic():
    args = (2, 40, 4, 2, 16, 8, 2)
    a = make_inputs(*args, chunk_size=16, seed=11)
    b = make_inputs(*args, chunk_size=16, seed=11)
    c = make_inputs(*args, chunk_size=16, seed=12)
    tensors = [n for n, t in a.items() if isinstance(t, torch.Tensor)]
    assert set(tensors) == {"dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o",
                            "angles", "da_cs", "da_cs_rev", "dt", "trap", "segsum", "mimo_z", "d",
                            "z"}
    for n in tensors:
        assert torch.equal(a[n], b[n]), n
        assert not torch.equal(a[n], c[n]), n
    assert a["chunk_size"] == 16 and a["rotary_dim_divisor"] == 4
    for n in ("q", "k", "v", "z", "trap", "dout"):
        assert a[n].dtype == torch.bfloat16, n
    for n in ("q_bias", "k_bias", "mimo_v", "mimo_o", "mimo_z", "d", "angles", "dt", "da_cs",
              "da_cs_rev", "segsum"):
        assert a[n].dtype == torch.float32, n
    assert a["q"].shape == (2, 40, 2, 2, 16) and a["angles"].shape == (2, 40, 4, 4)
    assert a["segsum"].shape == (2, 4, 3, 16, 16) and a["dt"].shape == (2, 4, 40)
    assert bool((a["dt"] > 0).all()) and bool((a["angles"] >= 0).all())
    assert bool((a["da_cs"] <= 0).all()) and bool((a["da_cs_rev"] <= 0).all())
    assert bool((a["segsum"] <= 0).all())
    for cs in range(0, 40, 16):  # non-increasing within a chunk, restarting at each chunk
        chunk = a["da_cs"][..., cs:cs + 16]
        assert bool((chunk[..., 1:] <= chunk[..., :-1]).all())
        assert bool((chunk[..., 0] >= -a["dt"][..., cs]).all())
    off = make_inputs(*args, chunk_size=16, seed=11, has_z=False, has_d=False)
    assert off["z"] is None and off["mimo_z"] is None and off["d"] is None
    assert all(torch.equal(off[n], a[n]) for n in tensors if n not in ("z", "mimo_z", "d"))
    g = golden(**off)
    assert g["dmimo_z"] is None and g["dz"] is None


def test_fp32_reference_close_to_golden():
    inp = make_inputs(2, 40, 4, 2, 16, 8, 2, 16, 4, torch.bfloat16, seed=2)
    gold, ref = golden(**inp), reference_fp32(**inp)
    for key in KEYS:
        assert ref[key].dtype == torch.float32, key
        assert 0 < rel_l2(ref[key], gold[key]) < 1e-5, key


def test_magnitude_bounds_golden():
    inp = make_inputs(2, 20, 2, 1, 8, 4, 2, 8, 4, torch.float16, seed=5)
    gold, mag = golden(**inp), magnitude(**inp)
    for key in KEYS:
        assert mag[key].dtype == torch.float64 and mag[key].shape == gold[key].shape, key
        assert bool((mag[key] >= gold[key].abs() * (1 - 1e-12)).all()), key
    assert bool((mag["qk_dot"] > 4 * gold["qk_dot"].abs()).any())  # cancellation does occur
    no_z = magnitude(**dict(inp, z=None, mimo_z=None))
    assert no_z["dz"] is None and bool((no_z["dmimo_o"] > 0).all())


def test_errors_name_the_problem():
    inp = make_inputs(1, 8, 2, 1, 4, 3, 2, 4, 4, torch.float16, seed=0)
    with pytest.raises(OpgenError, match=r"\bsegsum must have shape"):
        golden(**dict(inp, chunk_size=8))
    with pytest.raises(OpgenError, match=r"\bangles must have shape"):
        golden(**dict(inp, rotary_dim_divisor=2))
    with pytest.raises(OpgenError, match=r"\bdout must have shape"):
        golden(**dict(inp, dout=inp["dout"][:, :4]))
    with pytest.raises(OpgenError, match="both mimo_z and z"):
        golden(**dict(inp, z=None))
    with pytest.raises(OpgenError, match="chunk_size"):
        golden(**dict(inp, chunk_size=True))
    with pytest.raises(OpgenError, match="multiple of G"):
        golden(**dict(inp, q=inp["q"].expand(1, 8, 2, 3, 4), k=inp["k"].expand(1, 8, 2, 3, 4)))
