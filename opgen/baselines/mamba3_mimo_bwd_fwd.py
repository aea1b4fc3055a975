"""Baselines of mamba3_mimo_bwd_fwd: upstream's TileLang kernel ``mamba_mimo_bwd_fwd``.

The kernel is ``mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py`` of the mamba-ssm 2.3.2.post1
sdist, run by tilelang 0.1.8 (``source .tilelang/activate.sh``: the folder that
``tilelang_bundle.sh`` builds). Upstream's signature::

    mamba_mimo_bwd_fwd(B, S, H, G, N, P, R, hasZ, hasD, reduceO, chunk_size=16,
                       rotary_dim_divisor=4, dtype='float16', threads=128, num_stages=0)
        -> kernel(DOUT, Q, K, V, Q_BIAS, K_BIAS, MIMO_V, MIMO_O, DMIMO_O, STATES, Z, MIMO_Z, DZ,
                  DMIMO_Z, ANGLES, DA_CS, DA_CS_REV, DT, TRAP, D, QK_DOT, SEGSUM)

``@tilelang.jit(out_idx=[])``: the builder call compiles (or loads from TileLang's disk cache) and
returns a kernel that writes into outputs the caller allocates. One program per (head, batch)
walks all chunks in order, the R ranks folded into the chunk axis (C * R rows per GEMM).

``tilelang`` calls it as upstream's ``mamba_mimo_bwd_combined`` does: B, S, H and G dynamic
(``T.dynamic``); ``tilelang_static`` compiles it for each call's B, S, H and G as constants (on the
official shapes on an H200 1.4x-3.3x faster). Both use ``reduceO=True`` (dout is the reduced
[B,S,H,P]), threads 128, num_stages 0, the outputs allocated as that wrapper does (``qk_dot``
zero-filled, the rest empty). The compiled kernel is kept per configuration in this process, so a
call times the allocations and the launch, not the re-trace that the wrapper does on every call.

Every tensor has our layout (the same dims in the same order: q, k [B,S,R,G,N]; states
[B,H,nc,N,P]; qk_dot [B,H,S,R,R] with qk_dot[t,r,s] = <q~[t,r], k~[t,s]>; dmimo_o, dmimo_z
[B,H,R,P] per batch, which ``mamba_mimo_bwd_combined`` sums over B afterwards; dz [B,S,H,P]), and
the query/key group of head h is h // (H // G) in both. What upstream computes differently:

- Output dtypes: states, qk_dot and dz in the input dtype (bfloat16 on the official shapes),
  dmimo_o and dmimo_z in float32, whatever ``output_dtype`` says (no cast is timed; the bench's
  errors and agreement are taken in float64).
- Rounding to the input dtype inside the kernel, where ours keeps float32: q_bias and k_bias
  (before the add) and the biased q, k; the rotated q, k; Psi (mimo_v) and PsiV; dt (before gamma
  and the shifted term), the shifted gamma and trap_scale; k * trap_scale; the state before the
  q @ state GEMM (the carried state itself stays float32); the decayed, masked intra-chunk scores;
  the same-step term sum_s qk_dot[t,r,s] PsiV[t,s], accumulated over s in the input dtype; raw_y
  before the gradient products; Phi * dout in the Z path; k * exp(da_cs_rev) in the state update;
  dz, accumulated over R in the input dtype. GEMMs take input-dtype operands and accumulate in
  float32; dmimo_o and dmimo_z accumulate in float32.
- trap is read in the input dtype (an fp32 trap is rounded to it here first).
- The same-step term uses the pre-rotation qk_dot (equal to the rotated product in exact
  arithmetic; the golden's reading is the same, see opgen.references.mamba3_mimo_bwd_fwd).
- Fast math (``TL_ENABLE_FAST_MATH``): approximate exp, sigmoid and tanh; SiLU(u) is computed as
  t tanh(t) + t with t = u / 2.

Inputs upstream does not take raise ``UnsupportedInput``: float32 q/k/v/dout (upstream stores its
tiles in the input dtype and runs float16/bfloat16; its tests run bfloat16), a sequence with a
tail (upstream's test inputs assert S % chunk_size == 0, and its wrapper pads nothing), one of
mimo_z / z without the other, tensors off a CUDA device.
"""
from __future__ import annotations

from typing import Any

import torch

from opgen.baselines.tilelang_mamba3 import KernelConfig, build, check_case, dtype_name, import_kernel, run
from opgen.errors import UnsupportedInput

__all__ = ["KernelConfig", "UPSTREAM_ARGS", "OUTPUTS", "kernel_config", "to_upstream",
           "from_upstream", "tilelang", "tilelang_static", "compiled"]

# The kernel's parameters, in order (mamba3_mimo_bwd.py: mamba_mimo_bwd_fwd_kernel).
UPSTREAM_ARGS = ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "dmimo_o", "states",
                 "z", "mimo_z", "dz", "dmimo_z", "angles", "da_cs", "da_cs_rev", "dt", "trap", "d",
                 "qk_dot", "segsum")
# Our op's outputs, in order (specs/mamba3_mimo_bwd_fwd.yaml: signature.outputs).
OUTPUTS = ("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")

_WHO = "tilelang baseline of mamba3_mimo_bwd_fwd"


def kernel_config(N: int, P: int, R: int, S: int, has_z: bool, has_d: bool, chunk_size: int,
                  rotary_dim_divisor: int, dtype: str) -> KernelConfig:
    """The configuration a case compiles to; raises UnsupportedInput where upstream has none.

    ``dtype`` is the input dtype's name (``bfloat16``); S only decides whether there is a tail.
    """
    check_case(_WHO, dtype, S, chunk_size, "upstream's kernel is exercised on whole chunks only "
               "(its test inputs assert S % chunk_size == 0; its wrapper pads nothing)")
    return KernelConfig(N, P, R, bool(has_z), bool(has_d), chunk_size, rotary_dim_divisor, dtype)


def to_upstream(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
                mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
                da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor,
                segsum: torch.Tensor, mimo_z: torch.Tensor | None = None,
                d: torch.Tensor | None = None, z: torch.Tensor | None = None,
                chunk_size: int = 16, rotary_dim_divisor: int = 4,
                output_dtype: torch.dtype = torch.float32
                ) -> tuple[KernelConfig, dict[str, torch.Tensor | None]]:
    """Our op's arguments as upstream's kernel takes them, with its outputs allocated.

    Pure tensor bookkeeping, any device: inputs are passed through (made contiguous; trap cast
    to the input dtype), outputs allocated as ``mamba_mimo_bwd_combined`` does, absent optional
    tensors passed as None. ``output_dtype`` is accepted and has no effect (see the module
    docstring).

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
    dev = q.device

    def c(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.contiguous()

    has_z = config.has_z
    args: dict[str, torch.Tensor | None] = {
        "dout": c(dout), "q": c(q), "k": c(k), "v": c(v), "q_bias": c(q_bias), "k_bias": c(k_bias),
        "mimo_v": c(mimo_v), "mimo_o": c(mimo_o),
        "dmimo_o": torch.empty((B, H, R, P), dtype=torch.float32, device=dev),
        "states": torch.empty((B, H, nc, N, P), dtype=dtype, device=dev),
        "z": c(z), "mimo_z": c(mimo_z),
        "dz": torch.empty((B, S, H, P), dtype=dtype, device=dev) if has_z else None,
        "dmimo_z": torch.empty((B, H, R, P), dtype=torch.float32, device=dev) if has_z else None,
        "angles": c(angles), "da_cs": c(da_cs), "da_cs_rev": c(da_cs_rev), "dt": c(dt),
        "trap": c(trap.to(dtype)), "d": c(d),
        "qk_dot": torch.zeros((B, H, S, R, R), dtype=dtype, device=dev),
        "segsum": c(segsum),
    }
    return config, {name: args[name] for name in UPSTREAM_ARGS}


def from_upstream(args: dict[str, torch.Tensor | None]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                             torch.Tensor | None]:
    """Our output tuple (states, qk_dot, dmimo_o, dmimo_z, dz) from the kernel's arguments after
    the call: the same tensors (the layouts agree), dmimo_z and dz None without the Z gate."""
    return tuple(args[name] for name in OUTPUTS)  # type: ignore[return-value]


_KERNELS: dict[KernelConfig, Any] = {}


def _import_builder() -> tuple[Any, Any]:
    """(mamba_mimo_bwd_fwd, tilelang.language), or UnsupportedInput naming how to get them."""
    return import_kernel(_WHO, "mamba_mimo_bwd_fwd")


def compiled(config: KernelConfig) -> Any:
    """Upstream's kernel for ``config``, built once per process (TileLang's disk cache, under
    TILELANG_CACHE_DIR, keeps it across processes)."""
    return build(_KERNELS, config, _import_builder)


def tilelang(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
             mimo_o: torch.Tensor, angles: torch.Tensor, da_cs: torch.Tensor,
             da_cs_rev: torch.Tensor, dt: torch.Tensor, trap: torch.Tensor, segsum: torch.Tensor,
             mimo_z: torch.Tensor | None = None, d: torch.Tensor | None = None,
             z: torch.Tensor | None = None, chunk_size: int = 16, rotary_dim_divisor: int = 4,
             output_dtype: torch.dtype = torch.float32
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                        torch.Tensor | None]:
    """Upstream's ``mamba_mimo_bwd_fwd`` on our op's arguments; our output tuple (upstream's dtypes).

    Raises:
        UnsupportedInput: TileLang or the kernel is not importable, the tensors are not on a CUDA
            device, or the case is one upstream does not take (see the module docstring).
    """
    return _run(False, dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, da_cs, da_cs_rev, dt, trap,
                segsum, mimo_z, d, z, chunk_size, rotary_dim_divisor, output_dtype)


def tilelang_static(*args: Any, **kwargs: Any
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                               torch.Tensor | None]:
    """:func:`tilelang` with the kernel compiled for the call's B, S, H and G as constants (one
    build per shape, as a case-specialised deployment runs it); the same arguments and outputs."""
    return _run(True, *args, **kwargs)


def _run(static: bool, *args: Any, **kwargs: Any) -> tuple:
    """Upstream's kernel on the arguments of :func:`tilelang`, built with B, S, H, G dynamic or,
    ``static``, as the call's constants (:func:`opgen.baselines.tilelang_mamba3.run`)."""
    return run(_WHO, tilelang, _import_builder, compiled, to_upstream, from_upstream, static, args, kwargs)
