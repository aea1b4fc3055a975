"""Time the rank-folded mamba3_mimo_bwd_fwd variants (fold, split) over a small grid of tunables
on the official shapes of one case set, on a CUDA GPU, beside the frozen table's choice.

    python3 scripts/mamba3_folded_probe.py CASES RESULTS.jsonl [VARIANTS]

Every configuration is compiled first in parallel processes (Triton caches to disk, and the
compiled kernel does not depend on S), then timed serially in this process with
triton.testing.do_bench; each result carries its rel L2 error against the fp32 reference.
"""
from __future__ import annotations

import concurrent.futures as cf
import importlib
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from mamba3_split_probe import OP, OUTPUTS, inputs as _inputs, outputs as _outs  # noqa: E402 (after the path)


def _run(variant: str, x: dict, outs: dict, point: dict) -> None:
    module = importlib.import_module(f"generated.{OP}.kernels.cuda.{variant}")
    module.launch(**x, **outs, num_programs=132, point=point)


def _configs(row: dict, variants: list[str]):
    P = row["P"]
    blocks = sorted({b for b in (P, P // 2) if b >= 16})
    grid = ((4, 8), (1, 2)) if not os.environ.get("PROBE_SMALL") else ((8,), (2,))
    for variant, bp, warps, stages in itertools.product(variants, blocks, *grid):
        yield variant, dict(BLOCK_P=bp, DOT_PRECISION="tf32x3", num_warps=warps, num_stages=stages)


def _compile(job) -> str:
    row, variant, point = job
    try:
        x = _inputs(row, S=4 * row["chunk_size"])
        _run(variant, x, _outs(x), point)
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:  # reported beside the timing
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def main() -> None:
    import triton.testing

    from opgen.references.mamba3_mimo_bwd_fwd import reference_fp32
    from opgen.spec import load_spec

    cases, out = sys.argv[1], Path(sys.argv[2])
    variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["fold_static_separate", "split_static_separate"]
    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    rows = [dict(r) for r in spec.cases[cases]]
    jobs = [(row, v, p) for row in rows for v, p in _configs(row, variants)]
    start = time.time()
    ctx = torch.multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(14, mp_context=ctx) as pool:
        status = list(pool.map(_compile, jobs))
    print(f"compiled {len(jobs)} configurations in {time.time() - start:.0f} s", flush=True)
    api = getattr(importlib.import_module(f"generated.{OP}"), OP)
    with out.open("w") as f:
        for row in rows:
            x = _inputs(row)
            ref = reference_fp32(**x, device="cuda")
            tag = f"N{row['N']}_P{row['P']}_R{row['R']}_C{row['chunk_size']}{'_Z' if row.get('z_given') else ''}"
            frozen = triton.testing.do_bench(lambda: api(**x), warmup=3, rep=30)
            best = None
            for (r, variant, point), st in zip(jobs, status):
                if r is not row:
                    continue
                rec = dict(case=tag, variant=variant, point=point, status=st, frozen_ms=frozen)
                if st == "ok":
                    outs = _outs(x)
                    try:
                        _run(variant, x, outs, point)
                        rec["ms"] = triton.testing.do_bench(lambda: _run(variant, x, outs, point), warmup=3, rep=30)
                        rec["err"] = {n: float((outs[n] - ref[n]).norm() / ref[n].norm())
                                      for n in OUTPUTS if outs[n] is not None}
                    except Exception as exc:
                        rec["status"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if "ms" in rec and (best is None or rec["ms"] < best["ms"]):
                    best = rec
            if best:
                worst = max(best["err"].items(), key=lambda kv: kv[1])
                print(f"{tag:<22} frozen {frozen:8.3f} ms  best {best['ms']:7.3f} ms {best['variant'][:5]} "
                      f"{best['point']}  worst err {worst[0]} {worst[1]:.1e}", flush=True)
            else:
                print(f"{tag:<22} frozen {frozen:8.3f} ms  no folded configuration ran", flush=True)
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
