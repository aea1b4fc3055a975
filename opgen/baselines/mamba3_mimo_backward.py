"""Baseline of the whole Mamba-3 MIMO backward (``composed.mamba3_mimo_backward``): upstream's
``mamba_mimo_bwd_combined``.

Upstream's wrapper (mamba-ssm 2.3.2.post1, ``mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py``,
tilelang 0.1.8; ``source .tilelang/activate.sh``)::

    mamba_mimo_bwd_combined(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles,
                            dA_cs, dA_cs_rev, dt, trap, D, segsum, chunk_size,
                            rotary_dim_divisor, dtype, bf_threads=128, bf_num_stages=0,
                            bb_threads=256, bb_num_stages=0)
        -> (dq, dk, dv, ddA, ddt, dtrap, dq_bias, dk_bias, dmimo_v, dmimo_z, dmimo_o, dangles,
            dD, dz)

It runs the two TileLang kernels (the stages' baselines: ``mamba3_mimo_bwd_fwd``,
``mamba3_mimo_bwd_bwd`` of this package), sums dq / dk per group and over B, S for the biases,
sums the per-batch parameter gradients over B, and applies the trap / dt and the decay chain rules
with two Triton helpers of ``mamba3_mimo_utils.py`` (``bwd_dtrap_ddt_triton``,
``bwd_dadt_fused_triton``). It takes the chunk decays, not dA; upstream's layer builds them with
``compute_dacs_segsum_triton`` (the same module), which ``tilelang`` here runs inside the call, as
``composed.mamba3_mimo_backward`` builds them from dA inside its call.

Two entries, each with ``mamba3_mimo_backward``'s signature and its ``GRADIENTS`` order:

- ``tilelang``: the wrapper's steps with both kernels built once per configuration in this
  process (the stages' baselines' caches), so a call times the work, not the builder calls the
  wrapper repeats on every call;
- ``tilelang_wrapper``: ``mamba_mimo_bwd_combined`` itself (its builder calls included).

``combined_args`` maps our arguments to the wrapper's (pure, testable without TileLang),
``from_combined`` its results to our gradient order. What upstream returns differently: dq, dk,
dv, dz, dq_bias, dk_bias and dtrap in the input dtype (bfloat16 on the official shapes), the rest
float32; the stages' roundings (their modules' docstrings); dangles is theta's gradient
(``raw_angles=False``: upstream's per-step angle chain lives in its autograd function, outside).
Refused (``UnsupportedInput``): what either stage's baseline refuses (float32 activations, a tail,
N < 32, half a Z gate, tensors off CUDA), groups other than G = 1 or G = H (the wrapper raises
ValueError for 1 < G < H), ``raw_angles=True``, and a float16 or bfloat16 dA or dt.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from opgen.baselines import mamba3_mimo_bwd_bwd as stage_two
from opgen.baselines import mamba3_mimo_bwd_fwd as stage_one
from opgen.baselines.tilelang_mamba3 import dtype_name
from opgen.errors import UnsupportedInput

__all__ = ["COMBINED_ARGS", "COMBINED_OUTPUTS", "GRADIENTS", "combined_args", "from_combined",
           "torch_decays", "tilelang", "tilelang_wrapper"]

# mamba_mimo_bwd_combined's parameters up to dtype, in order (the threads and stages keep their
# defaults), and the names of what it returns, in order (ours where they exist)
COMBINED_ARGS = ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "mimo_z",
                 "angles", "da_cs", "da_cs_rev", "dt", "trap", "d", "segsum", "chunk_size",
                 "rotary_dim_divisor", "dtype")
COMBINED_OUTPUTS = ("dq", "dk", "dv", "ddA", "ddt", "dtrap", "dq_bias", "dk_bias", "dmimo_v",
                    "dmimo_z", "dmimo_o", "dangles", "dd", "dz")
GRADIENTS = ("dq", "dk", "dv", "dq_bias", "dk_bias", "dmimo_v", "dmimo_o", "dangles", "ddA", "ddt",
             "dtrap", "dmimo_z", "dd", "dz")
"""``composed.mamba3_mimo_backward.GRADIENTS``, without importing the generated ops."""

_WHO = "tilelang baseline of mamba3_mimo_backward"
Decays = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def torch_decays(dA: torch.Tensor, chunk_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """da_cs, da_cs_rev [B,H,S] and segsum [B,H,nc,C,C] of dA for whole chunks, in plain torch
    (the CPU stand-in of upstream's ``compute_dacs_segsum_triton``, equal to it for dA <= 0)."""
    B, H, S = dA.shape
    C = chunk_size
    x = dA.reshape(B, H, S // C, C)
    cs = x.cumsum(-1)
    low = torch.ones((C, C), dtype=torch.bool, device=dA.device).tril(-1)
    segsum = torch.where(low, cs[..., :, None] - cs[..., None, :], 0.0)
    return cs.reshape(B, H, S), (cs[..., -1:] - cs).reshape(B, H, S), segsum


def _upstream_decays(dA: torch.Tensor, chunk_size: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils import compute_dacs_segsum_triton
    return compute_dacs_segsum_triton(dA, chunk_size)


def combined_args(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: torch.Tensor,
                  mimo_o: torch.Tensor, angles: torch.Tensor, dA: torch.Tensor, dt: torch.Tensor,
                  trap: torch.Tensor, mimo_z: torch.Tensor | None = None,
                  d: torch.Tensor | None = None, z: torch.Tensor | None = None,
                  chunk_size: int = 16, rotary_dim_divisor: int = 4, raw_angles: bool = False,
                  decays: Decays = torch_decays) -> dict[str, Any]:
    """``mamba3_mimo_backward``'s arguments as ``mamba_mimo_bwd_combined`` takes them, by name in
    ``COMBINED_ARGS`` order: the chunk decays from dA by ``decays``, trap in the input dtype, the
    rest passed through (contiguous), ``dtype`` the input dtype's name.

    Raises:
        UnsupportedInput: a case upstream does not take (module docstring), with the reason.
    """
    if raw_angles:
        raise UnsupportedInput(f"{_WHO}: raw_angles=True: upstream's wrapper takes theta (its "
                               f"per-step angle chain is in its autograd function, not here)")
    for name, t in (("dA", dA), ("dt", dt)):
        if t.dtype != torch.float32:
            raise UnsupportedInput(f"{_WHO}: {name} in {t.dtype}: upstream reads float32")
    if (mimo_z is None) != (z is None):
        raise UnsupportedInput(f"{_WHO}: the Z gate needs both mimo_z and z, got only "
                               f"{'mimo_z' if z is None else 'z'}")
    B, S, R, G, N = q.shape
    H, P = v.shape[2], v.shape[3]
    if G not in (1, H):
        raise UnsupportedInput(f"{_WHO}: G={G} with H={H}: upstream's wrapper sums dq and dk per "
                               f"group for G = 1 or G = H only (it raises ValueError otherwise)")
    stage_two.kernel_config(N, P, R, S, z is not None, d is not None, chunk_size,
                            rotary_dim_divisor, dtype_name(q.dtype))  # refuses with the reason
    da_cs, da_cs_rev, segsum = decays(dA.contiguous(), chunk_size)

    def c(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.contiguous()

    args = {"dout": c(dout), "q": c(q), "k": c(k), "v": c(v), "q_bias": c(q_bias),
            "k_bias": c(k_bias), "mimo_v": c(mimo_v), "mimo_o": c(mimo_o), "z": c(z),
            "mimo_z": c(mimo_z), "angles": c(angles), "da_cs": da_cs, "da_cs_rev": da_cs_rev,
            "dt": c(dt), "trap": c(trap.to(q.dtype)), "d": c(d), "segsum": segsum,
            "chunk_size": chunk_size, "rotary_dim_divisor": rotary_dim_divisor,
            "dtype": dtype_name(q.dtype)}
    return {name: args[name] for name in COMBINED_ARGS}


def from_combined(out: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor | None, ...]:
    """``mamba_mimo_bwd_combined``'s results (``COMBINED_OUTPUTS`` order) in our ``GRADIENTS``
    order; the tensors as they are (the layouts agree: dq, dk [B,S,R,G,N], dd [H])."""
    if len(out) != len(COMBINED_OUTPUTS):
        raise ValueError(f"{_WHO}: mamba_mimo_bwd_combined returned {len(out)} results, expected "
                         f"{len(COMBINED_OUTPUTS)} ({', '.join(COMBINED_OUTPUTS)})")
    named = dict(zip(COMBINED_OUTPUTS, out))
    return tuple(named[name] for name in GRADIENTS)


def _cuda(q: torch.Tensor) -> None:
    if q.device.type != "cuda":
        raise UnsupportedInput(f"{_WHO}: runs on CUDA devices only, got q on {q.device}")


def tilelang_wrapper(*args: Any, **kwargs: Any) -> tuple[torch.Tensor | None, ...]:
    """``mamba_mimo_bwd_combined`` itself on ``mamba3_mimo_backward``'s arguments; our gradients."""
    try:
        from mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd import mamba_mimo_bwd_combined
    except ImportError as e:
        stage_two._import_builder()  # raises UnsupportedInput naming the bundle
        raise UnsupportedInput(f"{_WHO}: {e}") from e
    up = combined_args(*args, **kwargs, decays=_upstream_decays)
    _cuda(up["q"])
    return from_combined(tuple(mamba_mimo_bwd_combined(*up.values())))


def tilelang(*args: Any, **kwargs: Any) -> tuple[torch.Tensor | None, ...]:
    """The wrapper's steps on ``mamba3_mimo_backward``'s arguments, both kernels built once per
    configuration (B, S, H, G dynamic, as the wrapper builds them); our gradients."""
    stage_two._import_builder()  # UnsupportedInput naming the bundle where it is missing
    from mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils import (bwd_dadt_fused_triton,
                                                               bwd_dtrap_ddt_triton)
    up = combined_args(*args, **kwargs, decays=_upstream_decays)
    _cuda(up["q"])
    C, divisor = up["chunk_size"], up["rotary_dim_divisor"]
    stage = {n: up[n] for n in ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o",
                                "angles", "da_cs", "da_cs_rev", "dt", "trap", "segsum", "mimo_z",
                                "d", "z")}
    config, first = stage_one.to_upstream(**stage, chunk_size=C, rotary_dim_divisor=divisor)
    stage_one.compiled(config)(*first.values())
    states, qk_dot, dmimo_o, dmimo_z, dz = stage_one.from_upstream(first)
    config, second = stage_two.to_upstream(**stage, states=states, qk_dot=qk_dot, chunk_size=C,
                                           rotary_dim_divisor=divisor)
    stage_two.compiled(config)(*second.values())
    B, S, R, G, N = up["q"].shape
    H = up["v"].shape[2]
    dq = second["dq"].view(B, S, R, H, N)
    dk = second["dk"].view(B, S, R, H, N)
    dq_bias, dk_bias = dq.sum((0, 1)).permute(1, 0, 2), dk.sum((0, 1)).permute(1, 0, 2)
    if G == 1:
        dq, dk = dq.sum(3, keepdim=True), dk.sum(3, keepdim=True)
    ddt, dtrap = bwd_dtrap_ddt_triton(up["trap"], up["dt"], second["dfactor"],
                                      second["dgamma_diag"], C)
    ddA = second["dda"] + bwd_dadt_fused_triton(second["dssda"], up["segsum"], second["dda_cs"],
                                                second["dda_cs_rev"], up["da_cs"],
                                                up["da_cs_rev"], C)
    dd = None if second["dd"] is None else second["dd"].sum(0)
    return (dq, dk, second["dv"], dq_bias, dk_bias, second["dmimo_v"].sum(0), dmimo_o.sum(0),
            second["dangles"], ddA, ddt, dtrap, None if dmimo_z is None else dmimo_z.sum(0), dd,
            dz)

