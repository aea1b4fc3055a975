"""The float64 ground truth of the whole Mamba-3 MIMO backward.

The chunked forward against a token-by-token recurrence.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opgen.accuracy import max_abs_rel
from opgen.references.mamba3_mimo_forward import INPUTS, forward, make_inputs

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
