"""One point of one variant on one case, in this process, as the tuner's worker runs it: the
variant's kernel module launched with the point's tunables, every output checked against the
float64 golden, optionally timed; repeated ``--repeat`` times. The spec's constraints and budgets are
not applied (``--check`` names the first constraint the point fails, and runs it anyway), so a point
the space leaves out can be run under a tool:

    compute-sanitizer --tool memcheck python3 scripts/run_point.py OP VARIANT --case JSON --point JSON
    ncu --clock-control none -k regex:chunk_kernel python3 scripts/run_point.py OP VARIANT ...

e.g. the form of mamba3_mimo_bwd_bwd's faulting tf32x3 points (spec constraints, "an illegal memory
access on the H100"):

    python3 scripts/run_point.py mamba3_mimo_bwd_bwd blocked --check \\
        --case '{"B": 4, "S": 2048, "H": 16, "G": 1, "N": 64, "P": 64, "R": 4, "chunk_size": 16,
                 "d_given": true, "dtype": "bfloat16"}' \\
        --point '{"BLOCK_N": 32, "BLOCK_P": 64, "CHUNK_MAXNREG": 128, "DOT_PRECISION": "tf32x3",
                  "DS_BLOCK_N": 64, "DS_BLOCK_P": 32, "num_stages": 1, "num_warps": 8}'

Prints each run's status (ok, wrong_result, crash, ...), its reason, the errors against the golden
and, with ``--timed``, the median milliseconds; exits 1 unless every run is ok. ``--device cpu``
runs the module under the Triton interpreter (set here; ieee products only there), for a dry run
of the command on a host without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("op")
    parser.add_argument("variant")
    parser.add_argument("--case", required=True, help="the case row, JSON (dims, dtype, scalars, *_given)")
    parser.add_argument("--point", required=True, help="the tunables, JSON (launch options included)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rendering", default="cuda", help="the kernel module's rendering: cuda or npu")
    parser.add_argument("--repeat", type=int, default=1, help="runs in this process, each on fresh outputs")
    parser.add_argument("--timed", action="store_true", help="also time each run (the tuner's protocol)")
    parser.add_argument("--check", action="store_true", help="name the spec constraint the point fails first")
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    if cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")

    from opgen.backends import get_backend
    from opgen.run.worker import Task, WorkerState, run_task
    from opgen.space.space import case_inputs, constraint_failed, evaluate_params
    from opgen.spec.spec import load_spec

    spec = load_spec(ROOT / "specs" / f"{args.op}.yaml", ROOT)
    case, point = json.loads(args.case), json.loads(args.point)
    if args.check:
        failed = constraint_failed(spec, args.variant, point, evaluate_params(spec, case_inputs(spec, case)))
        print(f"constraint: {failed or 'none fails'}")
    backend = "interpreter" if cpu else "cuda"
    task = Task(op=args.op, rendering=args.rendering, variant=args.variant, point=tuple(sorted(point.items())),
                case=tuple(sorted(case.items())), backend=backend, device=args.device,
                programs=get_backend(backend, args.device).cores() or 1, timed=args.timed)
    state = WorkerState(spec)
    results = [run_task(task, state) for _ in range(args.repeat)]
    for i, r in enumerate(results):
        ms = f" {r.median_ms:.4f} ms" if r.median_ms is not None else ""
        worst = max(r.error.items(), key=lambda kv: kv[1]) if r.error else None
        print(f"run {i}: {r.status}{ms}" + (f"; {r.reason}" if r.reason else "")
              + (f"; largest error {worst[0]} {worst[1]:.3g}" if worst else ""), flush=True)
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
