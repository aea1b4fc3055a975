"""Summarise Nsight Compute's SASS source page (``ncu -i REP --page source --csv --print-source sass``):
warp-stall samples and executed instructions per opcode, and the instructions with the most samples,
for each kernel of the report.

    python3 scripts/ncu_source_summary.py SOURCE.csv [--top 40]
"""
from __future__ import annotations

import argparse
import csv
import re
from collections import Counter


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        lines = f.read().splitlines()
    # one section per kernel: a "Kernel Name" line, then the header row and its SASS rows
    marks = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')] or [-1]
    for k, mark in enumerate(marks):
        section = lines[mark + 1:marks[k + 1] if k + 1 < len(marks) else len(lines)]
        if mark >= 0:
            print(f"== {lines[mark].split(',')[1].strip(chr(34))}")
        summarize(section, args.top)


def summarize(lines: list[str], top: int) -> None:
    """Print one kernel's samples and executed instructions per opcode and its top instructions."""
    start = next(i for i, line in enumerate(lines) if '"Source"' in line or line.startswith("Address") or
                 '"Address"' in line)
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys())
    stall = next(c for c in cols if c.startswith("Warp Stall Sampling (All"))
    executed = next((c for c in cols if c.startswith("Instructions Executed")), None)
    source = next(c for c in cols if c == "Source")
    by_op, by_op_exec, total = Counter(), Counter(), 0.0
    for r in rows:
        m = re.match(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", r[source])
        op = m.group(1) if m else "?"
        s = number(r[stall])
        total += s
        by_op[op] += s
        if executed:
            by_op_exec[op] += number(r[executed])
    print(f"{len(rows)} SASS lines, {total:.0f} stall samples, {sum(by_op_exec.values()):.0f} warp instructions "
          f"executed; columns: {', '.join(cols)}")
    print(f"{'opcode':<10} {'samples':>9} {'share':>6} {'executed':>12}")
    for op, s in by_op.most_common(30):
        print(f"{op:<10} {s:>9.0f} {s / max(total, 1):>6.1%} {by_op_exec[op]:>12.0f}")
    print(f"top {top} instructions by samples:")
    for r in sorted(rows, key=lambda r: -number(r[stall]))[:top]:
        print(f"{number(r[stall]):>8.0f}  {r.get('Address', '')}  {r[source].strip()[:90]}")


if __name__ == "__main__":
    main()
