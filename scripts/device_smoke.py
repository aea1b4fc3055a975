"""Every variant of an op's rendering, compiled and checked on a device (no timing).

For each case of a spec case set and each variant legal for it: the spec's default tunables for
the chip with the variant's fixed values, one launch through the tuner's worker, then the op's
accuracy checks against the float64 golden. Prints one line per (case, variant): the status,
the seconds (compilation included) and each output's rel. L2 error. Exit status 1 if any failed.

Usage (on an H200): python3 scripts/device_smoke.py mamba3_mimo_bwd_fwd --chip h200 --cases gpu_smoke
(``--index I`` runs only the I-th case, so that several processes can share the cases.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen.compare import case_id  # noqa: E402
from opgen.hardware import profile  # noqa: E402
from opgen.space import case_inputs, evaluate_params, forced_point, is_legal, variants_for  # noqa: E402
from opgen.spec import load_spec  # noqa: E402
from opgen.worker import Task, WorkerState, run_task  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("op")
    parser.add_argument("--chip", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--index", type=int, default=None, help="only the case at this index")
    args = parser.parse_args(argv)
    spec = load_spec(ROOT / "specs" / f"{args.op}.yaml", ROOT)
    state = WorkerState(spec)
    chip = profile(args.chip)
    bar = spec.accuracy.max_rel_l2 or {}
    failed = 0
    rows = spec.expand_cases(args.cases)
    for row in rows if args.index is None else [rows[args.index]]:
        flags = ",".join(k for k, v in row.items() if v is True)
        params = evaluate_params(spec, case_inputs(spec, row))
        for variant in variants_for(spec, chip.rendering):
            if not is_legal(spec, variant, params):
                continue
            point = forced_point(spec, chip, variant, params).config
            task = Task(op=spec.op, rendering=chip.rendering, variant=variant.name,
                        point=tuple(sorted(point.items())), case=tuple(sorted(row.items())),
                        backend=chip.backend, device=args.device, programs=chip.cores or 1,
                        max_rel_l2=bar.get(row.get("dtype")), timed=False)
            result = run_task(task, state)
            errors = " ".join(f"{k}={v:.1e}" for k, v in result.error.items() if k.endswith("rel_l2")
                              and not k.endswith("ref_rel_l2"))
            print(f"{case_id(row):<36} {flags:<28} {variant.name:<28} {result.status:<13} {result.seconds:6.1f}s  "
                  f"{errors} {result.reason[:300]}", flush=True)
            failed += result.status != "ok"
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
