"""Float64 chunked forward of the Mamba-3 MIMO layer: its autograd is the whole backward's golden.

The layer's inputs, before any chunk-local preprocessing (nc = ceil(S / C), NA = N // divisor)::

    q, k [B,S,R,G,N]     v, z [B,S,H,P]     q_bias, k_bias [H,R,N]
    mimo_v (Psi), mimo_o (Phi), mimo_z (Zeta) [H,R,P]     angles [B,S,H,NA]
    dA, dt, trap [B,H,S]     d [H]                         -> out [B,S,H,P]

dA is the per-step log decay (natural ``exp``; upstream's ``ADT``), dt the step, trap the
trapezoid gate's logit. The chunk-local inputs of the backward's first stage are functions of dA
(``opgen.references.mamba3_mimo_bwd_fwd.dacs_segsum``'s formulas, built here with autograd)::

    da_cs[t] = sum_{cs<=u<=t} dA[u]     da_cs_rev[t] = sum_{t<u<ce} dA[u]
    segsum[c,i,j] = da_cs[cs+i] - da_cs[cs+j]   (i > j)

(upstream clips da_cs and da_cs_rev to <= 0, a no-op for the layer's dA = A dt <= 0; not here).

The rotary angles theta the kernels read are ``angles`` as given (``raw_angles=False``, the
convention of the stage kernels and of upstream's chunked test reference), or with
``raw_angles=True`` the running sum upstream's autograd wrapper forms from per-step angles::

    theta[t] = sum_{s<=t} pi tanh(angles[s]) dt[s]        (upstream also wraps it mod 2 pi:
                                                           no effect on cos, sin or gradients)

Math, per batch b and head h (group g = h // (H // G)), token t, rank r, chunk c = [cs, ce)::

    q~[t,r] = q[b,t,r,g] + q_bias[h,r]     k~ likewise     qk_dot[t,r,s] = <q~[t,r], k~[t,s]>
    Q = rot_theta(q~), K = rot_theta(k~): dim n with n + N/2 for n < NA, the rest pass
    PsiV[t,r] = v[t] * Psi[r]      gamma[t] = dt[t] sigmoid(trap[t])
    trap_scale[t] = gamma[t] + dt[t+1] sigmoid(-trap[t+1])        (second term 0 at t = S-1)
    raw_y[t,r] = exp(da_cs[t]) Q[t,r] S_c
               + sum_{cs<=u<t} exp(segsum[c,t,u]) trap_scale[u] sum_s <Q[t,r], K[u,s]> PsiV[u,s]
               + gamma[t] sum_s qk_dot[t,r,s] PsiV[t,s] + d PsiV[t,r]
    S_0 = 0,  S_{c+1} = exp(da_cs[ce-1]) S_c
                      + sum_{u in c} exp(da_cs_rev[u]) trap_scale[u] sum_s K[u,s]^T PsiV[u,s]
    out[t] = sum_r Phi[r] * SiLU(z[t] * Zeta[r]) * raw_y[t,r]     (gate 1 without Z)

It equals the token-by-token trapezoidal recurrence of upstream's step reference (checked in the
tests): h_t = exp(dA_t) (h_{t-1} + dt_t sigmoid(-trap_t) K_{t-1}^T PsiV_{t-1})
+ dt_t sigmoid(trap_t) K_t^T PsiV_t and y_t = Q_t h_t + d PsiV_t. The same-step term reads the
pre-rotation qk_dot (equal to the rotated product: the rotation is orthogonal and shared by the
step), as the kernels do; so no gradient of the angles comes from it.

``forward`` is differentiable in every input; ``forward_grads`` returns its autograd gradients.
``stage_two_autograd`` evaluates the same chunk loop on the backward's intermediate quantities as
leaves (per-head biased q~ / k~, theta, exp of each decay, gamma, trap_scale, per-batch Psi and
d), so each output of the backward's second stage is an autograd gradient as well.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opgen.errors import OpgenError

__all__ = ["forward", "forward_grads", "stage_two_autograd", "make_inputs", "cumulative_angles",
           "chunk_decays", "gammas", "rotate", "INPUTS"]

_WHO = "mamba3_mimo forward reference"
INPUTS = ("q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "angles", "dA", "dt", "trap",
          "mimo_z", "d", "z")
"""The differentiable inputs, in ``forward``'s order; the gradient of ``x`` is named ``"d" + x``."""


def _shapes(q: torch.Tensor, v: torch.Tensor, chunk_size: int, rotary_dim_divisor: int,
            given: dict[str, torch.Tensor | None]) -> tuple[int, ...]:
    """Raise OpgenError unless every tensor agrees with q [B,S,R,G,N] and v [B,S,H,P]."""
    for name, x in (("chunk_size", chunk_size), ("rotary_dim_divisor", rotary_dim_divisor)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise OpgenError(f"{_WHO}: {name} must be a positive int, got {x!r}")
    if q.dim() != 5 or v.dim() != 4:
        raise OpgenError(f"{_WHO}: q must be [B,S,R,G,N] and v [B,S,H,P], got {tuple(q.shape)} "
                         f"and {tuple(v.shape)}")
    B, S, R, G, N = q.shape
    H, P = v.shape[2], v.shape[3]
    if min(B, S, R, G, N, H, P) < 1 or H % G or N % 2 or rotary_dim_divisor < 2:
        raise OpgenError(f"{_WHO}: need positive sizes, H % G == 0, N even and "
                         f"rotary_dim_divisor >= 2; got q {tuple(q.shape)}, v {tuple(v.shape)}, "
                         f"rotary_dim_divisor {rotary_dim_divisor}")
    dims = {"B": B, "S": S, "R": R, "G": G, "N": N, "H": H, "P": P,
            "A": N // rotary_dim_divisor}
    layout = {"k": "BSRGN", "v": "BSHP", "z": "BSHP", "dout": "BSHP", "q_bias": "HRN",
              "k_bias": "HRN", "mimo_v": "HRP", "mimo_o": "HRP", "mimo_z": "HRP", "angles": "BSHA",
              "dA": "BHS", "dt": "BHS", "trap": "BHS", "d": "H"}
    for name, t in given.items():
        want = tuple(dims[x] for x in layout[name])
        if t is not None and tuple(t.shape) != want:
            raise OpgenError(f"{_WHO}: {name} must have shape {want} (q is {tuple(q.shape)}, v is "
                             f"{tuple(v.shape)}), got {tuple(t.shape)}")
    if (given.get("mimo_z") is None) != (given.get("z") is None):
        raise OpgenError(f"{_WHO}: the Z gate needs both mimo_z and z")
    return B, S, R, G, N, H, P


def cumulative_angles(angles: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """theta [B,S,H,NA] = running sum over S of pi tanh(angles) dt (dt [B,H,S]), differentiable."""
    return torch.cumsum(math.pi * torch.tanh(angles) * dt.permute(0, 2, 1)[..., None], dim=1)


def chunk_decays(dA: torch.Tensor, chunk_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """da_cs, da_cs_rev [B,H,S] and segsum [B,H,nc,C,C] from dA [B,H,S], differentiable.

    The values of ``dacs_segsum`` (short last chunk included: its rows past the end repeat the
    last valid cumsum); entries of segsum outside i > j are 0.
    """
    C, S = chunk_size, dA.shape[-1]
    cs_parts, rev_parts, seg_parts = [], [], []
    low = torch.ones((C, C), dtype=torch.bool, device=dA.device).tril(-1)
    for cs in range(0, S, C):
        part = torch.cumsum(dA[..., cs:cs + C], dim=-1)
        L = part.shape[-1]
        cs_parts.append(part)
        rev_parts.append(part[..., -1:] - part)
        full = torch.cat([part, part[..., -1:].expand(*part.shape[:-1], C - L)], dim=-1)
        seg_parts.append(torch.where(low, full[..., :, None] - full[..., None, :], 0.0))
    return torch.cat(cs_parts, -1), torch.cat(rev_parts, -1), torch.stack(seg_parts, dim=2)


def rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (n, n + N/2) of x [B,H,S,R,N] by theta [B,H,S,NA] for n < NA (differentiable).

    The transpose (inverse) rotation is ``rotate(x, -theta)``.
    """
    nrot, half = theta.shape[-1], x.shape[-1] // 2
    cos, sin = torch.cos(theta)[:, :, :, None], torch.sin(theta)[:, :, :, None]
    a, b = x[..., :nrot], x[..., half:half + nrot]
    return torch.cat([a * cos - b * sin, x[..., nrot:half], a * sin + b * cos,
                      x[..., half + nrot:]], dim=-1)


def _chunk_loop(qt: torch.Tensor, kt: torch.Tensor, theta: torch.Tensor, psiv: torch.Tensor,
                e_cs: torch.Tensor, e_rev: torch.Tensor, e_seg: torch.Tensor,
                e_last: torch.Tensor, gamma: torch.Tensor, trap_scale: torch.Tensor,
                d: torch.Tensor | None, chunk_size: int) -> torch.Tensor:
    """raw_y [B,H,S,R,P] from the per-head quantities (see the module docstring).

    qt, kt [B,H,S,R,N] biased, before the rotation; theta [B,H,S,NA]; psiv [B,H,S,R,P]; e_cs,
    e_rev, gamma, trap_scale [B,H,S]; e_seg [B,H,nc,C,C] = exp(segsum) (read at i > j only);
    e_last [B,H,nc] = exp(da_cs) at each chunk's last token; d [B or 1, H] or None.
    """
    B, H, S, R, N = qt.shape
    C = chunk_size
    Q, K = rotate(qt, theta), rotate(kt, theta)
    qk_dot = torch.einsum("bhtrn,bhtsn->bhtrs", qt, kt)
    state = None  # S_0 = 0
    ys = []
    for c, cs in enumerate(range(0, S, C)):
        ce = min(cs + C, S)
        L = ce - cs
        Qc, Kc, Vc = Q[:, :, cs:ce], K[:, :, cs:ce], psiv[:, :, cs:ce]
        causal = torch.ones((L, L), dtype=torch.bool, device=qt.device).tril(-1)
        w = torch.where(causal, e_seg[:, :, c, :L, :L], 0.0) * trap_scale[:, :, None, cs:ce]
        scores = torch.einsum("bhtrn,bhusn->bhtrus", Qc, Kc)
        y = torch.einsum("bhtrus,bhtu,bhusp->bhtrp", scores, w, Vc)
        y = y + gamma[:, :, cs:ce, None, None] * torch.einsum(
            "bhtrs,bhtsp->bhtrp", qk_dot[:, :, cs:ce], Vc)
        if state is not None:
            y = y + e_cs[:, :, cs:ce, None, None] * torch.einsum("bhtrn,bhnp->bhtrp", Qc, state)
        if d is not None:
            y = y + d[:, :, None, None, None] * Vc
        ys.append(y)
        if ce < S:  # the state leaving the last chunk is not used
            wk = (e_rev[:, :, cs:ce] * trap_scale[:, :, cs:ce])[..., None, None]
            update = torch.einsum("bhusn,bhusp->bhnp", Kc * wk, Vc)
            state = update if state is None else e_last[:, :, c, None, None] * state + update
    return torch.cat(ys, dim=2)


def _project(raw_y: torch.Tensor, mimo_o: torch.Tensor, mimo_z: torch.Tensor | None,
             z: torch.Tensor | None) -> torch.Tensor:
    """out [B,S,H,P] = sum_r Phi * SiLU(z Zeta) * raw_y; raw_y [B,H,S,R,P], Phi/Zeta [H,R,P]."""
    y = raw_y.permute(0, 2, 3, 1, 4)  # [B,S,R,H,P]
    if z is not None:
        y = y * F.silu(z[:, :, None] * mimo_z.permute(1, 0, 2))
    return (mimo_o.permute(1, 0, 2) * y).sum(2)


def _per_head(x: torch.Tensor, bias: torch.Tensor, H: int) -> torch.Tensor:
    """[B,S,R,G,N] + bias [H,R,N] -> the biased per-head tensor [B,H,S,R,N]."""
    G = x.shape[3]
    group = torch.arange(H, device=x.device) // (H // G)
    return x[:, :, :, group].permute(0, 3, 1, 2, 4) + bias[None, :, None]


def gammas(dt: torch.Tensor, trap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gamma and trap_scale [B,H,S] from dt and trap [B,H,S] (differentiable)."""
    gamma = dt * torch.sigmoid(trap)
    shifted = F.pad(dt[..., 1:] * torch.sigmoid(-trap[..., 1:]), (0, 1))  # 0 at the last token
    return gamma, gamma + shifted


def _last_of_chunks(da_cs: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B,H,nc]: da_cs at each chunk's last token (S - 1 for a short last chunk)."""
    S = da_cs.shape[-1]
    idx = [min(cs + chunk_size, S) - 1 for cs in range(0, S, chunk_size)]
    return da_cs[..., idx]


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_bias: torch.Tensor,
            k_bias: torch.Tensor, mimo_v: torch.Tensor, mimo_o: torch.Tensor,
            angles: torch.Tensor, dA: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
            mimo_z: torch.Tensor | None = None, d: torch.Tensor | None = None,
            z: torch.Tensor | None = None, chunk_size: int = 16, rotary_dim_divisor: int = 4,
            raw_angles: bool = False) -> torch.Tensor:
    """The layer's output out [B,S,H,P] in float64, differentiable in every tensor argument.

    Args:
        q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap, mimo_z, d, z: the inputs
            of the module docstring (any dtype; the math runs in float64).
        chunk_size: C; S need not be a multiple of it. The output does not depend on it.
        rotary_dim_divisor: N // rotary_dim_divisor dims (paired with n + N/2) are rotated.
        raw_angles: angles are per-step (theta is their running sum) instead of theta itself.
    """
    given = {"k": k, "v": v, "q_bias": q_bias, "k_bias": k_bias, "mimo_v": mimo_v,
             "mimo_o": mimo_o, "angles": angles, "dA": dA, "dt": dt, "trap": trap,
             "mimo_z": mimo_z, "d": d, "z": z}
    B, S, R, G, N, H, P = _shapes(q, v, chunk_size, rotary_dim_divisor, given)
    x = {n: (t.to(torch.float64) if t is not None else None) for n, t in dict(given, q=q).items()}
    theta = cumulative_angles(x["angles"], x["dt"]) if raw_angles else x["angles"]
    da_cs, da_cs_rev, segsum = chunk_decays(x["dA"], chunk_size)
    gamma, trap_scale = gammas(x["dt"], x["trap"])
    psiv = x["v"].permute(0, 2, 1, 3)[:, :, :, None] * x["mimo_v"][None, :, None]
    raw_y = _chunk_loop(_per_head(x["q"], x["q_bias"], H), _per_head(x["k"], x["k_bias"], H),
                        theta.permute(0, 2, 1, 3), psiv, torch.exp(da_cs), torch.exp(da_cs_rev),
                        torch.exp(segsum), torch.exp(_last_of_chunks(da_cs, chunk_size)), gamma,
                        trap_scale, None if d is None else x["d"][None], chunk_size)
    return _project(raw_y, x["mimo_o"], x["mimo_z"], x["z"])


def forward_grads(dout: torch.Tensor, chunk_size: int = 16, rotary_dim_divisor: int = 4,
                  raw_angles: bool = False, **inputs: torch.Tensor | None
                  ) -> dict[str, torch.Tensor | None]:
    """The gradient of sum(dout * forward(**inputs)) with respect to every input, by autograd.

    Args:
        dout: [B,S,H,P], the gradient of the output.
        inputs: ``forward``'s tensor arguments by name (absent optional ones may be None or left
            out); other keys are ignored, so ``make_inputs``' dict can be passed as is.

    Returns:
        {"d" + name: float64 gradient of the input's shape, None for an absent optional input}
        for every name of ``INPUTS`` (``ddA``, ``ddt``, ``dangles``, ``dd`` for d, ...).
    """
    with torch.enable_grad():
        leaves = {n: (inputs[n].detach().to(torch.float64).requires_grad_(True)
                      if inputs.get(n) is not None else None) for n in INPUTS}
        out = forward(**leaves, chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor,
                      raw_angles=raw_angles)
        names = [n for n in INPUTS if leaves[n] is not None]
        grads = torch.autograd.grad(out, [leaves[n] for n in names],
                                    grad_outputs=dout.detach().to(torch.float64))
    result: dict[str, torch.Tensor | None] = {"d" + n: None for n in INPUTS}
    result.update({"d" + n: g for n, g in zip(names, grads)})
    return result


def stage_two_autograd(chunk_size: int = 16, rotary_dim_divisor: int = 4,
                       **inputs: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
    """The second stage's outputs as autograd gradients of the chunk loop's intermediates.

    Takes the stage kernels' tensors by name (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o,
    angles = theta, da_cs, da_cs_rev, dt, trap, segsum, and mimo_z, d, z or None; other keys are
    ignored) and returns what ``opgen.references.mamba3_mimo_bwd_bwd.golden`` returns, keys and
    shapes alike, each the gradient of sum(dout * out) with respect to one leaf: dq / dk of the
    per-head biased q~ / k~, dangles of theta, dfactor of trap_scale, dgamma_diag of the same-step
    gamma, dda_cs / dda_cs_rev of exp(da_cs) / exp(da_cs_rev), dssda of exp(segsum) (transposed
    to [key, query]), dda = exp(da_cs[last]) times the gradient of exp(da_cs[last]) of the chunk's
    state decay, dmimo_v / dd of per-batch copies of Psi / d, dv of v.
    """
    a = {n: inputs.get(n) for n in ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o",
                                    "angles", "da_cs", "da_cs_rev", "dt", "trap", "segsum",
                                    "mimo_z", "d", "z")}
    _shapes(a["q"], a["v"], chunk_size, rotary_dim_divisor,
            {n: a[n] for n in ("k", "v", "mimo_z", "z", "d", "dout", "angles")})
    B, S = a["q"].shape[:2]
    H = a["v"].shape[2]

    def f64(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(torch.float64)

    C = chunk_size
    gamma0, ts0 = gammas(f64(a["dt"]), f64(a["trap"]))
    last = torch.exp(_last_of_chunks(f64(a["da_cs"]), C))
    with torch.enable_grad():
        leaf = {
            "qt": _per_head(f64(a["q"]), f64(a["q_bias"]), H),
            "kt": _per_head(f64(a["k"]), f64(a["k_bias"]), H),
            "theta": f64(a["angles"]).permute(0, 2, 1, 3), "v": f64(a["v"]),
            "psi": f64(a["mimo_v"])[None].repeat(B, 1, 1, 1), "e_cs": torch.exp(f64(a["da_cs"])),
            "e_rev": torch.exp(f64(a["da_cs_rev"])), "e_seg": torch.exp(f64(a["segsum"])),
            "e_last": last, "gamma": gamma0, "ts": ts0,
        }
        if a["d"] is not None:
            leaf["d"] = f64(a["d"])[None].repeat(B, 1)
        leaf = {n: t.clone().requires_grad_(True) for n, t in leaf.items()}
        psiv = leaf["v"].permute(0, 2, 1, 3)[:, :, :, None] * leaf["psi"][:, :, None]
        raw_y = _chunk_loop(leaf["qt"], leaf["kt"], leaf["theta"], psiv, leaf["e_cs"],
                            leaf["e_rev"], leaf["e_seg"], leaf["e_last"], leaf["gamma"],
                            leaf["ts"], leaf.get("d"), C)
        gated = a["z"] is not None
        out = _project(raw_y, f64(a["mimo_o"]), f64(a["mimo_z"]) if gated else None,
                       f64(a["z"]) if gated else None)
        names = list(leaf)
        grads = dict(zip(names, torch.autograd.grad(out, [leaf[n] for n in names],
                                                    grad_outputs=f64(a["dout"]),
                                                    allow_unused=True)))
    grads = {n: (g if g is not None else torch.zeros_like(leaf[n])) for n, g in grads.items()}
    chunk_of = torch.arange(S, device=last.device) // C
    return {
        "dq": grads["qt"].permute(0, 2, 3, 1, 4), "dk": grads["kt"].permute(0, 2, 3, 1, 4),
        "dv": grads["v"], "dmimo_v": grads["psi"], "dangles": grads["theta"].permute(0, 2, 1, 3),
        "dfactor": grads["ts"], "dgamma_diag": grads["gamma"],
        "dda": (grads["e_last"] * last)[..., chunk_of], "dssda": grads["e_seg"].transpose(-1, -2),
        "dda_cs_rev": grads["e_rev"], "dda_cs": grads["e_cs"],
        "dd": grads["d"] if a["d"] is not None else None,
    }


def make_inputs(B: int, S: int, H: int, G: int, N: int, P: int, R: int, chunk_size: int = 16,
                rotary_dim_divisor: int = 4, dtype: torch.dtype = torch.float64,
                has_z: bool = True, has_d: bool = True, seed: int = 0,
                device: str | torch.device = "cpu") -> dict[str, object]:
    """Seeded random inputs of ``forward`` plus ``dout``, distributed as upstream's test inputs.

    q, k, v, z, dout ~ N(0,1) and trap ~ U(0,1) in ``dtype``; q_bias, k_bias, mimo_z, d ~ N(0,1),
    mimo_v, mimo_o ~ N(0,1) / R, angles ~ U(0,1), dt = softplus(-3 + N(0,1)), dA = -dt U(0,1),
    all float64 (the drawing is float32, one CPU generator, in the order listed in the code). z,
    mimo_z and d are always drawn and set to None when not wanted.

    Returns:
        ``forward``'s tensor arguments and ``dout`` by name, plus chunk_size and
        rotary_dim_divisor: ready for ``forward_grads(**inputs)``.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    NA = N // rotary_dim_divisor
    draws = [  # name, shape, distribution, in the input dtype
        ("q", (B, S, R, G, N), "n", True), ("k", (B, S, R, G, N), "n", True),
        ("v", (B, S, H, P), "n", True), ("q_bias", (H, R, N), "n", False),
        ("k_bias", (H, R, N), "n", False), ("mimo_v", (H, R, P), "n/R", False),
        ("mimo_o", (H, R, P), "n/R", False), ("z", (B, S, H, P), "n", True),
        ("mimo_z", (H, R, P), "n", False), ("d", (H,), "n", False),
        ("angles", (B, S, H, NA), "u", False), ("dt", (B, H, S), "softplus", False),
        ("dA", (B, H, S), "-dt u", False), ("trap", (B, H, S), "u", True),
        ("dout", (B, S, H, P), "n", True),
    ]
    out: dict[str, object] = {}
    for name, shape, dist, low in draws:
        if dist in ("n", "n/R", "softplus"):
            x = torch.randn(shape, generator=gen, dtype=torch.float32)
        else:
            x = torch.rand(shape, generator=gen, dtype=torch.float32)
        if dist == "n/R":
            x = x / R
        elif dist == "softplus":
            x = F.softplus(-3.0 + x)
        elif dist == "-dt u":
            x = -out["dt"] * x
        out[name] = x.to(dtype if low else torch.float64)
    if not has_z:
        out["z"] = out["mimo_z"] = None
    if not has_d:
        out["d"] = None
    out = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in out.items()}
    out["chunk_size"] = chunk_size
    out["rotary_dim_divisor"] = rotary_dim_divisor
    return out
