"""How much of mamba3_mimo_bwd_fwd's split chunk kernel could hide behind its state path, on one
CUDA GPU: per official shape, at the spec's H200 default (its variant and point), the kernels
timed alone, the whole launch sequence, and the state path and the chunk kernel launched
together on two streams.

    python3 scripts/mamba3_overlap_probe.py RESULTS.jsonl [--cases official official_z] [--workers 12]

Together, the chunk kernel reads states the state path is still writing: the numbers are wrong
and only the time means anything (a bound on what a chunk kernel whose state-independent part
runs beside the state path could reach). "scan || chunk" (splitscan) starts the chunk kernel
after the increments, beside the scan. Every shape is compiled first in parallel processes
(Triton caches to disk). One JSON line per shape; a table at the end (ms).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
OP = "mamba3_mimo_bwd_fwd"


def default_variant_point(spec, row: dict) -> tuple[str, dict]:
    """The spec's H200 default for the case: its variant's name and point."""
    from opgen import space
    from opgen.hardware import profile

    point = space.default_point(spec, profile("h200"), space.evaluate_params(spec, space.case_inputs(spec, row)))
    return point.variant, dict(point.config)


def together(side: torch.cuda.Stream, first: list, second: list, after: list = ()) -> None:
    """Launch ``after``, then ``first`` on the current stream and ``second`` on the stream ``side``
    started with it; the current stream waits for both."""
    main = torch.cuda.current_stream()
    run(after)
    side.wait_stream(main)
    run(first)
    with torch.cuda.stream(side):
        run(second)
    main.wait_stream(side)


def run(launches: list) -> None:
    """Launch ``launches`` in order on the current stream."""
    for kernel, grid, kwargs, options in launches:
        kernel[grid](**kwargs, **options)


def main() -> None:
    from mamba3_split_probe import bench, calls, compile_job, inputs, kernel_name, outputs, tag

    from opgen.spec import load_spec

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", nargs="+", default=["official", "official_z"])
    parser.add_argument("--workers", type=int, default=12)
    args = parser.parse_args()
    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    rows = [dict(r) for name in args.cases for r in spec.cases[name]]
    jobs = [(row, point, variant) for row in rows for variant, point in [default_variant_point(spec, row)]]
    with cf.ProcessPoolExecutor(args.workers, mp_context=torch.multiprocessing.get_context("spawn")) as pool:
        for (row, _, variant), status in zip(jobs, pool.map(compile_job, jobs)):
            print(f"{tag(row)} {variant}: {status}", flush=True)
    side = torch.cuda.Stream()
    lines = []
    with open(args.out, "w") as f:
        for row, point, variant in jobs:
            x = inputs(row)
            outs = outputs(x)
            launches = calls(variant, x, outs, point)
            names = [kernel_name(k) for k, *_ in launches]
            run(launches)
            torch.cuda.synchronize()
            alone = {n: bench(lambda k=k, g=g, kw=kw, o=o: k[g](**kw, **o)) for n, (k, g, kw, o) in zip(names, launches)}
            i_chunk = names.index("chunk")
            state, chunk, rest = launches[:i_chunk], launches[i_chunk:i_chunk + 1], launches[i_chunk + 1:]
            line = dict(case=tag(row), variant=variant, point=point, alone=alone,
                        serial=bench(lambda: run(launches)),
                        overlap=bench(lambda: (together(side, state, chunk), run(rest))))
            if "scan" in names:
                inc = [c for c, n in zip(launches, names) if n == "increment"]
                scan = [c for c, n in zip(launches, names) if n == "scan"]
                line["scan_overlap"] = bench(lambda: (together(side, scan, chunk, after=inc), run(rest)))
            f.write(json.dumps(line) + "\n")
            f.flush()
            lines.append(line)
            print(json.dumps(line), flush=True)
            del x, outs, launches, state, chunk, rest
            torch.cuda.empty_cache()
    print(f"{'case':<22} {'variant':<26} {'state':>7} {'chunk':>7} {'serial':>7} {'overlap':>8} {'scan||':>7}")
    for line in lines:
        a = line["alone"]
        st = sum(t for n, t in a.items() if n not in ("chunk", "gate", "reduce"))
        print(f"{line['case']:<22} {line['variant']:<26} {st:7.3f} {a['chunk']:7.3f} {line['serial']:7.3f} "
              f"{line['overlap']:8.3f} {line.get('scan_overlap', float('nan')):7.3f}")


if __name__ == "__main__":
    main()
