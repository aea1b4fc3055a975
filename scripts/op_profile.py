"""Run one case of a case set through a generated op, a warm-up call then a profiled one, for
Nsight Compute on a CUDA GPU (the op runs its frozen choice for the chip the table detects):

    ncu --clock-control none --set full -k regex:chunk_gla_fwd_o_gk --launch-skip 1 --launch-count 1 \\
        python3 scripts/op_profile.py chunk_gla_fwd_o_gk users_holdout B5-T7793-H16-K32-V160-C32-fp16

CASE is a case's name as the benchmark tables print it.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen.compare import case_id  # noqa: E402
from opgen.spec import load_spec  # noqa: E402
from opgen.worker import prepare_case  # noqa: E402


def main(op: str, cases: str, name: str, device: str = "cuda:0") -> None:
    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    rows = [row for row in spec.expand_cases(cases) if case_id(row) == name]
    if not rows:
        sys.exit(f"{name}: no such case in {op}'s case set {cases}")
    inputs = prepare_case(spec, rows[0], 0, device)["inputs"]
    fn = getattr(importlib.import_module(f"generated.{op}"), op)
    for _ in range(2):
        fn(**inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    print(f"ran {name}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
