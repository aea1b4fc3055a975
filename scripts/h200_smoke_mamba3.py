"""Smoke run of every cuda rendering of mamba3_mimo_bwd_fwd on a GPU against the float64 golden.

Usage (on the lent H200): python3 scripts/h200_smoke_mamba3.py
"""
import importlib
import pkgutil
import time

import torch

import generated.mamba3_mimo_bwd_fwd.kernels.cuda as cuda_kernels
from opgen.references.mamba3_mimo_bwd_fwd import golden, make_inputs

NAMES = ("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")


def main() -> None:
    x = make_inputs(2, 200, 4, 2, 64, 64, 4, chunk_size=16, dtype=torch.bfloat16, seed=0, device="cuda")
    gold = golden(**x, device="cuda")
    B, S, R, G, N = x["q"].shape
    H, P, NC = 4, 64, -(-S // 16)
    for info in pkgutil.iter_modules(cuda_kernels.__path__):
        module = importlib.import_module(f"{cuda_kernels.__name__}.{info.name}")
        outs = {"states": torch.empty(B, H, NC, N, P, device="cuda"), "qk_dot": torch.empty(B, H, S, R, R, device="cuda"),
                "dmimo_o": torch.empty(B, H, R, P, device="cuda"), "dmimo_z": torch.empty(B, H, R, P, device="cuda"),
                "dz": torch.empty(B, S, H, P, device="cuda")}
        start = time.perf_counter()
        try:
            module.launch(**x, **outs, num_programs=132, point={"BLOCK_P": 32, "num_warps": 4, "num_stages": 1})
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - report and go on to the next variant
            print(f"{info.name:<28} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        errs = " ".join(f"{n}={(outs[n].double() - gold[n]).abs().max().item() / gold[n].abs().max().item():.1e}"
                        for n in NAMES)
        print(f"{info.name:<28} {time.perf_counter() - start:6.1f}s  {errs}", flush=True)


if __name__ == "__main__":
    main()
