"""Baselines of mamba3_mimo_bwd_bwd: upstream's TileLang kernel ``mamba_mimo_bwd_bwd``.

The kernel is ``mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py`` of the mamba-ssm 2.3.2.post1
sdist, run by tilelang 0.1.8 (``source .tilelang/activate.sh``: the folder that
``tilelang_bundle.sh`` builds). Upstream's signature::

    mamba_mimo_bwd_bwd(B, S, H, G, N, P, R, hasZ, hasD, reduceO, chunk_size=16,
                       rotary_dim_divisor=4, dtype='float16', threads=256, num_stages=0)
        -> kernel(DOUT, Q, K, V, Q_BIAS, K_BIAS, MIMO_V, MIMO_O, DK, DV, DMIMO_V, STATES, DQ, Z,
                  MIMO_Z, ANGLES, DA_CS, DA_CS_REV, DT, TRAP, DFACTOR, DGAMMA_DIAG, DANGLES, D, DD,
                  QK_DOT, DDA, DSSDA, DDA_CS_REV, DDA_CS, SEGSUM)

``@tilelang.jit(out_idx=[])``: the builder call compiles (or loads from TileLang's disk cache) and
returns a kernel that writes into buffers the caller allocates. One program per (head, batch)
walks the chunks from the last to the first with the state gradient, the R ranks folded into the
chunk axis (C * R rows per GEMM).

``tilelang`` builds it as upstream's ``mamba_mimo_bwd_combined`` does: B, S, H and G dynamic
(``T.dynamic``), threads 256 (its ``bb_threads``), num_stages 0, ``reduceO=True`` (dout is the
reduced [B,S,H,P]); ``tilelang_static`` builds it for each call's B, S, H and G as constants. The
buffers are allocated as that wrapper allocates them (dq, dk, dv, dmimo_v, dd empty, the rest
zero-filled). The compiled kernel is kept per configuration in this process, so a call times the
allocations and the launch, not the builder call the wrapper makes each time.

Layouts are ours (the same dims in the same order), except dq and dk: upstream's DQ / DK are
[B, S*R, H, N] (row t*R + r), the same memory as our [B,S,R,H,N], passed as that view. The
query/key group of head h is h // (H // G) in both; the kernel takes any G dividing H. What
upstream computes differently:

- Output dtypes: dq, dk and dv in the input dtype (bfloat16 on the official shapes); dmimo_v,
  dangles, dfactor, dgamma_diag, dda, dssda, dda_cs_rev, dda_cs and dd in float32, whatever
  ``output_dtype`` says (no cast is timed; the bench's errors and agreement are taken in float64).
- dssda: upstream stores the products at every [key, query] pair of a chunk, where the contract
  has 0 unless the key comes first (the entries a reduction reads); ``from_upstream`` zeroes the
  others in place (one pass over dssda, inside the timed call).
- states and qk_dot are read in the input dtype, as upstream's first stage writes them; ours
  (float32 by default) are rounded to it once per tensor (kept while the tensor lives, so the
  timed calls, which pass the same tensors, do not repeat the cast). trap is read in the input
  dtype too (rounded on every call, [B,H,S]).
- Rounding to the input dtype inside the kernel, where ours keeps float32: the parameters Phi,
  Psi, Zeta, q_bias and k_bias as loaded; the biased q~, k~ and the rotated Q, K; dt and the
  shifted dt, the shifted gamma and trap_scale, and gamma in the same-step term; K * trap_scale;
  dY = dout Phi (times the gate) before every product; the decayed, masked scores before the
  score-times-dY GEMM; dPsiV before dv and dmimo_v; dv, accumulated over R in the input dtype;
  PsiV; the state gradient before its GEMMs (the carried one stays float32); the states; dY
  decayed by exp(da_cs) before the state-gradient update; dQ and dK before the inverse rotation
  and after it, and the score-times-gradient products that dssda sums. GEMMs take input-dtype
  operands and accumulate in float32, as do the reductions into dmimo_v, dd, dfactor,
  dgamma_diag, dda, dda_cs and dda_cs_rev.
- The same-step term uses the pre-rotation qk_dot, as ours does.
- Fast math (``TL_ENABLE_FAST_MATH``): approximate exp, sigmoid, tanh, sin and cos (the last two
  lose accuracy as |theta| grows past pi); SiLU(u) is computed as t tanh(t) + t with t = u / 2.

Inputs upstream does not take raise ``UnsupportedInput``: float32 q/k/v/dout (upstream stores its
tiles in the input dtype; its tests run bfloat16), a sequence with a tail (upstream's test inputs
assert S % chunk_size == 0 and its reductions after this kernel assert it), N below 32 (at N = 16
the kernel does not compile at 256 threads: TileLang reports "m_warp * n_warp must equal
num_warps", on the official N16 shape with or without Z), one of mimo_z / z without the other,
tensors off a CUDA device.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from opgen.baselines.tilelang_mamba3 import KernelConfig, build, check_case, dtype_name, import_kernel, run
from opgen.errors import UnsupportedInput

__all__ = ["KernelConfig", "UPSTREAM_ARGS", "OUTPUTS", "MIN_N", "THREADS", "kernel_config",
           "plain_cast", "to_upstream", "from_upstream", "tilelang", "tilelang_static", "compiled"]

# The kernel's parameters, in order (mamba3_mimo_bwd.py: mamba_mimo_bwd_bwd_kernel).
UPSTREAM_ARGS = ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "dk", "dv",
                 "dmimo_v", "states", "dq", "z", "mimo_z", "angles", "da_cs", "da_cs_rev", "dt",
                 "trap", "dfactor", "dgamma_diag", "dangles", "d", "dd", "qk_dot", "dda", "dssda",
                 "dda_cs_rev", "dda_cs", "segsum")
# Our op's outputs, in order (specs/mamba3_mimo_bwd_bwd.yaml: signature.outputs).
OUTPUTS = ("dq", "dk", "dv", "dmimo_v", "dangles", "dfactor", "dgamma_diag", "dda", "dssda",
           "dda_cs_rev", "dda_cs", "dd")
MIN_N = 32
"""The smallest N taken: N = 16 does not compile upstream (the module docstring)."""

_WHO = "tilelang baseline of mamba3_mimo_bwd_bwd"
THREADS = 256
"""The second stage's threads per program (mamba_mimo_bwd_combined's bb_threads)."""
# buffers the wrapper zero-fills (the kernel writes every entry of whole chunks anyway)
_ZEROED = ("dangles", "dfactor", "dgamma_diag", "dda", "dssda", "dda_cs_rev", "dda_cs")

Cast = Callable[[str, torch.Tensor, torch.dtype], torch.Tensor]


def kernel_config(N: int, P: int, R: int, S: int, has_z: bool, has_d: bool, chunk_size: int,
                  rotary_dim_divisor: int, dtype: str) -> KernelConfig:
    """The configuration a case compiles to (256 threads, as mamba_mimo_bwd_combined launches
    it); raises UnsupportedInput where upstream has none.

    ``dtype`` is the input dtype's name (``bfloat16``); S only decides whether there is a tail.
    """
    check_case(_WHO, dtype, S, chunk_size, "upstream takes whole chunks only (its test inputs and "
               "the reductions after this kernel assert S % chunk_size == 0)")
    if N < MIN_N:
        raise UnsupportedInput(f"{_WHO}: N={N} is below {MIN_N}: upstream's kernel does not compile "
                               f"at N=16 with its 256 threads (TileLang: m_warp * n_warp must "
                               f"equal num_warps)")
    return KernelConfig(N, P, R, bool(has_z), bool(has_d), chunk_size, rotary_dim_divisor, dtype,
                        threads=THREADS)


def plain_cast(name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, contiguous (a new tensor only where either changes)."""
    del name
    return t.to(dtype).contiguous()


def to_upstream(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
                mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
                da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
                segsum: torch.Tensor, states: torch.Tensor, qk_dot: torch.Tensor,
                mimo_z: torch.Tensor | None = None, d: torch.Tensor | None = None,
                z: torch.Tensor | None = None, chunk_size: int = 16, rotary_dim_divisor: int = 4,
                output_dtype: torch.dtype = torch.float32, cast: Cast = plain_cast
                ) -> tuple[KernelConfig, dict[str, torch.Tensor | None]]:
    """Our op's arguments as upstream's kernel takes them, with its output buffers allocated.

    Pure tensor bookkeeping, any device: inputs are passed through (made contiguous; trap, states
    and qk_dot in the input dtype, through ``cast(name, tensor, dtype)``), buffers allocated as
    ``mamba_mimo_bwd_combined`` does, dq and dk as their [B, S*R, H, N] views, absent optional
    tensors passed as None. ``output_dtype`` is accepted and has no effect (module docstring).

    Returns:
        (config, args): the compile-time configuration and the kernel's arguments by name, in
        ``UPSTREAM_ARGS`` order.
    """
    del output_dtype
    if (mimo_z is None) != (z is None):
        raise UnsupportedInput(f"{_WHO}: the Z gate needs both mimo_z and z, got only "
                               f"{'mimo_z' if z is None else 'z'}")
    if q.dim() != 5 or v.dim() != 4:
        raise UnsupportedInput(f"{_WHO}: q must be [B,S,R,G,N] and v [B,S,H,P], got "
                               f"{tuple(q.shape)} and {tuple(v.shape)}")
    B, S, R, G, N = q.shape
    H, P = v.shape[2], v.shape[3]
    dtype = q.dtype
    config = kernel_config(N, P, R, S, z is not None, d is not None, chunk_size, rotary_dim_divisor,
                           dtype_name(dtype))
    nc = S // chunk_size
    NA = N // rotary_dim_divisor
    dev = q.device

    def c(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.contiguous()

    def buffer(shape: tuple[int, ...], dt_: torch.dtype, zero: bool) -> torch.Tensor:
        return (torch.zeros if zero else torch.empty)(shape, dtype=dt_, device=dev)

    f32 = torch.float32
    shapes = {"dangles": (B, S, H, NA), "dssda": (B, H, nc, chunk_size, chunk_size)}
    args: dict[str, torch.Tensor | None] = {
        "dout": c(dout), "q": c(q), "k": c(k), "v": c(v), "q_bias": c(q_bias), "k_bias": c(k_bias),
        "mimo_v": c(mimo_v), "mimo_o": c(mimo_o),
        "dk": buffer((B, S, R, H, N), dtype, False).view(B, S * R, H, N),
        "dv": buffer((B, S, H, P), dtype, False),
        "dmimo_v": buffer((B, H, R, P), f32, False),
        "states": cast("states", states, dtype),
        "dq": buffer((B, S, R, H, N), dtype, False).view(B, S * R, H, N),
        "z": c(z), "mimo_z": c(mimo_z), "angles": c(angles), "da_cs": c(da_cs),
        "da_cs_rev": c(da_cs_rev), "dt": c(dt), "trap": cast("trap", trap, dtype),
        "d": c(d), "dd": buffer((B, H), f32, False) if d is not None else None,
        "qk_dot": cast("qk_dot", qk_dot, dtype), "segsum": c(segsum),
    }
    for name in _ZEROED:
        args[name] = buffer(shapes.get(name, (B, H, S)), f32, True)
    return config, {name: args[name] for name in UPSTREAM_ARGS}


def from_upstream(args: dict[str, torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
    """Our output tuple (``OUTPUTS`` order) from the kernel's arguments after the call: dq and dk
    viewed as [B,S,R,H,N], dssda with its entries at key >= query zeroed in place, dd None
    without d, the other buffers as they are."""
    B, S, R = args["q"].shape[:3]
    out = dict(args)
    for name in ("dq", "dk"):
        t = args[name]
        out[name] = t.view(B, S, R, t.shape[2], t.shape[3])
    out["dssda"] = args["dssda"].triu_(1)  # [key, query]: keep key < query
    return tuple(out[name] for name in OUTPUTS)


class _CastOnce:
    """A ``Cast`` that keeps, per argument name, the last tensor it made and returns it again
    while the same source tensor (same object, same version) comes back; dropped with it."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[Any, int, torch.dtype, torch.Tensor]] = {}

    def __call__(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if name == "trap":  # [B,H,S]: cast each call, as the first stage's baseline does
            return plain_cast(name, t, dtype)
        kept = self._kept.get(name)
        if kept is not None and kept[0]() is t and kept[1] == t._version and kept[2] == dtype:
            return kept[3]
        out = plain_cast(name, t, dtype)
        if out is not t:
            ref = weakref.ref(t, lambda _r, n=name: self._kept.pop(n, None))
            self._kept[name] = (ref, t._version, dtype, out)
        return out


_CAST = _CastOnce()
_KERNELS: dict[KernelConfig, Any] = {}


def _import_builder() -> tuple[Any, Any]:
    """(mamba_mimo_bwd_bwd, tilelang.language), or UnsupportedInput naming how to get them."""
    return import_kernel(_WHO, "mamba_mimo_bwd_bwd")


def compiled(config: KernelConfig) -> Any:
    """Upstream's kernel for ``config``, built once per process (TileLang's disk cache, under
    TILELANG_CACHE_DIR, keeps it across processes)."""
    return build(_KERNELS, config, _import_builder)


def tilelang(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
             mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
             da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor, segsum: torch.Tensor,
             states: torch.Tensor, qk_dot: torch.Tensor, mimo_z: torch.Tensor | None = None,
             d: torch.Tensor | None = None, z: torch.Tensor | None = None, chunk_size: int = 16,
             rotary_dim_divisor: int = 4, output_dtype: torch.dtype = torch.float32
             ) -> tuple[torch.Tensor | None, ...]:
    """Upstream's ``mamba_mimo_bwd_bwd`` on our op's arguments; our output tuple (upstream's dtypes).

    Raises:
        UnsupportedInput: TileLang or the kernel is not importable, the tensors are not on a CUDA
            device, or the case is one upstream does not take (see the module docstring).
    """
    return _run(False, dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, da_cs, da_cs_rev, dt,
                trap, segsum, states, qk_dot, mimo_z, d, z, chunk_size, rotary_dim_divisor,
                output_dtype)


def tilelang_static(*args: Any, **kwargs: Any) -> tuple[torch.Tensor | None, ...]:
    """:func:`tilelang` with the kernel compiled for the call's B, S, H and G as constants (one
    build per shape, as a case-specialised deployment runs it); the same arguments and outputs."""
    return _run(True, *args, **kwargs)


def _run(static: bool, *args: Any, **kwargs: Any) -> tuple[torch.Tensor | None, ...]:
    """Upstream's kernel on the arguments of :func:`tilelang`, built with B, S, H, G dynamic or,
    ``static``, as the call's constants (:func:`opgen.baselines.tilelang_mamba3.run`)."""
    return run(_WHO, tilelang, _import_builder, compiled, to_upstream, from_upstream, static, args, kwargs, cast=_CAST)
