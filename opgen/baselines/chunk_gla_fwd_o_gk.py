"""Baselines of chunk_gla_fwd_o_gk: FLA 0.6.0's CUDA Triton kernel (fla-core, runtime autotune).

FLA's kernel always takes exp2 of the gates, so it is compared on ``use_exp2=True`` inputs.
"""
from __future__ import annotations

import torch

from opgen.errors import UnsupportedInput


def fla(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, A: torch.Tensor, h: torch.Tensor,
        scale: float, chunk_size: int, use_exp2: bool) -> torch.Tensor:
    """``fla.ops.gla.chunk.chunk_gla_fwd_o_gk`` on the same inputs (needs fla-core 0.6.0)."""
    if not use_exp2:
        raise UnsupportedInput("FLA 0.6.0's chunk_gla_fwd_o_gk computes exp2(g) only: bench it with use_exp2=True")
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk

    return chunk_gla_fwd_o_gk(q, v, g, A, h, scale, chunk_size=chunk_size)
