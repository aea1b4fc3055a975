"""Inputs of the Mamba-3 MIMO backward's first stage: seeded random draws after upstream's test
``build_inputs`` (``make_inputs``), the chunk-local decay quantities built from the per-step log decay
(``dacs_segsum``), and the host-side tail contract (``pad_to_chunks``). ``opgen.references.
mamba3_mimo_bwd_fwd`` re-exports all three beside its golden.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from opgen.errors import OpgenError

__all__ = ["make_inputs", "pad_to_chunks", "dacs_segsum", "positive_int"]

_WHO = "mamba3_mimo_bwd_fwd reference"


def positive_int(name: str, x: object) -> int:
    """``x`` if it is a positive int (bool excluded), else an OpgenError naming ``name``."""
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise OpgenError(f"{_WHO}: {name} must be a positive int, got {x!r}")
    return x


def _from_cumsum(cs: torch.Tensor, lengths: list[int], chunk_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """da_cs_rev [..., S] and segsum [..., nc, C, C] from the chunk-local cumsum cs [..., S].

    ``lengths`` are the chunks' valid lengths; positions past a short chunk's end behave as dA = 0
    (their cumsum repeats the last valid value). Differences are taken in float64.
    """
    C = chunk_size
    c64 = cs.double()
    rev = torch.empty_like(c64)
    seg = torch.zeros((*cs.shape[:-1], len(lengths), C, C), dtype=torch.float64, device=cs.device)
    low = torch.ones((C, C), dtype=torch.bool, device=cs.device).tril(-1)
    for c, L in enumerate(lengths):
        part = c64[..., c * C:c * C + L]
        rev[..., c * C:c * C + L] = part[..., -1:] - part
        full = torch.cat([part, part[..., -1:].expand(*part.shape[:-1], C - L)], dim=-1)
        seg[..., c, :, :] = torch.where(low, full[..., :, None] - full[..., None, :], 0.0)
    return rev.to(cs.dtype), seg.to(cs.dtype)


def dacs_segsum(dA: torch.Tensor, chunk_size: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """da_cs, da_cs_rev [B,H,S] and segsum [B,H,nc,C,C] from the per-step log decay dA [B,H,S].

    Per chunk [cs, ce) (the last one may be shorter, L = ce - cs), with dA taken as 0 past S::

        da_cs[t]      = sum_{cs <= u <= t} dA[u]             (inclusive, restarts every chunk)
        da_cs_rev[t]  = sum_{t < u < ce} dA[u] = da_cs[ce-1] - da_cs[t]     (exclusive, reverse)
        segsum[c,i,j] = sum_{j < u <= i} dA[cs+u] = da_cs[cs+i] - da_cs[cs+j] for i > j, else 0

    In a short last chunk the rows i >= L of segsum (never read for a valid token) hold
    da_cs[S-1] - da_cs[cs+j] for j < L and 0 for j >= L, i.e. the values of a zero-extended dA,
    which is what ``pad_to_chunks`` rebuilds. These are the quantities of upstream's
    compute_dacs_segsum (its Triton version clips them to <= 0, a no-op for dA <= 0). da_cs is the
    float64 cumsum rounded to dA's dtype; da_cs_rev and segsum are float64 differences of that
    rounded da_cs, rounded in turn, so the three agree exactly with a rebuild from da_cs alone.
    """
    C = positive_int("chunk_size", chunk_size)
    S = dA.shape[-1]
    lengths = [min(C, S - cs) for cs in range(0, S, C)]
    d64 = dA.detach().double()
    cs = torch.cat([d64[..., i * C:i * C + L].cumsum(-1) for i, L in enumerate(lengths)], dim=-1)
    da_cs = cs.to(dA.dtype)
    da_cs_rev, segsum = _from_cumsum(da_cs, lengths, C)
    return da_cs, da_cs_rev, segsum


def make_inputs(B: int, S: int, H: int, G: int, N: int, P: int, R: int, chunk_size: int = 16,
                rotary_dim_divisor: int = 4, dtype: torch.dtype = torch.bfloat16,
                has_z: bool = True, has_d: bool = True, seed: int = 0,
                device: str | torch.device = "cpu") -> dict[str, object]:
    """Realistic random inputs after upstream's test ``build_inputs``, identical on every device.

    Drawn in this order from one seeded CPU torch.Generator, then moved to ``device``: q, k
    [B,S,R,G,N] and v [B,S,H,P] ~ N(0,1) in ``dtype``; q_bias, k_bias ~ N(0,1) fp32; mimo_v,
    mimo_o ~ N(0,1)/R fp32; z ~ N(0,1) in ``dtype``; mimo_z ~ N(0,1) fp32; d ~ N(0,1) fp32;
    angles ~ U(0,1) fp32; dt = softplus(-3 + N(0,1)) fp32 [B,H,S]; dA = -dt * U(0,1); trap ~ U(0,1)
    in ``dtype``; dout ~ N(0,1) in ``dtype``. z, mimo_z and d are always drawn (so has_z / has_d do
    not change the other tensors) and set to None when not wanted. da_cs, da_cs_rev and segsum
    (fp32) come from dA by ``dacs_segsum``; S need not be a multiple of chunk_size.

    Returns:
        Every argument of ``golden`` by name (device excluded): ready for ``golden(**inputs)``.
    """
    for name, x in (("B", B), ("S", S), ("H", H), ("G", G), ("N", N), ("P", P), ("R", R),
                    ("chunk_size", chunk_size), ("rotary_dim_divisor", rotary_dim_divisor)):
        positive_int(name, x)
    if H % G or N % 2 or rotary_dim_divisor < 2:
        raise OpgenError(f"make_inputs: need H % G == 0, N even, rotary_dim_divisor >= 2; got "
                         f"H={H} G={G} N={N} rotary_dim_divisor={rotary_dim_divisor}")
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=gen, dtype=torch.float32)

    out: dict[str, object] = {}
    out["q"] = randn(B, S, R, G, N).to(dtype)
    out["k"] = randn(B, S, R, G, N).to(dtype)
    out["v"] = randn(B, S, H, P).to(dtype)
    out["q_bias"] = randn(H, R, N)
    out["k_bias"] = randn(H, R, N)
    out["mimo_v"] = randn(H, R, P) / R
    out["mimo_o"] = randn(H, R, P) / R
    z, mimo_z, d = randn(B, S, H, P).to(dtype), randn(H, R, P), randn(H)
    out["angles"] = rand(B, S, H, N // rotary_dim_divisor)
    dt = F.softplus(-3.0 + randn(B, H, S))
    dA = -dt * rand(B, H, S)
    out["trap"] = rand(B, H, S).to(dtype)
    out["dout"] = randn(B, S, H, P).to(dtype)
    out["dt"] = dt
    out["da_cs"], out["da_cs_rev"], out["segsum"] = dacs_segsum(dA, chunk_size)
    out["mimo_z"] = mimo_z if has_z else None
    out["z"] = z if has_z else None
    out["d"] = d if has_d else None
    out = {name: (t.to(device) if isinstance(t, torch.Tensor) else t) for name, t in out.items()}
    out["chunk_size"] = chunk_size
    out["rotary_dim_divisor"] = rotary_dim_divisor
    return out


def pad_to_chunks(inputs: dict[str, object], chunk_size: int) -> dict[str, object]:
    """The host-side tail contract: right-pad the sequence to whole chunks.

    q, k, v, dout, angles, z (dim 1) and dt, trap (dim 2) are zero-padded; da_cs is extended
    with the last value of its short chunk (dA = 0 there); da_cs_rev and segsum of that last chunk
    are rebuilt from the extended da_cs (``dacs_segsum``'s formulas), earlier chunks are kept.
    ``golden(**pad_to_chunks(x, C))`` cropped to S equals ``golden(**x)``. Other entries pass
    unchanged; without a tail a shallow copy is returned.

    Args:
        inputs: keyword arguments of ``golden`` (e.g. from ``make_inputs``).
        chunk_size: C; must match inputs["chunk_size"] when that is present.
    """
    C = positive_int("chunk_size", chunk_size)
    if inputs.get("chunk_size", C) != C:
        raise OpgenError(f"pad_to_chunks: chunk_size {C} differs from inputs['chunk_size'] "
                         f"{inputs['chunk_size']}")
    out = dict(inputs)
    S = inputs["q"].shape[1]
    pad = -S % C
    if pad == 0:
        return out

    def zero_pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        shape = list(t.shape)
        shape[dim] = pad
        return torch.cat([t, t.new_zeros(shape)], dim=dim)

    for name in ("q", "k", "v", "dout", "angles", "z"):
        if inputs.get(name) is not None:
            out[name] = zero_pad(inputs[name], 1)
    for name in ("dt", "trap"):
        out[name] = zero_pad(inputs[name], 2)
    cs = inputs["da_cs"]
    da_cs = torch.cat([cs, cs[..., -1:].expand(*cs.shape[:-1], pad)], dim=-1)
    start = S - S % C  # the short chunk's first token
    rev_tail, seg_tail = _from_cumsum(da_cs[..., start:], [C], C)
    out["da_cs"] = da_cs
    out["da_cs_rev"] = torch.cat([inputs["da_cs_rev"][..., :start], rev_tail], dim=-1)
    seg = inputs["segsum"].clone()
    seg[:, :, -1] = seg_tail[:, :, 0]
    out["segsum"] = seg
    return out
