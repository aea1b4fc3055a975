"""What the TileLang baselines of the Mamba-3 MIMO backward share: a kernel's compile-time
configuration, the checks of what upstream's kernels take, their lazy import and the per-process
cache of built kernels, and a call of one on our op's arguments. The kernels are upstream's ``mamba_mimo_bwd_fwd`` and
``mamba_mimo_bwd_bwd`` (mamba-ssm 2.3.2.post1, ``mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py``,
tilelang 0.1.8); the modules ``mamba3_mimo_bwd_fwd``, ``mamba3_mimo_bwd_bwd`` and
``mamba3_mimo_backward`` of this package describe each. Nothing here imports TileLang until a
kernel is built.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from opgen.errors import UnsupportedInput

__all__ = ["KernelConfig", "DTYPES", "dtype_name", "check_case", "import_kernel", "build", "run"]

DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
"""The activation dtypes upstream's kernels run, by their TileLang names."""


@dataclass(frozen=True)
class KernelConfig:
    """The compile-time arguments of one of upstream's two kernels: B, S, H, G dynamic, or the
    ``shape`` given. ``threads`` and ``num_stages`` default to what ``mamba_mimo_bwd_combined``
    gives the first stage (bf_threads, bf_num_stages); the second stage's module gives 256."""

    N: int
    P: int
    R: int
    has_z: bool
    has_d: bool
    chunk_size: int
    rotary_dim_divisor: int
    dtype: str
    threads: int = 128
    num_stages: int = 0
    shape: tuple[int, int, int, int] | None = None  # (B, S, H, G) as constants; None: dynamic

    def builder_args(self, B: Any, S: Any, H: Any, G: Any) -> tuple:
        """The positional arguments of the kernel's builder (reduceO is always True here)."""
        return (B, S, H, G, self.N, self.P, self.R, self.has_z, self.has_d, True, self.chunk_size,
                self.rotary_dim_divisor, self.dtype, self.threads, self.num_stages)


def dtype_name(dtype: torch.dtype) -> str:
    """``bfloat16`` for torch.bfloat16, and so on."""
    return DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def check_case(who: str, dtype: str, S: int, chunk_size: int, tail_reason: str) -> None:
    """Raise UnsupportedInput for activations upstream's kernels do not run (float32) and for a
    sequence with a tail (``tail_reason`` says why upstream refuses it)."""
    if dtype not in DTYPES.values():
        raise UnsupportedInput(f"{who}: q/k/v/dout in {dtype}: upstream runs its kernel in float16 "
                               f"or bfloat16 (it stores every tile in the input dtype)")
    if S % chunk_size:
        raise UnsupportedInput(f"{who}: S={S} is not a multiple of chunk_size={chunk_size}: "
                               f"{tail_reason}")


def import_kernel(who: str, name: str) -> tuple[Any, Any]:
    """(upstream's builder ``name`` from mamba3_mimo_bwd.py, tilelang.language), or
    UnsupportedInput naming how to get them."""
    try:
        import tilelang.language as T
        from mamba_ssm.ops.tilelang.mamba3 import mamba3_mimo_bwd
    except ImportError as e:
        raise UnsupportedInput(
            f"{who} needs tilelang 0.1.8 and mamba-ssm's mamba3_mimo_bwd.py ({e}): run "
            f"`source .tilelang/activate.sh` first (the folder tilelang_bundle.sh builds)") from e
    return getattr(mamba3_mimo_bwd, name), T


def build(cache: dict[KernelConfig, Any], config: KernelConfig,
          importer: Callable[[], tuple[Any, Any]]) -> Any:
    """The kernel for ``config`` from ``cache``, built by ``importer``'s builder on a miss
    (TileLang's disk cache, under TILELANG_CACHE_DIR, keeps it across processes)."""
    kernel = cache.get(config)
    if kernel is None:
        builder, T = importer()
        dims = config.shape or (T.dynamic("B"), T.dynamic("S"), T.dynamic("H"), T.dynamic("G"))
        kernel = cache[config] = builder(*config.builder_args(*dims))
    return kernel


def run(who: str, entry: Callable[..., Any], importer: Callable[[], tuple[Any, Any]],
        compiled: Callable[[KernelConfig], Any], to_upstream: Callable[..., tuple[KernelConfig, dict]],
        from_upstream: Callable[[dict], tuple], static: bool, args: tuple, kwargs: dict,
        **extra: Any) -> tuple:
    """Upstream's kernel on the arguments of ``entry`` (a baseline function, bound to its
    signature), built with B, S, H, G dynamic or, ``static``, as the call's constants:
    ``to_upstream`` (given ``extra`` too) maps the arguments, ``compiled`` builds the kernel,
    ``from_upstream`` maps its buffers back to our outputs.

    Raises:
        UnsupportedInput: ``importer`` finds no TileLang or kernel, q is not on a CUDA device, or
            ``to_upstream`` refuses the case.
    """
    importer()
    q = inspect.signature(entry).bind(*args, **kwargs).arguments["q"]
    if q.device.type != "cuda":
        raise UnsupportedInput(f"{who}: runs on CUDA devices only, got q on {q.device}")
    config, upstream = to_upstream(*args, **kwargs, **extra)
    if static:
        B, S, _, G, _ = q.shape
        config = replace(config, shape=(B, S, upstream["v"].shape[2], G))
    compiled(config)(*upstream.values())
    return from_upstream(upstream)
