"""Compile upstream's TileLang kernel mamba_mimo_bwd_fwd for every configuration of some case sets,
one process per configuration in parallel, into TileLang's disk cache, so that a later
`opgen bench mamba3_mimo_bwd_fwd --baseline tilelang` finds each kernel compiled.

    export TILELANG_CACHE_DIR=/tmp/tilelang-cache      # the same directory for the bench
    source .tilelang/activate.sh
    python3 scripts/tilelang_warm.py --cases official official_z [--workers 11] [--static | --static-only]

TileLang (0.1.8, tilelang/cache/kernel_cache.py) keys a kernel on disk by a hash of its TIR, the
target, the pass configs, tilelang's version and libtilelang.so's size and mtime, under
TILELANG_CACHE_DIR (default ~/.tilelang/cache), which it reads when tilelang is imported; its
writes are atomic renames, so processes may share it. B, S, H and G are dynamic in the baseline's
kernel, so one configuration (N, P, R, Z, D, chunk size, rotary divisor, dtype) serves every shape;
``--static`` also compiles each case's build with them as constants (``--baseline tilelang_static``),
``--static-only`` that build alone.
Prints the seconds each configuration took: its JIT compilation on a cold cache, a load on a warm one.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def configs(root: Path, op: str, case_sets: list[str], static: bool = False, dynamic: bool = True) -> list:
    """The distinct kernel configurations of the case sets, in case order: with ``dynamic`` the
    build for any B, S, H, G, with ``static`` each case's build for its B, S, H, G."""
    from dataclasses import replace

    from opgen.baselines.mamba3_mimo_bwd_fwd import kernel_config
    from opgen.space.space import case_inputs
    from opgen.spec.spec import load_spec

    spec = load_spec(root / "specs" / f"{op}.yaml", root)
    found: dict = {}
    for name in case_sets:
        for row in spec.expand_cases(name):
            x = case_inputs(spec, row)  # dims, scalars (spec defaults filled), <t>_given, <t>_dtype
            config = kernel_config(x["N"], x["P"], x["R"], x["S"], x["mimo_z_given"] and x["z_given"],
                                   x["d_given"], x["chunk_size"], x["rotary_dim_divisor"], x["q_dtype"])
            if dynamic:
                found.setdefault(config, None)
            if static:
                found.setdefault(replace(config, shape=(x["B"], x["S"], x["H"], x["G"])), None)
    return list(found)


def _compile(config) -> tuple[float, str | None]:
    """Seconds the configuration took, and the error that stopped it (as text: TileLang's errors
    do not pickle, and one that crossed the process boundary would break the whole pool)."""
    from opgen.baselines.mamba3_mimo_bwd_fwd import compiled

    start = time.perf_counter()
    try:
        compiled(config)
    except Exception as e:  # noqa: BLE001 - every configuration is reported, the others still run
        return time.perf_counter() - start, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return time.perf_counter() - start, None


def _label(c) -> str:
    shape = f" B{c.shape[0]} S{c.shape[1]} H{c.shape[2]} G{c.shape[3]}" if c.shape else ""
    return (f"N{c.N} P{c.P} R{c.R} C{c.chunk_size} Z{int(c.has_z)} D{int(c.has_d)} "
            f"div{c.rotary_dim_divisor} {c.dtype}{shape}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="mamba3_mimo_bwd_fwd")
    parser.add_argument("--cases", nargs="+", default=["official"], help="case sets of the spec")
    parser.add_argument("--workers", type=int, default=0, help="processes (default: one per configuration, at most the cores)")
    parser.add_argument("--static", action="store_true", help="also each case's build with B, S, H, G constant")
    parser.add_argument("--static-only", action="store_true", help="each case's build with B, S, H, G constant alone")
    args = parser.parse_args(argv)
    if not os.environ.get("TILELANG_CACHE_DIR"):
        print("set TILELANG_CACHE_DIR (e.g. /tmp/tilelang-cache) here and for the bench that reads the cache",
              file=sys.stderr)
        return 2
    todo = configs(ROOT, args.op, args.cases, args.static or args.static_only, not args.static_only)
    workers = args.workers or min(len(todo), os.cpu_count() or 1)
    print(f"{len(todo)} configurations, {workers} processes, cache {os.environ['TILELANG_CACHE_DIR']}", flush=True)
    failed = 0
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_compile, c): c for c in todo}
        for future in as_completed(futures):
            seconds, error = future.result()
            failed += error is not None
            print(f"{_label(futures[future])}: " + (f"FAILED {error}" if error else f"{seconds:.1f} s"), flush=True)
    print(f"{len(todo) - failed}/{len(todo)} compiled in {time.perf_counter() - start:.1f} s wall", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
