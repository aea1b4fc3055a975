"""Run one official mamba3_mimo_bwd_fwd case through the generated op (and, with --tilelang,
upstream's TileLang kernel compiled for the case), a warm-up call then a profiled one, for Nsight
Compute on a CUDA GPU:

    ncu --clock-control none -k regex:mamba3_mimo_bwd_fwd --launch-skip 3 --launch-count 3 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        python3 scripts/mamba3_profile.py N64_P128_R4_C16_Z

The case is named as in scripts/mamba3_split_probe.py (N_P_R_C, _Z for the Z gate); B=4, S=2048,
H=16, G=1, bf16, D on. The generated op runs at its frozen choice for the H200.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
OP = "mamba3_mimo_bwd_fwd"


def main() -> None:
    from mamba3_split_probe import case_row, inputs, static_kernel

    from opgen.spec import load_spec

    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--tilelang", action="store_true", help="also run TileLang compiled for the case")
    args = parser.parse_args()
    row = case_row(load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT), args.case)
    x = inputs(row)
    op = getattr(__import__(f"generated.{OP}", fromlist=[OP]), OP)
    for _ in range(2):
        op(**x)
    torch.cuda.synchronize()
    if args.tilelang:
        from opgen.baselines.mamba3_mimo_bwd_fwd import to_upstream

        kernel = static_kernel(row)
        rest = {k: x[k] for k in x if k not in ("chunk_size", "rotary_dim_divisor")}
        _, up = to_upstream(**rest, chunk_size=x["chunk_size"], rotary_dim_divisor=x["rotary_dim_divisor"],
                            output_dtype=torch.float32)
        for _ in range(2):
            kernel(*up.values())
        torch.cuda.synchronize()
    print(f"ran {args.case}", flush=True)


if __name__ == "__main__":
    main()
