"""Reference math of mamba3_mimo_bwd_bwd, the second stage of the Mamba-3 MIMO backward.

The stage walks the chunks in reverse with the state gradient dS, reading the states entering
each chunk and the per-token q.k rank products that the first stage stored
(``opgen.references.mamba3_mimo_bwd_fwd``), and returns the gradients of everything upstream of
raw_y. Its inputs are the first stage's (same shapes and conventions; ``angles`` is theta, the
angles the rotation reads) plus::

    states [B,H,nc,N,P]   (states[:, :, c] enters chunk c)     qk_dot [B,H,S,R,R]

Outputs (upstream's ``mamba_mimo_bwd_bwd`` buffers, lower case), float64, nc = ceil(S / C)::

    dq, dk       [B,S,R,H,N]  per value head, of the biased pre-rotation q~ / k~ (upstream's
                              [B,S*R,H,N] buffer, row t*R + r, is the same memory)
    dv           [B,S,H,P]    of v (final)
    dmimo_v      [B,H,R,P]    of Psi, per batch
    dangles      [B,S,H,NA]   of theta, summed over ranks and over q and k
    dfactor      [B,H,S]      of trap_scale[t] (the state update and the off-diagonal terms)
    dgamma_diag  [B,H,S]      of gamma[t] in the same-step term
    dda          [B,H,S]      of da_cs at the chunk's last token through the state decay,
                              exp(da_cs[ce-1]) <S_c, dS_{c+1}>, copied to every token of the chunk
    dssda        [B,H,nc,C,C] of exp(segsum[c,t,u]), stored [key u, query t]; 0 unless u < t < L
    dda_cs_rev   [B,H,S]      of exp(da_cs_rev[t]) (the state update's key weight)
    dda_cs       [B,H,S]      of exp(da_cs[t]) (the inter-chunk output term)
    dd           [B,H]        of d, per batch (None without d)

dda_cs, dda_cs_rev and dssda are gradients with respect to the exponentials, not the sums (as
upstream's kernel leaves them); dda is with respect to the sum itself. With the per-head
quantities (rotated Q, K, PsiV, dY[t,r] = dout[t] Phi[r] SiLU(z[t] Zeta[r]), or without Z
dout[t] Phi[r]) and, per chunk c from the last one down, dS the gradient of the state leaving
it (0 for the last chunk)::

    E[t,u] = exp(segsum[c,t,u]) for u < t in the chunk, else 0
    A[t,r,u,s] = <Q[t,r], K[u,s]>      M[t,r,u,s] = <dY[t,r], PsiV[u,s]>
    dssda[u,t] = trap_scale[u] sum_{r,s} A M           (u < t)
    dfactor[u] = exp(da_cs_rev[u]) sum_s <K[u,s], dS PsiV[u,s]> + sum_t E[t,u] sum_{r,s} A M
    dda_cs_rev[u] = trap_scale[u] sum_s <K[u,s], dS PsiV[u,s]>
    dgamma_diag[t] = sum_{r,s} qk_dot[t,r,s] M[t,r,t,s]
    dda_cs[t] = sum_r <Q[t,r], S_c dY[t,r]>
    dPsiV[u,s] = exp(da_cs_rev[u]) trap_scale[u] dS^T K[u,s] + sum_{t,r} E trap_scale[u] A dY[t,r]
               + gamma[u] sum_r qk_dot[u,r,s] dY[u,r] + d dY[u,s]
    dQ[t,r] = exp(da_cs[t]) S_c dY[t,r] + sum_{u,s} E trap_scale[u] M K[u,s]
    dK[u,s] = exp(da_cs_rev[u]) trap_scale[u] dS PsiV[u,s] + sum_{t,r} E trap_scale[u] M Q[t,r]
    dq~ = rot_{-theta}(dQ) + gamma[t] sum_s M[t,r,t,s] k~[t,s]       (dk~ likewise)
    dangles[t,n] = sum_r dQ[n+N/2] Q[n] - dQ[n] Q[n+N/2]  + the same of K
    dS <- exp(da_cs[ce-1]) dS + sum_t exp(da_cs[t]) sum_r Q[t,r]^T dY[t,r]

What the caller still does (``full_backward_reference``, one function each below):

- ``reduce_heads``: dq / dk [B,S,R,G,N] sum each group's H/G contiguous heads (head h reads
  group h // (H/G)); dq_bias / dk_bias [H,R,N] sum the per-head dq / dk over B and S.
- dmimo_v and dd sum over B (and the first stage's dmimo_o and dmimo_z too).
- ``trap_grads``: gamma[t] = dt[t] sigmoid(trap[t]) receives dfactor + dgamma_diag, the shifted
  dt[t+1] sigmoid(-trap[t+1]) receives dfactor[t]: ddt and dtrap.
- ``decay_grads``: ddA from dda, dda_cs, dda_cs_rev and dssda (da_cs, da_cs_rev and segsum are
  chunk-local sums of dA).
- ``angle_grads``, for per-step angles only: theta is a running sum of pi tanh(angles) dt, so
  dangles and a term of ddt come from the reverse running sum of the stage's dangles.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opgen.errors import OpgenError
from opgen.references import mamba3_mimo_bwd_fwd as stage_one
from opgen.references.mamba3_mimo_forward import cumulative_angles, gammas, rotate

__all__ = ["golden", "reference_fp32", "magnitude", "make_inputs", "full_backward_reference", "reduce_heads", "trap_grads",
           "decay_grads", "angle_grads", "OUTPUTS"]

_WHO = "mamba3_mimo_bwd_bwd reference"
OUTPUTS = ("dq", "dk", "dv", "dmimo_v", "dangles", "dfactor", "dgamma_diag", "dda", "dssda",
           "dda_cs_rev", "dda_cs", "dd")


def _check(args: dict[str, torch.Tensor | None], chunk_size: int,
           rotary_dim_divisor: int) -> tuple[int, ...]:
    """The first stage's shape checks plus states and qk_dot; return (B,S,R,G,N,H,P)."""
    if (args["mimo_z"] is None) != (args["z"] is None):
        raise OpgenError(f"{_WHO}: the Z gate needs both mimo_z and z")
    extra = {"dout": (args["dout"], "BSHP"), "mimo_o": (args["mimo_o"], "HRP"),
             "mimo_z": (args["mimo_z"], "HRP"), "z": (args["z"], "BSHP")}
    B, S, R, G, N, H, P = stage_one._check(
        args["q"], args["k"], args["v"], args["q_bias"], args["k_bias"], args["mimo_v"],
        args["angles"], args["da_cs"], args["da_cs_rev"], args["dt"], args["trap"],
        args["segsum"], args["d"], chunk_size, rotary_dim_divisor, extra)
    nc = math.ceil(S / chunk_size)
    for name, want in (("states", (B, H, nc, N, P)), ("qk_dot", (B, H, S, R, R))):
        if tuple(args[name].shape) != want:
            raise OpgenError(f"{_WHO}: {name} must have shape {want}, got "
                             f"{tuple(args[name].shape)}")
    return B, S, R, G, N, H, P


def _evaluate(args: dict[str, torch.Tensor | None], chunk_size: int, rotary_dim_divisor: int,
              dtype: torch.dtype, device: str | torch.device) -> dict[str, torch.Tensor | None]:
    """The reverse chunk loop of the module docstring, in ``dtype`` on ``device``."""
    B, S, R, G, N, H, P = _check(args, chunk_size, rotary_dim_divisor)
    x = {n: (t.detach().to(device=device, dtype=dtype) if t is not None else None)
         for n, t in args.items()}
    C, half = chunk_size, N // 2
    NA = N // rotary_dim_divisor
    o = _operands(x, H, G, device)
    Q, K, theta = o["Q"], o["K"], o["theta"]

    out = {n: torch.zeros((B, H, S), dtype=dtype, device=device)
           for n in ("dfactor", "dgamma_diag", "dda", "dda_cs_rev", "dda_cs")}
    grads = {"dQ": torch.zeros_like(Q), "dK": torch.zeros_like(K),
             # the same-step term, before rotation
             "dqt": torch.zeros_like(Q), "dkt": torch.zeros_like(K),
             "dpsiv": torch.zeros_like(o["psiv"]),
             "dssda": torch.zeros((B, H, math.ceil(S / C), C, C), dtype=dtype, device=device),
             "dd": torch.zeros((B, H), dtype=dtype, device=device)}
    dS = torch.zeros((B, H, N, P), dtype=dtype, device=device)  # of the state leaving the chunk
    for c in reversed(range(math.ceil(S / C))):
        dS = _chunk(x, o, out, grads, c, C, S, dS, device)

    def turn(dX: torch.Tensor, X: torch.Tensor) -> torch.Tensor:  # dtheta of X = rot(x~)
        lo, hi = slice(0, NA), slice(half, half + NA)
        return (dX[..., hi] * X[..., lo] - dX[..., lo] * X[..., hi]).sum(3)

    dQ, dK, dpsiv = grads["dQ"], grads["dK"], grads["dpsiv"]
    dangles = turn(dQ, Q) + turn(dK, K)
    dq = rotate(dQ, -theta) + grads["dqt"]
    dk = rotate(dK, -theta) + grads["dkt"]
    out.update({
        "dq": dq.permute(0, 2, 3, 1, 4), "dk": dk.permute(0, 2, 3, 1, 4),
        "dv": (dpsiv * x["mimo_v"][None, :, None]).sum(3).permute(0, 2, 1, 3),
        "dmimo_v": (dpsiv * o["v"][:, :, :, None]).sum(2), "dangles": dangles.permute(0, 2, 1, 3),
        "dssda": grads["dssda"], "dd": grads["dd"] if x["d"] is not None else None,
    })
    return {name: out[name] for name in OUTPUTS}


def _operands(x: dict[str, torch.Tensor | None], H: int, G: int,
              device: str | torch.device) -> dict[str, torch.Tensor]:
    """The per-head quantities of the module docstring: biased q~ / k~ (``qt``, ``kt``), theta,
    rotated Q and K, v, PsiV, dY, gamma and trap_scale, each [B,H,S,...]."""
    group = torch.arange(H, device=device) // (H // G)
    qt = x["q"][:, :, :, group].permute(0, 3, 1, 2, 4) + x["q_bias"][None, :, None]
    kt = x["k"][:, :, :, group].permute(0, 3, 1, 2, 4) + x["k_bias"][None, :, None]
    theta = x["angles"].permute(0, 2, 1, 3)  # [B,H,S,NA]
    v = x["v"].permute(0, 2, 1, 3)  # [B,H,S,P]
    dy = x["dout"].permute(0, 2, 1, 3)[:, :, :, None] * x["mimo_o"][None, :, None]
    if x["z"] is not None:
        dy = dy * F.silu(x["z"].permute(0, 2, 1, 3)[:, :, :, None] * x["mimo_z"][None, :, None])
    gamma, trap_scale = gammas(x["dt"], x["trap"])
    return {"qt": qt, "kt": kt, "theta": theta, "Q": rotate(qt, theta), "K": rotate(kt, theta), "v": v,
            "psiv": v[:, :, :, None] * x["mimo_v"][None, :, None],  # [B,H,S,R,P]
            "dy": dy, "gamma": gamma, "trap_scale": trap_scale}


def _chunk(x: dict[str, torch.Tensor | None], o: dict[str, torch.Tensor], out: dict[str, torch.Tensor],
           grads: dict[str, torch.Tensor], c: int, C: int, S: int, dS: torch.Tensor,
           device: str | torch.device) -> torch.Tensor:
    """Chunk ``c``'s terms, added into ``out`` and ``grads``; returns dS of the state entering it."""
    cs, ce = c * C, min(c * C + C, S)
    L = ce - cs
    Qc, Kc, Vc, dYc = o["Q"][:, :, cs:ce], o["K"][:, :, cs:ce], o["psiv"][:, :, cs:ce], o["dy"][:, :, cs:ce]
    ts, gm = o["trap_scale"][:, :, cs:ce], o["gamma"][:, :, cs:ce]
    e_cs, e_rev = torch.exp(x["da_cs"][:, :, cs:ce]), torch.exp(x["da_cs_rev"][:, :, cs:ce])
    e_last = torch.exp(x["da_cs"][:, :, ce - 1])
    St = x["states"][:, :, c]
    dQ, dK, dpsiv = grads["dQ"], grads["dK"], grads["dpsiv"]

    # the state update S_{c+1} = e_last S_c + sum_u e_rev[u] ts[u] K[u]^T PsiV[u]
    kds_v = torch.einsum("bhusn,bhnp,bhusp->bhu", Kc, dS, Vc)
    out["dda_cs_rev"][:, :, cs:ce] = ts * kds_v
    out["dfactor"][:, :, cs:ce] = e_rev * kds_v
    wk = (e_rev * ts)[..., None, None]
    dpsiv[:, :, cs:ce] += wk * torch.einsum("bhusn,bhnp->bhusp", Kc, dS)
    dK[:, :, cs:ce] += wk * torch.einsum("bhnp,bhusp->bhusn", dS, Vc)
    out["dda"][:, :, cs:ce] = (e_last * (St * dS).sum((-2, -1)))[..., None]

    # off-diagonal intra-chunk terms
    causal = torch.ones((L, L), dtype=torch.bool, device=device).tril(-1)
    E = torch.where(causal, torch.exp(x["segsum"][:, :, c, :L, :L]), 0.0)  # [B,H,t,u]
    A = torch.einsum("bhtrn,bhusn->bhtrus", Qc, Kc)
    M = torch.einsum("bhtrp,bhusp->bhtrus", dYc, Vc)
    AM = torch.where(causal, (A * M).sum((3, 5)), 0.0)  # [B,H,t,u]
    grads["dssda"][:, :, c, :L, :L] = (AM * ts[:, :, None, :]).transpose(-1, -2)
    out["dfactor"][:, :, cs:ce] += (E * AM).sum(2)
    W = E * ts[:, :, None, :]
    dQ[:, :, cs:ce] += torch.einsum("bhtu,bhtrus,bhusn->bhtrn", W, M, Kc)
    dK[:, :, cs:ce] += torch.einsum("bhtu,bhtrus,bhtrn->bhusn", W, M, Qc)
    dpsiv[:, :, cs:ce] += torch.einsum("bhtu,bhtrus,bhtrp->bhusp", W, A, dYc)

    # the same-step term gamma[t] sum_s qk_dot[t,r,s] PsiV[t,s] (before the rotation)
    Md = torch.einsum("bhtrp,bhtsp->bhtrs", dYc, Vc)
    qkc = x["qk_dot"][:, :, cs:ce]
    out["dgamma_diag"][:, :, cs:ce] = (qkc * Md).sum((-2, -1))
    grads["dqt"][:, :, cs:ce] = gm[..., None, None] * torch.einsum("bhtrs,bhtsn->bhtrn", Md,
                                                                     o["kt"][:, :, cs:ce])
    grads["dkt"][:, :, cs:ce] = gm[..., None, None] * torch.einsum("bhtrs,bhtrn->bhtsn", Md,
                                                                     o["qt"][:, :, cs:ce])
    dpsiv[:, :, cs:ce] += gm[..., None, None] * torch.einsum("bhtrs,bhtrp->bhtsp", qkc, dYc)
    if x["d"] is not None:
        dpsiv[:, :, cs:ce] += x["d"][None, :, None, None, None] * dYc
        grads["dd"] += (dYc * Vc).sum((2, 3, 4))

    # the inter-chunk term exp(da_cs[t]) Q[t,r] S_c
    sdy = torch.einsum("bhnp,bhtrp->bhtrn", St, dYc)
    out["dda_cs"][:, :, cs:ce] = (Qc * sdy).sum((-2, -1))
    dQ[:, :, cs:ce] += e_cs[..., None, None] * sdy

    return e_last[..., None, None] * dS + torch.einsum(
        "bhtrn,bhtrp->bhnp", Qc * e_cs[..., None, None], dYc)


def golden(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
           mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
           da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor, segsum: torch.Tensor,
           states: torch.Tensor, qk_dot: torch.Tensor, mimo_z: torch.Tensor | None = None,
           d: torch.Tensor | None = None, z: torch.Tensor | None = None, chunk_size: int = 16,
           rotary_dim_divisor: int = 4, device: str | torch.device = "cpu"
           ) -> dict[str, torch.Tensor | None]:
    """Float64 outputs of the stage (module docstring); segsum entries it never reads may be NaN.

    Args:
        dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, da_cs, da_cs_rev, dt, trap,
            segsum, mimo_z, d, z: the first stage's inputs (``angles`` is theta).
        states, qk_dot: the first stage's outputs, read as given (not recomputed).
        chunk_size: C; S need not be a multiple of it.
        rotary_dim_divisor: N // rotary_dim_divisor dims (paired with n + N/2) are rotated.
        device: where to compute.

    Returns:
        {name: tensor} for every name of ``OUTPUTS``; dd is None without d.
    """
    args = dict(dout=dout, q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v,
                mimo_o=mimo_o, angles=angles, da_cs=da_cs, da_cs_rev=da_cs_rev, dt=dt, trap=trap,
                segsum=segsum, states=states, qk_dot=qk_dot, mimo_z=mimo_z, d=d, z=z)
    return _evaluate(args, chunk_size, rotary_dim_divisor, torch.float64, device)


def reference_fp32(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
                   mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
                   da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
                   segsum: torch.Tensor, states: torch.Tensor, qk_dot: torch.Tensor,
                   mimo_z: torch.Tensor | None = None, d: torch.Tensor | None = None,
                   z: torch.Tensor | None = None, chunk_size: int = 16,
                   rotary_dim_divisor: int = 4, device: str | torch.device = "cpu"
                   ) -> dict[str, torch.Tensor | None]:
    """The golden's math evaluated in float32 (the fp32 side of a dual benchmark)."""
    args = dict(dout=dout, q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v,
                mimo_o=mimo_o, angles=angles, da_cs=da_cs, da_cs_rev=da_cs_rev, dt=dt, trap=trap,
                segsum=segsum, states=states, qk_dot=qk_dot, mimo_z=mimo_z, d=d, z=z)
    return _evaluate(args, chunk_size, rotary_dim_divisor, torch.float32, device)


def magnitude(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
              mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
              da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
              segsum: torch.Tensor, states: torch.Tensor, qk_dot: torch.Tensor,
              mimo_z: torch.Tensor | None = None, d: torch.Tensor | None = None,
              z: torch.Tensor | None = None, chunk_size: int = 16,
              rotary_dim_divisor: int = 4, device: str | torch.device = "cpu"
              ) -> dict[str, torch.Tensor | None]:
    """A float64 scale of each output's terms: |golden| of the inputs' absolute values, unrotated.

    Every input is replaced by |x| and the angles by 0, so the products and sums carry no sign
    (the angle gradient still subtracts, and the SiLU gate keeps its sign changes): a scale for
    reports, not a bound on the terms (this op's ``accuracy.domain_check`` is off).
    """
    args = dict(dout=dout, q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v,
                mimo_o=mimo_o, angles=torch.zeros_like(angles), da_cs=da_cs, da_cs_rev=da_cs_rev,
                dt=dt, trap=trap, segsum=segsum, states=states, qk_dot=qk_dot, mimo_z=mimo_z, d=d,
                z=z)
    args = {n: (t.abs() if t is not None and n not in ("da_cs", "da_cs_rev", "segsum", "trap")
                else t) for n, t in args.items()}
    out = _evaluate(args, chunk_size, rotary_dim_divisor, torch.float64, device)
    return {n: (t.abs() if t is not None else None) for n, t in out.items()}


def make_inputs(B: int, S: int, H: int, G: int, N: int, P: int, R: int, chunk_size: int = 16,
                rotary_dim_divisor: int = 4, dtype: torch.dtype = torch.bfloat16,
                has_z: bool = True, has_d: bool = True, seed: int = 0,
                device: str | torch.device = "cpu") -> dict[str, object]:
    """The first stage's ``make_inputs`` plus its float64 ``states`` and ``qk_dot`` rounded to fp32.

    The states and qk_dot are what ``mamba3_mimo_bwd_fwd`` writes at its default output dtype
    (float32), computed by that stage's golden from the same inputs.

    Returns:
        Every argument of ``golden`` by name (device excluded): ready for ``golden(**inputs)``.
    """
    x = stage_one.make_inputs(B, S, H, G, N, P, R, chunk_size=chunk_size,
                              rotary_dim_divisor=rotary_dim_divisor, dtype=dtype, has_z=has_z,
                              has_d=has_d, seed=seed, device=device)
    first = stage_one.recompute(**x, device=device)
    x["states"] = first["states"].float()
    x["qk_dot"] = first["qk_dot"].float()
    return x


# -- the reductions outside the stage ----------------------------------------------------------


def reduce_heads(dx: torch.Tensor, G: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head dq or dk [B,S,R,H,N] -> (the grouped gradient [B,S,R,G,N], the bias's [H,R,N])."""
    B, S, R, H, N = dx.shape
    grouped = dx.reshape(B, S, R, G, H // G, N).sum(4)
    return grouped, dx.sum((0, 1)).permute(1, 0, 2)


def trap_grads(dfactor: torch.Tensor, dgamma_diag: torch.Tensor, dt: torch.Tensor,
               trap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ddt, dtrap) [B,H,S] from the stage's dfactor and dgamma_diag.

    gamma[t] = dt[t] sigmoid(trap[t]) receives dfactor[t] + dgamma_diag[t]; the shifted term
    dt[t+1] sigmoid(-trap[t+1]) of trap_scale[t] receives dfactor[t], so token t gets
    dfactor[t-1] through its own dt and trap (nothing at t = 0).
    """
    dgamma = dfactor + dgamma_diag
    dshift = F.pad(dfactor[..., :-1], (1, 0))  # dfactor[t-1]
    sig, sig_neg = torch.sigmoid(trap), torch.sigmoid(-trap)
    ddt = dgamma * sig + dshift * sig_neg
    dtrap = (dgamma - dshift) * dt * sig * sig_neg
    return ddt, dtrap


def decay_grads(dda: torch.Tensor, dda_cs: torch.Tensor, dda_cs_rev: torch.Tensor,
                dssda: torch.Tensor, da_cs: torch.Tensor, da_cs_rev: torch.Tensor,
                segsum: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """ddA [B,H,S] of the per-step log decay from the stage's decay outputs.

    Within a chunk, dA[i] enters da_cs[j] for j >= i, da_cs_rev[j] for j < i and segsum[t,u] for
    u < i <= t, so with g_cs = exp(da_cs) dda_cs, g_rev = exp(da_cs_rev) dda_cs_rev and
    g_ss[t,u] = exp(segsum[t,u]) dssda[u,t]::

        ddA[i] = dda[i] + sum_{j>=i} g_cs[j] + sum_{j<i} g_rev[j] + sum_{t>=i} sum_{u<i} g_ss[t,u]
    """
    C, S = chunk_size, dda.shape[-1]
    g_cs, g_rev = torch.exp(da_cs) * dda_cs, torch.exp(da_cs_rev) * dda_cs_rev
    parts = []
    for c, cs in enumerate(range(0, S, C)):
        L = min(C, S - cs)
        gc, gr = g_cs[..., cs:cs + L], g_rev[..., cs:cs + L]
        total = gc.flip(-1).cumsum(-1).flip(-1) + F.pad(gr.cumsum(-1)[..., :-1], (1, 0))
        low = torch.ones((L, L), dtype=torch.bool, device=dda.device).tril(-1)
        gss = torch.where(low, torch.exp(segsum[:, :, c, :L, :L]) *
                          dssda[:, :, c, :L, :L].transpose(-1, -2), 0.0)  # [t,u]
        rows = gss.flip(-2).cumsum(-2).flip(-2)  # [i,u]: sum over t >= i
        total = total + torch.where(low, rows, 0.0).sum(-1)  # u < i
        parts.append(total)
    return dda + torch.cat(parts, -1)


def angle_grads(dtheta: torch.Tensor, angles: torch.Tensor, dt: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dangles [B,S,H,NA] of the per-step angles, the term of ddt [B,H,S]) from dtheta.

    theta[t] = sum_{s<=t} pi tanh(angles[s]) dt[s], so with T[s] = sum_{t>=s} dtheta[t]:
    dangles[s] = T[s] pi (1 - tanh(angles[s])^2) dt[s], ddt[s] = sum_n T[s,n] pi tanh(angles[s,n]).
    """
    T = dtheta.flip(1).cumsum(1).flip(1)
    th = torch.tanh(angles)
    dangles = T * math.pi * (1 - th * th) * dt.permute(0, 2, 1)[..., None]
    return dangles, (T * math.pi * th).sum(-1).permute(0, 2, 1)


def full_backward_reference(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, q_bias: torch.Tensor, k_bias: torch.Tensor,
                            mimo_v: torch.Tensor, mimo_o: torch.Tensor, angles: torch.Tensor,
                            dA: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
                            mimo_z: torch.Tensor | None = None, d: torch.Tensor | None = None,
                            z: torch.Tensor | None = None, chunk_size: int = 16,
                            rotary_dim_divisor: int = 4, raw_angles: bool = False,
                            device: str | torch.device = "cpu"
                            ) -> dict[str, torch.Tensor | None]:
    """The gradient of every input of the layer: stage one's golden, stage two's, the reductions.

    Takes ``opgen.references.mamba3_mimo_forward.forward``'s inputs and ``dout`` (its
    ``make_inputs`` dict can be passed as is) and returns what its ``forward_grads`` returns
    (keys "d" + input name, None for an absent optional input), computed without autograd
    through the layer.
    """
    f64 = {n: t.detach().to(device=device, dtype=torch.float64)
           for n, t in dict(angles=angles, dA=dA, dt=dt, trap=trap).items()}
    theta = cumulative_angles(f64["angles"], f64["dt"]) if raw_angles else f64["angles"]
    da_cs, da_cs_rev, segsum = stage_one.dacs_segsum(f64["dA"], chunk_size)
    stage = dict(dout=dout, q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v,
                 mimo_o=mimo_o, angles=theta, da_cs=da_cs, da_cs_rev=da_cs_rev, dt=dt,
                 trap=trap, segsum=segsum, mimo_z=mimo_z, d=d, z=z, chunk_size=chunk_size,
                 rotary_dim_divisor=rotary_dim_divisor, device=device)
    first = stage_one.golden(**stage)
    second = golden(**stage, states=first["states"], qk_dot=first["qk_dot"])
    G = q.shape[3]
    dq, dq_bias = reduce_heads(second["dq"], G)
    dk, dk_bias = reduce_heads(second["dk"], G)
    ddt, dtrap = trap_grads(second["dfactor"], second["dgamma_diag"], f64["dt"], f64["trap"])
    dangles = second["dangles"]
    if raw_angles:
        dangles, ddt_angles = angle_grads(dangles, f64["angles"], f64["dt"])
        ddt = ddt + ddt_angles
    ddA = decay_grads(second["dda"], second["dda_cs"], second["dda_cs_rev"], second["dssda"],
                      da_cs, da_cs_rev, segsum, chunk_size)

    def batch_sum(t: torch.Tensor | None) -> torch.Tensor | None:
        return t.sum(0) if t is not None else None

    return {"dq": dq, "dk": dk, "dv": second["dv"], "dq_bias": dq_bias, "dk_bias": dk_bias,
            "dmimo_v": batch_sum(second["dmimo_v"]), "dmimo_o": batch_sum(first["dmimo_o"]),
            "dangles": dangles, "ddA": ddA, "ddt": ddt, "dtrap": dtrap,
            "dmimo_z": batch_sum(first["dmimo_z"]), "dd": batch_sum(second["dd"]),
            "dz": first["dz"]}
