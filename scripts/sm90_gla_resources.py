"""Compile chunk_gla_fwd_o_gk variants for an NVIDIA target without a GPU and print each one's
registers, spill bytes and shared memory as ptxas reports them: what decides how many of its
programs a multiprocessor holds.

    python scripts/sm90_gla_resources.py [--variants fold_general_tiled fold_vloop_tiled]
        [--shape K=48,V=96,chunk_size=64 ...] [--set BK=32,BV=128 BK=32,BV=64 ...]
        [--dtype float16] [--arch 90]

Needs a Triton with its NVIDIA backend beside a CPU torch (as scripts/sm90_resources.py); the
launch arguments come from each variant module's ``prepare`` on small CPU tensors of the shape
(B = 1, H = 2, four chunks), over a point of every option off, ``num_warps`` 4 and
``num_stages`` 1 unless ``--set`` says otherwise (set what the variant fixes as it fixes it).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
OP = "chunk_gla_fwd_o_gk"
BASE = dict(DOT_PRECISION="ieee", A_PAIR=True, EARLY_INTRA=False, EVICT_H=False, TRIL_LOAD=False,
            num_warps=4, num_stages=1)


def _pairs(text: str) -> dict:
    """``K=48,V=96`` as a dict of ints (and the words True, False, or text)."""
    from sm90_resources import value

    return {k: value(v) for k, v in (item.split("=", 1) for item in text.split(","))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["fold_general_tiled"])
    parser.add_argument("--shape", nargs="+", default=["K=48,V=96,chunk_size=64"])
    parser.add_argument("--set", nargs="+", default=["BK=32,BV=128", "BK=32,BV=64"])
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--arch", default="90", help="compute capability (90: H100 / H200)")
    args = parser.parse_args()

    import torch

    from sm90_resources import compile_for, ptxas_usage

    ptxas, arch = compile_for(args.arch)
    dtype = getattr(torch, args.dtype)
    print(f"{'shape':<26} {'variant':<24} {'point':<34} {'regs':>5} {'spills':>7} {'smem':>7}")
    for shape_text in args.shape:
        shape = _pairs(shape_text)
        K, V, BT = shape["K"], shape["V"], shape["chunk_size"]
        B, T, H, NT = 1, 4 * BT, 2, 4
        x = dict(q=torch.zeros(B, T, H, K, dtype=dtype), v=torch.zeros(B, T, H, V, dtype=dtype),
                 g=torch.zeros(B, T, H, K), A=torch.zeros(B, T, H, BT), h=torch.zeros(B, NT, H, K, V))
        for variant in args.variants:
            mod = importlib.import_module(f"generated.{OP}.kernels.cuda.{variant}")
            for set_text in args.set:
                point = {**BASE, **_pairs(set_text)}
                grid, kwargs, options = mod.prepare(**x, o=torch.zeros_like(x["v"]), scale=0.1, use_exp2=False,
                                                    BT=BT, num_programs=132, point=point)
                compiled = mod.KERNEL.warmup(**kwargs, **options, grid=grid)
                use = ptxas_usage(compiled.asm["ptx"], arch, ptxas)
                print(f"{shape_text:<26} {variant:<24} {set_text:<34} {use['regs']:>5} {use['spill_stores']:>7} "
                      f"{compiled.metadata.shared:>7}", flush=True)


if __name__ == "__main__":
    main()
