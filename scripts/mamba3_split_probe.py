"""Time each kernel of mamba3_mimo_bwd_fwd's split or splitscan variant over a grid of tunables on
the official shapes, beside upstream's TileLang kernel, on one CUDA GPU.

    python3 scripts/mamba3_split_probe.py RESULTS.jsonl [--cases official official_z] [--workers 14]
        [--variant splitscan_static_separate] [--precisions tf32x3 bf16x3] [--row-tiles 0 1]
        [--defaults [--warps 4 8] [--vary STATE_BLOCK_N=32,64,128]]

Every point is compiled first in parallel processes (Triton caches to disk; a kernel does not
depend on S), then timed serially in this process with triton.testing.do_bench, kernel by kernel
(split: the state scan; splitscan: the increments and their scan; then the chunk kernel and the
reduction; "state" is the state path's sum). TileLang's kernel (``source .tilelang/activate.sh``
first) is timed on the same inputs; its compilation runs in parallel processes beside ours
(scripts/tilelang_warm.py). Per shape the best point by total time is run whole and checked
against the fp32 reference (rel. L2 per output). One JSON line per measurement; the last lines
printed are the per-shape summary (ms; ratio = ours / TileLang).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OP = "mamba3_mimo_bwd_fwd"
VARIANT = "split_static_separate"  # the default of --variant
OUTPUTS = ("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")


def tag(row: dict) -> str:
    z = "_Z" if row.get("z_given") else ""
    return f"N{row['N']}_P{row['P']}_R{row['R']}_C{row['chunk_size']}{z}"


def case_row(spec, name: str) -> dict:
    """The official case (with or without the Z gate) named as ``tag`` names it."""
    rows = [dict(r) for cases in ("official", "official_z") for r in spec.cases[cases]]
    row = next((r for r in rows if tag(r) == name), None)
    if row is None:
        raise SystemExit(f"unknown case {name}; one of {[tag(r) for r in rows]}")
    return row


def inputs(row: dict, S: int | None = None, device: str = "cuda") -> dict:
    from opgen.references.mamba3_mimo_bwd_fwd import make_inputs

    return make_inputs(row["B"], S or row["S"], row["H"], row["G"], row["N"], row["P"], row["R"],
                       chunk_size=row["chunk_size"], dtype=torch.bfloat16,
                       has_z=bool(row.get("z_given")), has_d=bool(row.get("d_given")), seed=1,
                       device=device)


def outputs(x: dict) -> dict:
    """fp32 outputs for the inputs x, on their device."""
    B, S, R, G, N = x["q"].shape
    H, P = x["v"].shape[2:]
    NC = -(-S // x["chunk_size"])
    f32, z = torch.float32, x["z"] is not None

    def empty(*shape):
        return torch.empty(shape, dtype=f32, device=x["q"].device)

    return dict(states=empty(B, H, NC, N, P), qk_dot=empty(B, H, S, R, R), dmimo_o=empty(B, H, R, P),
                dmimo_z=empty(B, H, R, P) if z else None, dz=empty(B, S, H, P) if z else None)


def default_point(row: dict) -> dict:
    """The spec's H200 default for this case (the frozen choice while the table has no row)."""
    from opgen import space
    from opgen.hardware import profile
    from opgen.spec import load_spec

    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    return dict(space.default_point(spec, profile("h200"),
                                    space.evaluate_params(spec, space.case_inputs(spec, row))).config)


def grid(row: dict, defaults_only: bool = False, precisions: tuple[str, ...] = ("tf32x3",),
         row_tiles: tuple[bool, ...] = (False,), warps: tuple[int, ...] = (),
         vary: dict[str, list[int]] | None = None) -> list[dict]:
    """The points probed on one shape (or the spec's default alone, with each of ``precisions``,
    ``row_tiles`` and ``warps``, the default's num_warps when empty, and each combination of the
    ``vary`` values, a tile clipped to N or P)."""
    if defaults_only:
        base = default_point(row)
        names = list(vary or {})
        limit = {"BLOCK_N": row["N"], "STATE_BLOCK_N": row["N"], "BLOCK_P": row["P"], "STATE_BLOCK_P": row["P"]}
        extra = {tuple(min(v, limit.get(k, v)) for k, v in zip(names, vals))
                 for vals in itertools.product(*(vary or {}).values())}
        extra = [dict(zip(names, vals)) for vals in sorted(extra)]
        return [dict(base, DOT_PRECISION=d, ROW_TILES=t, num_warps=w, **e)
                for d, t, w, e in itertools.product(precisions, row_tiles, warps or (base["num_warps"],), extra)]
    N, P = row["N"], row["P"]
    blocks_n = [b for b in (16, 32, 64) if b <= N and (b >= 32 or N == 16)]
    blocks_p = sorted({b for b in (P, P // 2) if b >= 16})
    return [dict(BLOCK_P=bp, BLOCK_N=bn, DOT_PRECISION=d, ROW_TILES=t, num_warps=w, num_stages=s)
            for bn, bp, d, t, w, s in itertools.product(blocks_n, blocks_p, precisions, row_tiles, (4, 8), (1, 2))]


def points(row: dict, args: argparse.Namespace) -> list[dict]:
    """The grid of ``row`` the command line asks for."""
    if args.defaults and args.precisions is None and args.row_tiles is None and not args.warps and not args.vary:
        return [default_point(row)]
    base = default_point(row) if args.defaults else {}
    precisions = tuple(args.precisions or [base.get("DOT_PRECISION", "tf32x3")])
    tiles = tuple(t == "1" for t in args.row_tiles) if args.row_tiles else (bool(base.get("ROW_TILES", False)),)
    vary = {k: [int(x) for x in v.split(",")] for k, v in (s.split("=", 1) for s in args.vary or [])}
    return grid(row, args.defaults, precisions, tiles, tuple(args.warps or ()), vary)


def module(variant: str):
    return importlib.import_module(f"generated.{OP}.kernels.cuda.{variant}")


def calls(variant: str, x: dict, outs: dict, point: dict) -> list:
    return module(variant).kernel_calls(**x, **outs, num_programs=132, point=point)


def kernel_name(kernel) -> str:
    """state, increment, scan, chunk or reduce."""
    return kernel.__name__.rsplit("_", 2)[-2]


def kernel_parts(names: list[str], times: list[float]) -> dict:
    """Per-kernel times, plus "state": the state path's (every kernel before the chunk kernel)."""
    ms = dict(zip(names, times))
    ms["state"] = sum(t for n, t in ms.items() if n not in ("chunk", "reduce"))
    return ms


def compile_job(job: tuple[dict, dict, str]) -> dict:
    """Compile (by running on a short sequence) one point; its kernels' registers, spills, smem."""
    row, point, variant = job
    try:
        x = inputs(row, S=4 * row["chunk_size"])
        meta = []
        for kernel, grid_, kwargs, options in calls(variant, x, outputs(x), point):
            compiled = kernel[grid_](**kwargs, **options)
            meta.append(dict(kernel=kernel_name(kernel), regs=compiled.n_regs,
                             spills=compiled.n_spills, smem=compiled.metadata.shared))
        torch.cuda.synchronize()
        return dict(status="ok", meta=meta)
    except Exception as exc:  # reported beside the timing
        return dict(status=f"{type(exc).__name__}: {str(exc)[:300]}")


def bench(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def static_kernel(row: dict):
    """Upstream's kernel compiled for this case's B, S, H, G as constants (TileLang caches it)."""
    from opgen.baselines.mamba3_mimo_bwd_fwd import _import_builder, kernel_config

    builder, _ = _import_builder()
    config = kernel_config(row["N"], row["P"], row["R"], row["S"], bool(row.get("z_given")),
                           bool(row.get("d_given")), row["chunk_size"], 4, "bfloat16")
    return builder(*config.builder_args(row["B"], row["S"], row["H"], row["G"]))


def static_job(row: dict) -> str:
    try:
        static_kernel(row)
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def tilelang_ms(x: dict, row: dict | None = None) -> float | None:
    """TileLang's time on x: B, S, H, G dynamic as upstream's wrapper builds it, or (given the
    case row) compiled with them as constants."""
    try:
        from opgen.baselines.mamba3_mimo_bwd_fwd import compiled, to_upstream

        args = {k: x[k] for k in x if k not in ("chunk_size", "rotary_dim_divisor")}
        config, up = to_upstream(**args, chunk_size=x["chunk_size"],
                                 rotary_dim_divisor=x["rotary_dim_divisor"], output_dtype=torch.float32)
        kernel = compiled(config) if row is None else static_kernel(row)
        values = list(up.values())
        return bench(lambda: kernel(*values))
    except Exception as exc:
        print(f"  tilelang: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", nargs="+", default=["official", "official_z"])
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--variant", default=VARIANT, help="the cuda rendering timed (split_static_separate, "
                        "splitscan_static_separate)")
    parser.add_argument("--no-tilelang", action="store_true")
    parser.add_argument("--deadline", type=float, default=520, help="seconds after which no shape starts")
    parser.add_argument("--defaults", action="store_true", help="time the spec's default point only")
    parser.add_argument("--precisions", nargs="+", default=None,
                        help="DOT_PRECISION values probed (default: tf32x3; with --defaults, the default's)")
    parser.add_argument("--row-tiles", nargs="+", default=None, choices=("0", "1"),
                        help="ROW_TILES values probed (default: 0; with --defaults, the default's)")
    parser.add_argument("--warps", nargs="+", type=int, default=None,
                        help="with --defaults: num_warps values probed (default: the default's)")
    parser.add_argument("--vary", nargs="+", default=None, metavar="NAME=V1,V2",
                        help="with --defaults: integer tunables probed over these values (e.g. STATE_BLOCK_N=32,64,128)")
    parser.add_argument("--static", nargs="*", default=[], help="cases (e.g. N128_P64_R4_C16) whose TileLang "
                        "kernel is also compiled and timed with B, S, H, G as constants")
    args = parser.parse_args()

    from opgen.references.mamba3_mimo_bwd_fwd import reference_fp32
    from opgen.spec import load_spec

    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    rows = [dict(r) for name in args.cases for r in spec.cases[name]]
    warm = None
    if not args.no_tilelang:
        warm = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "tilelang_warm.py"), "--cases",
                                 *args.cases, "--workers", "6"], stdout=open(args.out + ".warm.log", "w"),
                                stderr=subprocess.STDOUT)
    start = time.time()
    ctx = torch.multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(args.workers, mp_context=ctx)
    statics = {tag(r): pool.submit(static_job, r) for r in rows if tag(r) in args.static or "all" in args.static}
    # every shape's points are submitted at once; a shape is timed as soon as its points compiled
    pending = [[(row, p, pool.submit(compile_job, (row, p, args.variant))) for p in points(row, args)] for row in rows]
    summary = []
    with open(args.out, "w") as f:
        for row, futures in zip(rows, pending):
            jobs = [(r, p) for r, p, _ in futures]
            status = [fut.result() for _, _, fut in futures]
            print(f"{tag(row)}: {sum(s['status'] == 'ok' for s in status)} of {len(status)} points "
                  f"compiled at {time.time() - start:.0f} s", flush=True)
            if time.time() - start > args.deadline:
                print(f"deadline: {tag(row)} and later shapes not timed", flush=True)
                break
            x = inputs(row)
            outs = outputs(x)
            best = None
            timed = []
            for (r, point), st in zip(jobs, status):
                if r is not row:
                    continue
                rec = dict(case=tag(row), point=point, **st)
                if st["status"] == "ok":
                    try:
                        launches = calls(args.variant, x, outs, point)
                        times = []
                        for kernel, grid_, kwargs, options in launches:
                            times.append(bench(lambda: kernel[grid_](**kwargs, **options)))
                        rec["ms"] = kernel_parts([kernel_name(k) for k, *_ in launches], times)
                        rec["total_ms"] = sum(times)
                        rec["variant"] = args.variant
                    except Exception as exc:
                        rec["status"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if "total_ms" in rec:
                    timed.append(rec["ms"])
                if "total_ms" in rec and (best is None or rec["total_ms"] < best["total_ms"]):
                    best = rec
            line = dict(case=tag(row), tilelang_ms=None)
            if best is not None:
                mod = module(args.variant)
                ref = reference_fp32(**x, device="cuda")
                mod.launch(**x, **outs, num_programs=132, point=best["point"])
                err = {n: float((outs[n] - ref[n]).norm() / ref[n].norm()) for n in OUTPUTS if outs[n] is not None}
                whole = bench(lambda: mod.launch(**x, **outs, num_programs=132, point=best["point"]))
                line.update(best_point=best["point"], best_parts=best["ms"], whole_ms=whole, err=err,
                            best_each={k: min(t[k] for t in timed) for k in ("state", "chunk")})
            line["kind"] = "summary"
            summary.append(line)
            del x, outs
            torch.cuda.empty_cache()
        if warm is not None:
            for fut in statics.values():
                fut.result()
            pool.shutdown(cancel_futures=True)
            warm.wait()
            print(f"TileLang warm-up done at {time.time() - start:.0f} s", flush=True)
            for row, line in zip(rows, summary):
                line["tilelang_ms"] = tilelang_ms(inputs(row))
                if tag(row) in statics:
                    print(f"  static TileLang {tag(row)}: {statics[tag(row)].result()}", flush=True)
                    line["tilelang_static_ms"] = tilelang_ms(inputs(row), row)
                    print(f"  {tag(row)}: TileLang {line['tilelang_ms']:.3f} ms as upstream's wrapper "
                          f"builds it, {line['tilelang_static_ms'] or 0:.3f} ms with static B, S, H, G", flush=True)
                torch.cuda.empty_cache()
        for line in summary:
            f.write(json.dumps(line) + "\n")
    print(f"{'case':<24} {'tilelang':>9} {'ours':>8} {'ratio':>6} {'state':>7} {'chunk':>7} {'reduce':>7} "
          f"{'st*':>7} {'ch*':>7}  point  (st*, ch*: the fastest state and chunk kernels of any point)")
    for line in summary:
        if "whole_ms" not in line:
            print(f"{line['case']:<24} nothing ran")
            continue
        tl = line["tilelang_ms"]
        ratio = f"{line['whole_ms'] / tl:6.2f}" if tl else "     -"
        p = line["best_point"]
        parts = line["best_parts"]
        print(f"{line['case']:<24} {tl or 0:9.3f} {line['whole_ms']:8.3f} {ratio} {parts['state']:7.3f} "
              f"{parts['chunk']:7.3f} {parts['reduce']:7.3f} {line['best_each']['state']:7.3f} "
              f"{line['best_each']['chunk']:7.3f}  BN{p['BLOCK_N']} SN{p.get('STATE_BLOCK_N', p['BLOCK_N'])} BP{p['BLOCK_P']} "
              f"SP{p.get('STATE_BLOCK_P', p['BLOCK_P'])} R{p.get('CHUNK_MAXNREG', 0)} "
              f"w{p['num_warps']} s{p['num_stages']} {p.get('DOT_PRECISION')} "
              f"{'tiles' if p.get('ROW_TILES') else 'rows'} maxerr {max(line['err'].values()):.1e}")
    statics = [line for line in summary if line.get("tilelang_static_ms") and "whole_ms" in line]
    if statics:
        print(f"{'case':<24} {'ours':>8} {'tilelang':>9} {'static':>8}  speedup over each (tilelang: B, S, H, G "
              "dynamic as upstream's wrapper builds it; static: compiled for the case)")
        for line in statics:
            ours, dyn, st = line["whole_ms"], line["tilelang_ms"], line["tilelang_static_ms"]
            print(f"{line['case']:<24} {ours:8.3f} {dyn:9.3f} {st:8.3f}  {dyn / ours:6.3f}x {st / ours:6.3f}x")


if __name__ == "__main__":
    main()
