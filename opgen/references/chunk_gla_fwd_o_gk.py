"""Reference math of chunk_gla_fwd_o_gk, the GLA chunk output stage, independent of any kernel.

For every token t of chunk c = t // BT (chunk start cs = c * BT)::

    o[t] = scale * (q[t] * exp(g[t])) @ h[c] + sum_{cs <= s <= t} A[t, s - cs] * v[s]

with exp2 in place of exp when ``use_exp2``. Shapes: q [B,T,H,K], v [B,T,H,V], g [B,T,H,K],
A [B,T,H,BT], h [B,NT,H,K,V] with NT = ceil(T/BT), o [B,T,H,V]. T need not be a multiple of BT;
the last chunk is then shorter and only the first columns of its rows of A are read. Entries of A
above the diagonal (s > t) and beyond the chunk's length are never read.

Three evaluations of the same loop share one code path:

- ``golden``: float64 (on the CPU unless a device is given), the truth every kernel is judged against;
- ``reference_fp32``: float32 on the CPU, the fp32 reference of the dual benchmark;
- ``magnitude``: float64 with the absolute value of every factor, i.e. sum |term| per output
  element, the scale of cancellation used by ``opgen.run.accuracy.domain_check``.

``reference_half`` computes the op the way FLA's half-precision kernel rounds it (q * exp(g), h
and A in the input dtype, exact sums, the output rounded): the yardstick of the spec's
``accuracy.half_ratio``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opgen.errors import OpgenError

__all__ = ["golden", "reference_fp32", "magnitude", "reference_half", "make_inputs"]

_WHO = "chunk_gla_fwd_o_gk reference"


def _check(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
           chunk_size: int) -> None:
    """Raise OpgenError unless the shapes agree with the op's signature."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise OpgenError(f"{_WHO}: chunk_size must be a positive int, got {chunk_size!r}")
    if q.dim() != 4:
        raise OpgenError(f"{_WHO}: q must be [B,T,H,K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1] if v.dim() == 4 else -1
    nt = math.ceil(T / chunk_size)
    want = {"v": (B, T, H, V), "g": (B, T, H, K), "A": (B, T, H, chunk_size), "h": (B, nt, H, K, V)}
    for name, t in (("v", v), ("g", g), ("A", A), ("h", h)):
        if tuple(t.shape) != want[name]:
            raise OpgenError(f"{_WHO}: {name} must have shape {want[name]} (q is "
                             f"{tuple(q.shape)}, chunk_size {chunk_size}), got {tuple(t.shape)}")


def _evaluate(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
              scale: float, chunk_size: int, use_exp2: bool, dtype: torch.dtype,
              absolute: bool, device: str | torch.device = "cpu") -> torch.Tensor:
    """Run the chunk loop in ``dtype`` on ``device``; with ``absolute``, every factor is |factor|."""
    _check(q, v, g, A, h, chunk_size)

    def cast(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to(device=device, dtype=dtype)
        return t.abs() if absolute else t

    q, v, A, h = cast(q), cast(v), cast(A), cast(h)
    g = g.detach().to(device=device, dtype=dtype)  # exp(g) > 0 already
    gate = torch.exp2(g) if use_exp2 else torch.exp(g)
    s = abs(scale) if absolute else scale
    qg = q * gate * s

    B, T, H, _ = q.shape
    o = torch.zeros((B, T, H, v.shape[-1]), dtype=dtype, device=device)
    for c, start in enumerate(range(0, T, chunk_size)):
        end = min(start + chunk_size, T)
        n = end - start
        inter = torch.einsum("bthk,bhkv->bthv", qg[:, start:end], h[:, c])
        causal = torch.ones((n, n), dtype=torch.bool, device=device).tril()  # [t, s]: s <= t
        a = A[:, start:end, :, :n].where(causal[None, :, None, :], 0.0)  # [b, t, h, s]
        intra = torch.einsum("bths,bshv->bthv", a, v[:, start:end])
        o[:, start:end] = inter + intra
    return o


def golden(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
           scale: float, chunk_size: int, use_exp2: bool = False,
           device: str | torch.device = "cpu") -> torch.Tensor:
    """Float64 golden output o [B,T,H,V]; entries of A it never reads may hold NaN.

    Args:
        q, v, g, A, h: the op's inputs, any device and dtype (cast to float64 on ``device``).
        scale: factor of the inter-chunk term.
        chunk_size: BT, tokens per chunk.
        use_exp2: use exp2(g) instead of exp(g).
        device: where to compute (the CPU by default; a GPU's float64 is as exact and faster
            for the tuner's large cases).

    Returns:
        A float64 tensor on ``device``.
    """
    return _evaluate(q, v, g, A, h, scale, chunk_size, use_exp2, torch.float64, absolute=False, device=device)


def reference_fp32(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, A: torch.Tensor,
                   h: torch.Tensor, scale: float, chunk_size: int,
                   use_exp2: bool = False, device: str | torch.device = "cpu") -> torch.Tensor:
    """The golden's math evaluated in float32 on the CPU: the fp32 side of the dual benchmark.

    Returns:
        A float32 CPU tensor [B,T,H,V] (not rounded to q's dtype).
    """
    return _evaluate(q, v, g, A, h, scale, chunk_size, use_exp2, torch.float32, absolute=False, device=device)


def magnitude(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
              scale: float, chunk_size: int, use_exp2: bool = False,
              device: str | torch.device = "cpu") -> torch.Tensor:
    """Float64 sum of |term| per output element: |scale| * (|q| exp(g)) @ |h| + tril|A| @ |v|.

    An output much smaller than its magnitude is the result of cancellation; its error is judged
    against the magnitude (see ``opgen.run.accuracy.domain_check``).
    """
    return _evaluate(q, v, g, A, h, scale, chunk_size, use_exp2, torch.float64, absolute=True, device=device)


def reference_half(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
                   scale: float, chunk_size: int, use_exp2: bool = False,
                   device: str | torch.device = "cpu") -> torch.Tensor:
    """The op as a half-precision kernel in FLA's style computes it: q * exp(g), h and A rounded to
    q's dtype (the operands of its two products), the scale applied after the first product, the
    sums exact (float64 here; the kernel's fp32 accumulation adds far less), the output rounded
    to q's dtype. On the bench inputs its rel. L2 against the golden is 2.35e-3 (bf16) and
    2.95e-4 (fp16) at scale K**-0.5, where FLA 0.6.0 measured 2.36-2.47e-3 and 2.94-3.08e-4 on
    the H200 (benchmarks/h200_chunk_gla_fwd_o_gk_vs_fla.txt).

    Returns:
        A tensor of q's dtype on ``device`` [B,T,H,V].
    """
    _check(q, v, g, A, h, chunk_size)
    half = q.dtype

    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=device).to(half).to(torch.float64)

    g64 = g.detach().to(device=device, dtype=torch.float64)
    gate = torch.exp2(g64) if use_exp2 else torch.exp(g64)
    qg = (q.detach().to(device=device, dtype=torch.float64) * gate).to(half).to(torch.float64)
    o = _evaluate(qg, rounded(v), torch.zeros_like(g64), rounded(A), rounded(h), scale, chunk_size, False,
                  torch.float64, absolute=False, device=device)
    return o.to(half)


def make_inputs(B: int, T: int, H: int, K: int, V: int, chunk_size: int,
                dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                device: str | torch.device = "cpu") -> dict[str, object]:
    """Realistic random inputs, identical for identical arguments on every device.

    q, v ~ N(0, 1) in ``dtype``; g is the chunk-local cumulative sum of per-step log gates
    logsigmoid(N(0,1)) / 16 (so exp(g) and exp2(g) lie in (0, 1] and decay along the chunk);
    A ~ N(0, 1) * K**-0.5 * 0.5 in every position (the parts a kernel must not read are filled
    too, so a missing mask shows); h ~ N(0, 1) * 0.1. All drawn on the CPU from one seeded
    torch.Generator, then moved to ``device``.

    Returns:
        {"q", "v", "g", "A", "h", "scale": K**-0.5, "chunk_size"}: ready for ``golden(**inputs)``.
    """
    if isinstance(chunk_size, bool) or chunk_size < 1 or min(B, T, H, K, V) < 1:
        raise OpgenError(f"make_inputs: every size must be positive, got B={B} T={T} H={H} K={K} "
                         f"V={V} chunk_size={chunk_size}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    nt = math.ceil(T / chunk_size)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    q = randn(B, T, H, K).to(dtype)
    v = randn(B, T, H, V).to(dtype)
    step = F.logsigmoid(randn(B, T, H, K)) / 16
    g = torch.empty_like(step)
    for start in range(0, T, chunk_size):
        g[:, start:start + chunk_size] = step[:, start:start + chunk_size].cumsum(dim=1)
    A = randn(B, T, H, chunk_size) * (K ** -0.5 * 0.5)
    h = randn(B, nt, H, K, V) * 0.1
    out: dict[str, object] = {name: t.to(device) for name, t in
                              (("q", q), ("v", v), ("g", g), ("A", A), ("h", h))}
    out["scale"] = K ** -0.5
    out["chunk_size"] = chunk_size
    return out
