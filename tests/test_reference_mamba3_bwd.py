"""The float64 ground truth of the whole Mamba-3 MIMO backward.

The chunked forward against a token-by-token recurrence; the second stage's math against autograd
of the chunk loop's intermediates; stage one + stage two + the reductions against autograd of the
forward and against finite differences.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opgen.run.accuracy import max_abs_rel
from opgen.errors import OpgenError
from opgen.references import mamba3_mimo_bwd_bwd as stage_two
from opgen.references import mamba3_mimo_bwd_fwd as stage_one
from opgen.references.mamba3_mimo_forward import (INPUTS, chunk_decays, cumulative_angles,
                                                  forward, forward_grads, gammas, make_inputs,
                                                  stage_two_autograd)

ID = "B{}-S{}-H{}-G{}-N{}-P{}-R{}-C{}-div{}-{}-{}-{}"


def ids(shapes):
    return [ID.format(*s[:9], "Z" if s[9] else "noZ", "D" if s[10] else "noD",
                      "raw" if s[11] else "theta") for s in shapes]


def inputs_of(shape, seed):
    B, S, H, G, N, P, R, C, div, has_z, has_d, raw = shape
    return make_inputs(B, S, H, G, N, P, R, C, div, has_z=has_z, has_d=has_d, seed=seed), raw


def naive_forward(inp, raw_angles):
    """Upstream's step recurrence, one token at a time (all batches and heads at once).

    h_t = exp(dA_t) (h_{t-1} + dt_t sigmoid(-trap_t) K_{t-1}^T PsiV_{t-1})
          + dt_t sigmoid(trap_t) K_t^T PsiV_t,   y_t = Q_t h_t + d PsiV_t,
    out_t = sum_r Phi_r SiLU(z_t Zeta_r) y_t,r, with theta accumulated step by step when raw.
    """
    x = {n: (t.double() if isinstance(t, torch.Tensor) else t) for n, t in inp.items()}
    q, k, v = x["q"], x["k"], x["v"]
    B, S, R, G, N = q.shape
    H, P = v.shape[2], v.shape[3]
    NA, half = x["angles"].shape[-1], N // 2
    group = [h * G // H for h in range(H)]
    state = torch.zeros(B, H, N, P, dtype=torch.float64)
    prev_kv = torch.zeros_like(state)
    theta = torch.zeros(B, H, NA, dtype=torch.float64)

    def rot(a, th):  # a [B,H,R,N], th [B,H,NA]
        c, s = torch.cos(th)[:, :, None], torch.sin(th)[:, :, None]
        out = a.clone()
        out[..., :NA] = c * a[..., :NA] - s * a[..., half:half + NA]
        out[..., half:half + NA] = s * a[..., :NA] + c * a[..., half:half + NA]
        return out

    outs = []
    for t in range(S):
        dt, tr = x["dt"][:, :, t], x["trap"][:, :, t]
        ang = x["angles"][:, t]
        theta = theta + math.pi * torch.tanh(ang) * dt[..., None] if raw_angles else ang
        Q = rot(q[:, t][:, :, group].permute(0, 2, 1, 3) + x["q_bias"], theta)
        K = rot(k[:, t][:, :, group].permute(0, 2, 1, 3) + x["k_bias"], theta)
        psiv = v[:, t][:, :, None] * x["mimo_v"]  # [B,H,R,P]
        kv = torch.einsum("bhrn,bhrp->bhnp", K, psiv)
        alpha = torch.exp(x["dA"][:, :, t])[..., None, None]
        beta = alpha * (dt * torch.sigmoid(-tr))[..., None, None]
        state = alpha * state + beta * prev_kv + (dt * torch.sigmoid(tr))[..., None, None] * kv
        y = torch.einsum("bhrn,bhnp->bhrp", Q, state)
        if x["d"] is not None:
            y = y + x["d"][:, None, None] * psiv
        if x["z"] is not None:
            y = y * F.silu(x["z"][:, t][:, :, None] * x["mimo_z"])
        outs.append((y * x["mimo_o"]).sum(2))
        prev_kv = kv
    return torch.stack(outs, dim=1)


def assert_same(got, want, name, tol=1e-11):
    """float64, same shape, max |got - want| <= tol max |want| and elementwise close; want != 0."""
    assert got.dtype == torch.float64 and got.shape == want.shape, name
    assert want.abs().max() > 0, f"{name}: the check is vacuous (all zero)"
    assert max_abs_rel(got, want) <= tol, (name, max_abs_rel(got, want))
    torch.testing.assert_close(got, want, rtol=1e-9, atol=tol * 1e-2 * want.abs().max().item(),
                               msg=name)


FORWARD_SHAPES = [  # B, S, H, G, N, P, R, C, divisor, Z, D, raw angles
    (2, 11, 4, 2, 16, 5, 2, 4, 4, True, True, False),    # GQA, a tail of 3
    (1, 13, 2, 1, 32, 3, 4, 5, 2, False, True, True),    # a tail of 3, whole-half rotation
    (1, 9, 3, 3, 64, 4, 1, 4, 4, True, False, True),     # R = 1, H = G, a tail of 1
    (2, 12, 2, 1, 16, 3, 4, 4, 2, False, False, False),  # no tail
    (1, 7, 6, 2, 48, 7, 2, 8, 4, True, True, True),      # one short chunk, GQA 3
]


@pytest.mark.parametrize("shape", FORWARD_SHAPES, ids=ids(FORWARD_SHAPES))
def test_forward_matches_token_recurrence(shape):
    inp, raw = inputs_of(shape, seed=sum(shape[:9]))
    out = forward(**{n: inp[n] for n in INPUTS}, chunk_size=inp["chunk_size"],
                  rotary_dim_divisor=inp["rotary_dim_divisor"], raw_angles=raw)
    want = naive_forward(inp, raw)
    assert_same(out, want, "out", tol=1e-12)
    # a wrong reading of the angles is not within the tolerance
    other = forward(**{n: inp[n] for n in INPUTS}, chunk_size=inp["chunk_size"],
                    rotary_dim_divisor=inp["rotary_dim_divisor"], raw_angles=not raw)
    assert max_abs_rel(other, want) > 1e-3


BACKWARD_SHAPES = FORWARD_SHAPES[:3] + [
    (1, 10, 2, 1, 128, 3, 8, 3, 4, True, True, False),   # R = 8, N = 128, a tail of 1
    (2, 8, 4, 4, 64, 2, 2, 8, 2, False, True, True),     # one whole chunk
    (1, 12, 4, 1, 64, 4, 4, 4, 4, True, True, True),     # G = 1 over 4 heads, no tail
]


@pytest.mark.parametrize("shape", BACKWARD_SHAPES, ids=ids(BACKWARD_SHAPES))
def test_full_backward_matches_autograd_of_the_forward(shape):
    inp, raw = inputs_of(shape, seed=7 * shape[1] + shape[4])
    want = forward_grads(**inp, raw_angles=raw)
    got = stage_two.full_backward_reference(**inp, raw_angles=raw)
    assert set(got) == set(want) == {"d" + n for n in INPUTS}
    for name in want:
        if want[name] is None:
            assert got[name] is None, name
            assert (name in ("dmimo_z", "dz") and not shape[9]) or (name == "dd" and not shape[10])
        else:
            assert_same(got[name], want[name], name)


def stage_inputs(inp, raw):
    """The stage kernels' arguments from the forward's inputs (theta, chunk-local decays)."""
    theta = cumulative_angles(inp["angles"], inp["dt"]) if raw else inp["angles"]
    da_cs, da_cs_rev, segsum = stage_one.dacs_segsum(inp["dA"], inp["chunk_size"])
    out = {n: t for n, t in inp.items() if n != "dA"}
    return dict(out, angles=theta, da_cs=da_cs, da_cs_rev=da_cs_rev, segsum=segsum)


@pytest.mark.parametrize("shape", BACKWARD_SHAPES, ids=ids(BACKWARD_SHAPES))
def test_stage_two_matches_autograd_of_its_leaves(shape):
    inp, raw = inputs_of(shape, seed=3 * shape[1] + shape[6])
    st = stage_inputs(inp, raw)
    first = stage_one.golden(**st)
    got = stage_two.golden(**st, states=first["states"], qk_dot=first["qk_dot"])
    want = stage_two_autograd(**st)
    assert tuple(got) == stage_two.OUTPUTS and set(want) == set(got)
    B, S, H, G, N, P, R, C, div = shape[:9]
    nc = math.ceil(S / C)
    shapes = {"dq": (B, S, R, H, N), "dk": (B, S, R, H, N), "dv": (B, S, H, P),
              "dmimo_v": (B, H, R, P), "dangles": (B, S, H, N // div), "dssda": (B, H, nc, C, C),
              "dd": (B, H)}
    for name in stage_two.OUTPUTS:
        if name == "dd" and not shape[10]:
            assert got[name] is None and want[name] is None
            continue
        assert tuple(got[name].shape) == shapes.get(name, (B, H, S)), name
        if nc == 1 and name in ("dda", "dda_cs", "dda_cs_rev"):  # no state crosses a chunk
            assert got[name].abs().max() == 0 and want[name].abs().max() == 0, name
            continue
        assert_same(got[name], want[name], name)


def test_stage_two_reads_the_given_states_and_qk_dot():
    inp, raw = inputs_of((1, 11, 2, 1, 16, 3, 2, 4, 4, True, True, False), seed=5)
    st = stage_inputs(inp, raw)
    first = stage_one.golden(**st)
    base = stage_two.golden(**st, states=first["states"], qk_dot=first["qk_dot"])
    states = first["states"].clone()
    states[:, :, 1] += 0.5  # enters chunk 1 = tokens 4..7
    moved = stage_two.golden(**st, states=states, qk_dot=first["qk_dot"])
    for name in ("dk", "dv", "dmimo_v", "dfactor", "dgamma_diag", "dssda", "dda_cs_rev", "dd"):
        assert torch.equal(moved[name], base[name]), name
    for name, rows in (("dq", (slice(None), slice(4, 8))), ("dda_cs", (..., slice(4, 8))),
                       ("dda", (..., slice(4, 8))), ("dangles", (slice(None), slice(4, 8)))):
        diff = (moved[name] - base[name]).abs()
        assert diff[rows].min() > 0, name
        assert diff.sum() == diff[rows].sum(), name
    qk = first["qk_dot"].clone()
    qk[:, :, 6] += 0.5
    moved = stage_two.golden(**st, states=first["states"], qk_dot=qk)
    for name in ("dq", "dk", "dangles", "dfactor", "dssda", "dda", "dda_cs", "dda_cs_rev"):
        assert torch.equal(moved[name], base[name]), name
    for name, row in (("dgamma_diag", (..., 6)), ("dv", (slice(None), 6))):
        diff = (moved[name] - base[name]).abs()
        assert diff[row].max() > 0 and diff.sum() == diff[row].sum(), name


def test_stage_two_layout_of_the_decay_outputs():
    inp, raw = inputs_of((2, 10, 2, 1, 16, 3, 2, 4, 4, False, True, True), seed=4)
    st = stage_inputs(inp, raw)  # chunks 4, 4, 2
    first = stage_one.golden(**st)
    got = stage_two.golden(**st, states=first["states"], qk_dot=first["qk_dot"])
    dda, dssda = got["dda"], got["dssda"]
    # one value per chunk, copied to its tokens: <S_c, dS_{c+1}> is 0 in the first chunk
    # (S_0 = 0) and in the last (no gradient leaves it)
    assert torch.equal(dda[..., 4:8], dda[..., 4:5].expand(2, 2, 4))
    assert dda[..., 4].abs().min() > 0
    assert dda[..., :4].abs().max() == 0 and dda[..., 8:].abs().max() == 0
    assert got["dda_cs"][..., :4].abs().max() == 0  # nothing enters the first chunk
    assert got["dda_cs_rev"][..., 8:].abs().max() == 0
    key_before_query = torch.ones(4, 4, dtype=torch.bool).triu(1)  # [key u, query t], u < t
    valid = torch.stack([key_before_query, key_before_query,
                         key_before_query & (torch.arange(4) < 2)[None, :]])
    assert dssda[:, :, valid].abs().min() > 0 and dssda[:, :, ~valid].abs().max() == 0


def test_full_backward_matches_finite_differences():
    for raw in (False, True):
        inp, _ = inputs_of((1, 7, 2, 1, 8, 3, 2, 3, 4, True, True, raw), seed=11 + raw)
        grads = stage_two.full_backward_reference(**inp, raw_angles=raw)
        gen = torch.Generator().manual_seed(12)
        args = {n: inp[n] for n in INPUTS}

        def loss(step, direction):
            moved = {n: args[n] + step * direction[n] for n in INPUTS}
            out = forward(**moved, chunk_size=3, rotary_dim_divisor=4, raw_angles=raw)
            return (out * inp["dout"]).sum().item()

        for _ in range(3):
            direction = {n: torch.randn(args[n].shape, generator=gen, dtype=torch.float64)
                         for n in INPUTS}
            eps = 1e-5
            numeric = (loss(eps, direction) - loss(-eps, direction)) / (2 * eps)
            analytic = sum((grads["d" + n] * direction[n]).sum().item() for n in INPUTS)
            assert abs(numeric - analytic) <= 1e-7 * abs(analytic), (raw, numeric, analytic)


def test_reductions_match_autograd():
    gen = torch.Generator().manual_seed(9)
    B, H, S, C = 2, 3, 11, 4  # chunks 4, 4, 3

    def rnd(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64)

    dt, trap = F.softplus(rnd(B, H, S)), rnd(B, H, S)
    dfactor, dgamma_diag = rnd(B, H, S), rnd(B, H, S)
    leaves = [dt.clone().requires_grad_(True), trap.clone().requires_grad_(True)]
    gamma, trap_scale = gammas(*leaves)
    want = torch.autograd.grad((dfactor * trap_scale + dgamma_diag * gamma).sum(), leaves)
    got = stage_two.trap_grads(dfactor, dgamma_diag, dt, trap)
    for g, w, name in zip(got, want, ("ddt", "dtrap")):
        assert_same(g, w, name)

    dA = -torch.rand((B, H, S), generator=gen, dtype=torch.float64)
    da_cs, da_cs_rev, segsum = stage_one.dacs_segsum(dA, C)
    g_cs, g_rev, g_ss, g_last = rnd(B, H, S), rnd(B, H, S), rnd(B, H, 3, C, C), rnd(B, H, 3)
    dda = g_last[..., torch.arange(S) // C]
    leaf = dA.clone().requires_grad_(True)
    cs, rev, seg = chunk_decays(leaf, C)
    valid = torch.ones(C, C, dtype=torch.bool).tril(-1)[None].repeat(3, 1, 1)
    valid[2, 3] = False  # the short chunk's row past its end
    loss = ((g_cs * torch.exp(cs)).sum() + (g_rev * torch.exp(rev)).sum()
            + (g_last * cs[..., [3, 7, 10]]).sum()
            + torch.where(valid, g_ss.transpose(-1, -2) * torch.exp(seg), 0.0).sum())
    want_dA, = torch.autograd.grad(loss, [leaf])
    got_dA = stage_two.decay_grads(dda, g_cs, g_rev, g_ss, da_cs, da_cs_rev, segsum, C)
    assert_same(got_dA, want_dA, "ddA")

    angles, dtheta = rnd(B, S, H, 2), rnd(B, S, H, 2)
    leaves = [angles.clone().requires_grad_(True), dt.clone().requires_grad_(True)]
    want = torch.autograd.grad((dtheta * cumulative_angles(*leaves)).sum(), leaves)
    got = stage_two.angle_grads(dtheta, angles, dt)
    for g, w, name in zip(got, want, ("dangles", "ddt")):
        assert_same(g, w, name)


def test_fp32_reference_close_to_golden():
    inp, raw = inputs_of((1, 20, 2, 1, 32, 8, 2, 8, 4, True, True, False), seed=2)
    st = stage_inputs(inp, raw)
    first = stage_one.golden(**st)
    gold = stage_two.golden(**st, states=first["states"], qk_dot=first["qk_dot"])
    fp32 = stage_two.reference_fp32(**st, states=first["states"], qk_dot=first["qk_dot"])
    for name in stage_two.OUTPUTS:
        assert fp32[name].dtype == torch.float32, name
        assert 0 < max_abs_rel(fp32[name], gold[name]) < 1e-5, name


def test_errors_name_the_problem():
    inp, raw = inputs_of((1, 8, 2, 1, 8, 3, 2, 4, 4, True, True, False), seed=0)
    st = stage_inputs(inp, raw)
    first = stage_one.golden(**st)
    ok = dict(st, states=first["states"], qk_dot=first["qk_dot"])
    with pytest.raises(OpgenError, match=r"\bstates must have shape \(1, 2, 2, 8, 3\)"):
        stage_two.golden(**dict(ok, states=first["states"][:, :, :1]))
    with pytest.raises(OpgenError, match=r"\bqk_dot must have shape"):
        stage_two.golden(**dict(ok, qk_dot=first["qk_dot"][:, :, :, :1]))
    with pytest.raises(OpgenError, match=r"\bsegsum must have shape"):
        stage_two.golden(**dict(ok, chunk_size=8))
    with pytest.raises(OpgenError, match="both mimo_z and z"):
        stage_two.golden(**dict(ok, z=None))
    with pytest.raises(OpgenError, match=r"\bdA must have shape"):
        forward_grads(**dict(inp, dA=inp["dA"][..., :4]))
    with pytest.raises(OpgenError, match="both mimo_z and z"):
        forward_grads(**dict(inp, mimo_z=None))
    with pytest.raises(OpgenError, match="H % G == 0"):
        forward_grads(**dict(inp, q=inp["q"].expand(1, 8, 2, 3, 8),
                             k=inp["k"].expand(1, 8, 2, 3, 8)))
