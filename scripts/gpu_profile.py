"""Nsight Compute on a generated op's kernels for cases of a case set, on a CUDA GPU: the op runs
its frozen choice for the chip the table detects, a warm-up call then the profiled one.

    python3 scripts/gpu_profile.py OUT_DIR OP CASE_SET CASE... [--kernels REGEX] [--count K]
    python3 scripts/gpu_profile.py OUT_DIR mamba3_mimo_bwd_fwd official B4-S2048-H16-G1-N128-P64-R4-C16-bf16 \\
        --kernels 'state_kernel|chunk_kernel' --count 2

CASE is a case's id as the benchmark tables print it. ``--kernels`` picks the kernels by a regular
expression on their names (default: the op's name, which every generated kernel's name starts
with; ``chunk_kernel`` for mamba3's chunk kernel alone), ``--count`` how many launches it matches in one call
(a warm-up call's launches are skipped). Per case it writes OUT_DIR/ncu_CASE_run.log (the profiled
run), OUT_DIR/ncu_CASE.txt (ncu's details page: throughput, occupancy, launch statistics, warp
states) and OUT_DIR/ncu_CASE_source.txt (the SASS source page per kernel: warp-stall samples and
executed instructions per opcode, and the instructions with the most samples). Needs ``ncu`` on
PATH; on a host whose Python lacks opgen's packages, ``source scripts/device_env.sh`` first.
``--summarize SOURCE.csv`` prints the per-opcode summary of a source page exported with
``ncu -i REP --page source --csv --print-source sass``.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_case(op: str, cases: str, name: str, device: str = "cuda:0") -> None:
    """The profiled process: a warm-up call of the op on the case, then the profiled call."""
    sys.path.insert(0, str(ROOT))
    import torch

    from opgen.evidence.compare import case_id
    from opgen.spec.spec import load_spec
    from opgen.run.worker import case_arguments

    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    rows = [row for row in spec.expand_cases(cases) if case_id(row) == name]
    if not rows:
        sys.exit(f"{name}: no such case in {op}'s case set {cases}")
    inputs = case_arguments(spec, rows[0], 0, device)[1]
    fn = getattr(importlib.import_module(f"generated.{op}"), op)
    for _ in range(2):
        fn(**inputs)
    torch.cuda.synchronize()
    print(f"ran {name}", flush=True)


def profile(out: Path, op: str, cases: str, name: str, regex: str, count: int) -> None:
    """ncu on one case: the run, the details page and the source page's summary under ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "report"
        with open(out / f"ncu_{name}_run.log", "w") as log:
            subprocess.run(["ncu", "--clock-control", "none", "--set", "full", "--import-source", "yes",
                            "-k", f"regex:{regex}", "--launch-skip", str(count), "--launch-count", str(count),
                            "-f", "-o", str(rep), sys.executable, __file__, "--run", op, cases, name],
                           stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
        report = f"{rep}.ncu-rep"
        if not Path(report).exists():
            print(f"{name}: no report (see {out / f'ncu_{name}_run.log'})")
            return
        with open(out / f"ncu_{name}.txt", "w") as f:
            subprocess.run(["ncu", "-i", report, "--page", "details"], stdout=f, stderr=subprocess.STDOUT, check=False)
        source = subprocess.run(["ncu", "-i", report, "--page", "source", "--csv", "--print-source", "sass"],
                                capture_output=True, text=True, check=False).stdout
    with open(out / f"ncu_{name}_source.txt", "w") as f:
        try:
            f.write(summarize(source.splitlines()))
        except (StopIteration, IndexError, KeyError):  # not the layout summarize reads: keep its head
            f.write(source[:4000])
    print(f"{name}: {out / f'ncu_{name}.txt'}")


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summarize(lines: list[str], top: int = 40) -> str:
    """The source page per kernel: stall samples and executed instructions per opcode, top lines."""
    marks = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')] or [-1]
    text = []
    for k, mark in enumerate(marks):
        if mark >= 0:
            text.append(f"== {lines[mark].split(',')[1].strip(chr(34))}")
        text += _kernel(lines[mark + 1:marks[k + 1] if k + 1 < len(marks) else len(lines)], top)
    return "\n".join(text) + "\n"


def _kernel(lines: list[str], top: int) -> list[str]:
    start = next(i for i, line in enumerate(lines)
                 if '"Source"' in line or line.startswith("Address") or '"Address"' in line)
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys())
    stall = next(c for c in cols if c.startswith("Warp Stall Sampling (All"))
    executed = next((c for c in cols if c.startswith("Instructions Executed")), None)
    by_op, by_op_exec, total = Counter(), Counter(), 0.0
    for r in rows:
        m = re.match(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", r["Source"])
        opcode = m.group(1) if m else "?"
        s = number(r[stall])
        total += s
        by_op[opcode] += s
        if executed:
            by_op_exec[opcode] += number(r[executed])
    text = [f"{len(rows)} SASS lines, {total:.0f} stall samples, {sum(by_op_exec.values()):.0f} warp "
            f"instructions executed; columns: {', '.join(cols)}",
            f"{'opcode':<10} {'samples':>9} {'share':>6} {'executed':>12}"]
    text += [f"{o:<10} {s:>9.0f} {s / max(total, 1):>6.1%} {by_op_exec[o]:>12.0f}" for o, s in by_op.most_common(30)]
    text.append(f"top {top} instructions by samples:")
    text += [f"{number(r[stall]):>8.0f}  {r.get('Address', '')}  {r['Source'].strip()[:90]}"
             for r in sorted(rows, key=lambda r: -number(r[stall]))[:top]]
    return text


def main() -> None:
    if sys.argv[1:2] == ["--run"]:
        run_case(*sys.argv[2:])
        return
    if sys.argv[1:2] == ["--summarize"]:
        sys.stdout.write(summarize(Path(sys.argv[2]).read_text().splitlines()))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("op")
    parser.add_argument("cases", help="the case set")
    parser.add_argument("case", nargs="+", help="case ids as the benchmark tables print them")
    parser.add_argument("--kernels", help="a regular expression on the kernels' names (default: the op's name)")
    parser.add_argument("--count", type=int, default=1, help="launches it matches in one call (default 1)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.case:
        profile(args.out, args.op, args.cases, name, args.kernels or args.op, args.count)


if __name__ == "__main__":
    main()
