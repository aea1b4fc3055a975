"""Reference math of mamba3_mimo_bwd_fwd, the first stage of the Mamba-3 MIMO backward.

The stage recomputes the forward chunk by chunk, without gradients through the state recurrence,
and returns what the second stage needs (``states``, ``qk_dot``) and the gradients of the output
projection and the Z gate (``dmimo_o``, ``dmimo_z``, ``dz``). Shapes, with nc = ceil(S / C)::

    q, k [B,S,R,G,N]     v, dout, z [B,S,H,P]     q_bias, k_bias [H,R,N]
    mimo_v (Psi), mimo_o (Phi), mimo_z (Zeta) [H,R,P]      angles [B,S,H,N // rotary_dim_divisor]
    da_cs, da_cs_rev, dt, trap [B,H,S]     segsum [B,H,nc,C,C]     d [H]
    -> states [B,H,nc,N,P], qk_dot [B,H,S,R,R], dmimo_o [B,H,R,P], dmimo_z [B,H,R,P], dz [B,S,H,P]

Math, per batch b and head h (query/key group g = h // (H // G)), token t, rank r::

    q~[t,r] = q[b,t,r,g] + q_bias[h,r]          k~[t,r] = k[b,t,r,g] + k_bias[h,r]
    qk_dot[t,r,s] = <q~[t,r], k~[t,s]>          (after the bias add, before the rotation)
    rot(x)[n]      = cos(a_n) x[n] - sin(a_n) x[n + N/2]    for n < N // rotary_dim_divisor,
    rot(x)[n+N/2]  = sin(a_n) x[n] + cos(a_n) x[n + N/2]    a_n = angles[b,t,h,n]; other dims pass
    Q[t,r] = rot(q~[t,r])        K[t,r] = rot(k~[t,r])       PsiV[t,r,:] = v[b,t,h,:] * Psi[h,r,:]
    gamma[t] = dt[t] sigmoid(trap[t])
    trap_scale[t] = gamma[t] + dt[t+1] sigmoid(-trap[t+1])   (second term 0 at t = S - 1)

    For chunk c = [cs, ce) (the last one may be shorter), with S_0 = 0:
    states[c] = S_c                                              (the state ENTERING chunk c)
    raw_y[t,r] = exp(da_cs[t]) Q[t,r] @ S_c
               + sum_{cs<=u<t} sum_s exp(segsum[c,t-cs,u-cs]) trap_scale[u] <Q[t,r],K[u,s]>
                                     * PsiV[u,s]
               + gamma[t] sum_s <Q[t,r], K[t,s]> PsiV[t,s]
               + d[h] PsiV[t,r]                                   (D skip, when d is given)
    S_{c+1} = exp(da_cs[ce-1]) S_c
            + sum_{cs<=u<ce} sum_s exp(da_cs_rev[u]) trap_scale[u] K[u,s]^T PsiV[u,s]

    u[t,r,p] = z[b,t,h,p] Zeta[h,r,p]     gate = SiLU(u)  (1 without the Z branch)
    out[t,p] = sum_r Phi[h,r,p] gate[t,r,p] raw_y[t,r,p]

``dmimo_o`` / ``dmimo_z`` / ``dz`` are the gradients of sum(dout * out) with respect to Phi, Zeta and
z, taken by torch.autograd with raw_y held constant (this stage's contract: raw_y is a no-grad
recomputation), per batch for Phi and Zeta (the caller sums over B). The chunk-local inputs are
da_cs (inclusive cumsum of dA within each chunk), da_cs_rev (sum of dA over the rest of the chunk
after t) and segsum[c,i,j] = da_cs[i] - da_cs[j] (i > j); see ``dacs_segsum``. This module reads them
as given and never rebuilds them, so a kernel is checked on the same inputs it reads.

Where the sources differ or are silent, the reading of upstream's ``mamba3_MIMO_chunk_ref`` plus
autograd is taken:

- The same-step ("diagonal") term uses the rotated <Q[t,r], K[t,s]>; the upstream kernel uses the
  pre-rotation qk_dot there (equal, the rotation being orthogonal and shared within a step) and
  the chunk reference folds it into an inclusive mask minus a shifted-gamma correction. The golden
  keeps the plain form.
- The state decay of a short last chunk uses da_cs at its last valid token; no output depends on
  it (the state leaving the last chunk is not returned).
- Gating needs both ``mimo_z`` and ``z`` (the Ascend port: one alone is not a valid configuration); one
  without the other is rejected rather than silently ignored.
- Tail padding (``pad_to_chunks``) also zero-pads dt and trap: the Ascend port lists q/k/v/dout/angles/z
  and "ordinary sequence inputs"; a zero dt keeps the shifted term of the last real token at 0.
  Upstream's chunk reference zero-pads da_cs instead of repeating its last value; no valid output
  depends on either choice.

Three evaluations share one code path: ``golden`` (float64, the truth), ``reference_fp32`` (the
fp32 side of the dual benchmark) and ``magnitude`` (float64 sum of |term| per output element).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opgen.errors import OpgenError
from opgen.references.mamba3_inputs import dacs_segsum, make_inputs, pad_to_chunks, positive_int

__all__ = ["golden", "reference_fp32", "magnitude", "recompute", "make_inputs", "pad_to_chunks",
           "dacs_segsum"]

_WHO = "mamba3_mimo_bwd_fwd reference"
_OUTPUTS = ("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_bias: torch.Tensor,
           k_bias: torch.Tensor, mimo_v: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
           da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor, segsum: torch.Tensor,
           d: torch.Tensor | None, chunk_size: int, rotary_dim_divisor: int,
           extra: dict[str, tuple[torch.Tensor | None, str]]) -> tuple[int, ...]:
    """Raise OpgenError unless the shapes agree with the op's signature; return (B,S,R,G,N,H,P)."""
    C = positive_int("chunk_size", chunk_size)
    div = positive_int("rotary_dim_divisor", rotary_dim_divisor)
    if q.dim() != 5:
        raise OpgenError(f"{_WHO}: q must be [B,S,R,G,N], got shape {tuple(q.shape)}")
    if v.dim() != 4:
        raise OpgenError(f"{_WHO}: v must be [B,S,H,P], got shape {tuple(v.shape)}")
    B, S, R, G, N = q.shape
    H, P = v.shape[2], v.shape[3]
    if min(B, S, R, G, N, H, P) < 1:
        raise OpgenError(f"{_WHO}: empty dimension in q {tuple(q.shape)} or v {tuple(v.shape)}")
    if H % G:
        raise OpgenError(f"{_WHO}: H={H} must be a multiple of G={G}")
    if N % 2:
        raise OpgenError(f"{_WHO}: N={N} must be even (rotary pairs n with n + N/2)")
    if div < 2:
        raise OpgenError(f"{_WHO}: rotary_dim_divisor must be >= 2 (rotated dims <= N/2), "
                         f"got {div}")
    nc = math.ceil(S / C)
    want: dict[str, tuple[int, ...]] = {
        "k": (B, S, R, G, N), "v": (B, S, H, P), "q_bias": (H, R, N), "k_bias": (H, R, N),
        "mimo_v": (H, R, P), "angles": (B, S, H, N // div), "da_cs": (B, H, S),
        "da_cs_rev": (B, H, S), "dt": (B, H, S), "trap": (B, H, S), "segsum": (B, H, nc, C, C),
        "d": (H,),
    }
    given = {"k": k, "v": v, "q_bias": q_bias, "k_bias": k_bias, "mimo_v": mimo_v,
             "angles": angles, "da_cs": da_cs, "da_cs_rev": da_cs_rev, "dt": dt, "trap": trap,
             "segsum": segsum, "d": d}
    dims = {"B": B, "S": S, "H": H, "P": P, "R": R}
    for name, (t, spec) in extra.items():
        given[name] = t
        want[name] = tuple(dims[x] for x in spec)
    for name, t in given.items():
        if t is not None and tuple(t.shape) != want[name]:
            raise OpgenError(f"{_WHO}: {name} must have shape {want[name]} (q is {tuple(q.shape)}, "
                             f"v is {tuple(v.shape)}, chunk_size {C}), got {tuple(t.shape)}")
    return B, S, R, G, N, H, P


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, absolute: bool) -> torch.Tensor:
    """Rotate pairs (n, n + N/2) of x [B,H,S,R,N] for n < cos.shape[-1]; cos, sin [B,H,S,1,nrot]."""
    nrot, half = cos.shape[-1], x.shape[-1] // 2
    a, b = x[..., :nrot], x[..., half:half + nrot]
    out = x.clone()
    if absolute:  # sum of |term|: |cos a| + |sin b| and |sin a| + |cos b|
        out[..., :nrot] = cos.abs() * a + sin.abs() * b
        out[..., half:half + nrot] = sin.abs() * a + cos.abs() * b
    else:
        out[..., :nrot] = cos * a - sin * b
        out[..., half:half + nrot] = sin * a + cos * b
    return out


def _recompute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_bias: torch.Tensor,
               k_bias: torch.Tensor, mimo_v: torch.Tensor, angles: torch.Tensor,
               da_cs: torch.Tensor, da_cs_rev: torch.Tensor, dt: torch.Tensor,
               trap: torch.Tensor, segsum: torch.Tensor, d: torch.Tensor | None, chunk_size: int,
               dtype: torch.dtype, device: str | torch.device,
               absolute: bool) -> dict[str, torch.Tensor]:
    """The recomputation: states [B,H,nc,N,P], qk_dot [B,H,S,R,R], raw_y [B,H,S,R,P] in ``dtype``.

    With ``absolute`` every signed factor is replaced by its absolute value (exp and sigmoid
    factors are positive already), giving the sum of |term| of each element instead.
    """
    def cast(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to(device=device, dtype=dtype)
        return t.abs() if absolute else t

    G, H = q.shape[3], v.shape[2]
    group = torch.arange(H, device=device) // (H // G)  # query/key group of each head

    # [B,S,R,G,N] -> per head [B,H,S,R,N], plus the per-head bias [H,R,N]
    qt = cast(q)[:, :, :, group].permute(0, 3, 1, 2, 4) + cast(q_bias)[None, :, None]
    kt = cast(k)[:, :, :, group].permute(0, 3, 1, 2, 4) + cast(k_bias)[None, :, None]
    qk_dot = torch.einsum("bhtrn,bhtsn->bhtrs", qt, kt)

    theta = angles.detach().to(device=device, dtype=dtype).permute(0, 2, 1, 3)[:, :, :, None, :]
    cos, sin = torch.cos(theta), torch.sin(theta)
    Q = _rotate(qt, cos, sin, absolute)
    K = _rotate(kt, cos, sin, absolute)

    dt_, trap_ = cast(dt), trap.detach().to(device=device, dtype=dtype)
    gamma = dt_ * torch.sigmoid(trap_)
    shifted = torch.zeros_like(gamma)
    shifted[..., :-1] = dt_[..., 1:] * torch.sigmoid(-trap_[..., 1:])  # 0 at the last token
    trap_scale = gamma + shifted

    # PsiV [B,H,S,R,P]
    psiv = cast(v).permute(0, 2, 1, 3)[:, :, :, None, :] * cast(mimo_v)[None, :, None]
    cs_all = da_cs.detach().to(device=device, dtype=dtype)
    rev_all = da_cs_rev.detach().to(device=device, dtype=dtype)
    seg_all = segsum.detach().to(device=device, dtype=dtype)

    dd = cast(d)[None, :, None, None, None] if d is not None else None
    states, raw_y = _chunks(Q, K, psiv, gamma, trap_scale, cs_all, rev_all, seg_all, dd, chunk_size)
    return {"states": states, "qk_dot": qk_dot, "raw_y": raw_y}


def _chunks(Q: torch.Tensor, K: torch.Tensor, psiv: torch.Tensor, gamma: torch.Tensor,
            trap_scale: torch.Tensor, cs_all: torch.Tensor, rev_all: torch.Tensor, seg_all: torch.Tensor,
            dd: torch.Tensor | None, C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk loop over rotated Q, K [B,H,S,R,N] and PsiV [B,H,S,R,P] (``dd``: d broadcast
    over them, or None): states [B,H,nc,N,P] and raw_y [B,H,S,R,P]."""
    B, H, S, R, N = Q.shape
    P = psiv.shape[-1]
    nc = math.ceil(S / C)
    dtype, device = Q.dtype, Q.device
    states = torch.zeros((B, H, nc, N, P), dtype=dtype, device=device)
    raw_y = torch.zeros((B, H, S, R, P), dtype=dtype, device=device)
    state = torch.zeros((B, H, N, P), dtype=dtype, device=device)
    for c in range(nc):
        cs, ce = c * C, min(c * C + C, S)
        L = ce - cs
        states[:, :, c] = state
        Qc, Kc, Vc = Q[:, :, cs:ce], K[:, :, cs:ce], psiv[:, :, cs:ce]
        ts, gm, dcs = trap_scale[:, :, cs:ce], gamma[:, :, cs:ce], cs_all[:, :, cs:ce]

        inter = torch.exp(dcs)[..., None, None] * torch.einsum("bhtrn,bhnp->bhtrp", Qc, state)

        causal = torch.ones((L, L), dtype=torch.bool, device=device).tril(-1)  # u < t
        decay = torch.where(causal, torch.exp(seg_all[:, :, c, :L, :L]), 0.0)  # [B,H,t,u]
        scores = torch.einsum("bhtrn,bhusn->bhtrus", Qc, Kc)
        scores = scores * (decay[:, :, :, None, :, None] * ts[:, :, None, None, :, None])
        intra = torch.einsum("bhtrus,bhusp->bhtrp", scores, Vc)

        same = torch.einsum("bhtrn,bhtsn->bhtrs", Qc, Kc)  # rotated, same token
        diag = gm[..., None, None] * torch.einsum("bhtrs,bhtsp->bhtrp", same, Vc)

        y = inter + intra + diag
        if dd is not None:
            y = y + dd * Vc
        raw_y[:, :, cs:ce] = y

        wk = torch.exp(rev_all[:, :, cs:ce]) * ts  # key weight of each token in the state update
        update = torch.einsum("bhusn,bhusp->bhnp", Kc * wk[..., None, None], Vc)
        state = torch.exp(dcs[:, :, -1])[..., None, None] * state + update
    return states, raw_y


def _evaluate(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
              mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
              da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
              segsum: torch.Tensor, mimo_z: torch.Tensor | None, d: torch.Tensor | None,
              z: torch.Tensor | None, chunk_size: int, rotary_dim_divisor: int,
              dtype: torch.dtype, device: str | torch.device,
              absolute: bool) -> dict[str, torch.Tensor | None]:
    """Recompute raw_y, then the projection and gate gradients (autograd, or |term| sums)."""
    if (mimo_z is None) != (z is None):
        raise OpgenError(f"{_WHO}: the Z gate needs both mimo_z and z, got only "
                         f"{'mimo_z' if z is None else 'z'}")
    extra = {"dout": (dout, "BSHP"), "mimo_o": (mimo_o, "HRP"), "mimo_z": (mimo_z, "HRP"),
             "z": (z, "BSHP")}
    B, S, R, G, N, H, P = _check(q, k, v, q_bias, k_bias, mimo_v, angles, da_cs, da_cs_rev, dt,
                                 trap, segsum, d, chunk_size, rotary_dim_divisor, extra)
    rec = _recompute(q, k, v, q_bias, k_bias, mimo_v, angles, da_cs, da_cs_rev, dt, trap, segsum,
                     d, chunk_size, dtype, device, absolute)

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=device, dtype=dtype)

    y = rec["raw_y"].permute(0, 2, 3, 1, 4)  # [B,S,R,H,P], a constant of this stage
    go = cast(dout)[:, :, None]  # [B,S,1,H,P]
    gated = z is not None
    if absolute:
        phi = cast(mimo_o).permute(1, 0, 2).abs()  # [R,H,P]
        if not gated:
            return {"states": rec["states"], "qk_dot": rec["qk_dot"],
                    "dmimo_o": (y * go.abs()).sum(1).permute(0, 2, 1, 3),
                    "dmimo_z": None, "dz": None}
        zeta, zz = cast(mimo_z).permute(1, 0, 2), cast(z)
        u = zz[:, :, None] * zeta
        sig = torch.sigmoid(u)
        dsilu = sig * (1 + u * (1 - sig))  # d SiLU / du, one factor
        du = go.abs() * phi * y * dsilu.abs()
        return {"states": rec["states"], "qk_dot": rec["qk_dot"],
                "dmimo_o": (y * (u * sig).abs() * go.abs()).sum(1).permute(0, 2, 1, 3),
                "dmimo_z": (du * zz.abs()[:, :, None]).sum(1).permute(0, 2, 1, 3),
                "dz": (du * zeta.abs()).sum(2)}

    with torch.enable_grad():
        # one leaf copy of Phi / Zeta per batch, so autograd yields the per-batch partials
        phi = cast(mimo_o).permute(1, 0, 2)[None].repeat(B, 1, 1, 1).requires_grad_(True)
        leaves = [phi]
        if gated:
            zeta = cast(mimo_z).permute(1, 0, 2)[None].repeat(B, 1, 1, 1).requires_grad_(True)
            zz = cast(z).requires_grad_(True)
            leaves += [zeta, zz]
            gate = F.silu(zz[:, :, None] * zeta[:, None])  # [B,S,R,H,P]
            out = (phi[:, None] * gate * y).sum(2)
        else:
            out = (phi[:, None] * y).sum(2)  # [B,S,H,P]
        grads = torch.autograd.grad(out, leaves, grad_outputs=go[:, :, 0])
    return {"states": rec["states"], "qk_dot": rec["qk_dot"],
            "dmimo_o": grads[0].permute(0, 2, 1, 3),
            "dmimo_z": grads[1].permute(0, 2, 1, 3) if gated else None,
            "dz": grads[2] if gated else None}


def golden(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
           mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
           da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor, segsum: torch.Tensor,
           mimo_z: torch.Tensor | None = None, d: torch.Tensor | None = None,
           z: torch.Tensor | None = None, chunk_size: int = 16, rotary_dim_divisor: int = 4,
           device: str | torch.device = "cpu") -> dict[str, torch.Tensor | None]:
    """Float64 golden outputs of the stage; segsum entries it never reads may hold NaN.

    Args:
        dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, da_cs, da_cs_rev, dt, trap,
            segsum, mimo_z, d, z: the op's inputs (see the module docstring), any device and
            dtype; cast to float64 on ``device``.
        chunk_size: C, tokens per chunk; S need not be a multiple of it.
        rotary_dim_divisor: N // rotary_dim_divisor dims (paired with n + N/2) are rotated.
        device: where to compute.

    Returns:
        {"states", "qk_dot", "dmimo_o", "dmimo_z", "dz"}, float64 on ``device``; dmimo_z and dz
        are None unless both mimo_z and z are given.
    """
    return _evaluate(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, da_cs, da_cs_rev, dt,
                     trap, segsum, mimo_z, d, z, chunk_size, rotary_dim_divisor, torch.float64,
                     device, absolute=False)


def reference_fp32(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
                   mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
                   da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
                   segsum: torch.Tensor, mimo_z: torch.Tensor | None = None,
                   d: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   chunk_size: int = 16, rotary_dim_divisor: int = 4,
                   device: str | torch.device = "cpu") -> dict[str, torch.Tensor | None]:
    """The golden's math evaluated in float32: the fp32 side of the dual benchmark.

    Returns:
        The golden's dict, float32 tensors on ``device`` (not rounded to the input dtype).
    """
    return _evaluate(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, da_cs, da_cs_rev, dt,
                     trap, segsum, mimo_z, d, z, chunk_size, rotary_dim_divisor, torch.float32,
                     device, absolute=False)


def magnitude(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
              mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
              da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
              segsum: torch.Tensor, mimo_z: torch.Tensor | None = None,
              d: torch.Tensor | None = None, z: torch.Tensor | None = None,
              chunk_size: int = 16, rotary_dim_divisor: int = 4,
              device: str | torch.device = "cpu") -> dict[str, torch.Tensor | None]:
    """Float64 sum of |term| per output element, the golden's keys and shapes.

    The recurrence is evaluated with |q|, |k|, |bias|, |cos|, |sin|, |v|, |Psi|, |dt|, |d|; the
    gradients with raw_y replaced by its magnitude: dmimo_o = sum_t |y| |SiLU(u)| |dout|,
    dU = |dout| |Phi| |y| |SiLU'(u)|, dz = sum_r dU |Zeta|, dmimo_z = sum_t dU |z|. An output much
    smaller than its magnitude is the result of cancellation (``opgen.run.accuracy.domain_check``).
    """
    return _evaluate(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, da_cs, da_cs_rev, dt,
                     trap, segsum, mimo_z, d, z, chunk_size, rotary_dim_divisor, torch.float64,
                     device, absolute=True)


def recompute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_bias: torch.Tensor,
              k_bias: torch.Tensor, mimo_v: torch.Tensor, angles: torch.Tensor,
              da_cs: torch.Tensor, da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
              segsum: torch.Tensor, d: torch.Tensor | None = None, chunk_size: int = 16,
              rotary_dim_divisor: int = 4, device: str | torch.device = "cpu",
              **unused: object) -> dict[str, torch.Tensor]:
    """The float64 recomputation alone: {"states", "qk_dot", "raw_y" [B,H,S,R,P]}.

    Extra keyword arguments (dout, mimo_o, mimo_z, z) are accepted and ignored, so the dict of
    ``make_inputs`` can be passed as is.
    """
    _check(q, k, v, q_bias, k_bias, mimo_v, angles, da_cs, da_cs_rev, dt, trap, segsum, d,
           chunk_size, rotary_dim_divisor, {})
    return _recompute(q, k, v, q_bias, k_bias, mimo_v, angles, da_cs, da_cs_rev, dt, trap, segsum,
                      d, chunk_size, torch.float64, device, absolute=False)
