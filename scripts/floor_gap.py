"""How far each benchmark case is from a plain copy of its bytes, from two committed files.

Joins a benchmark table (``opgen bench ... --output``) with a copy-floor log
(``scripts/copy_floor.py``) by case name and prints, per case: our time, the floor, the copy's
time, our time over the copy's in microseconds and as a fraction, and our fraction of the floor.
The two files come from different runs, so the ratios cross runs: an analysis aid, not a
side-by-side measurement. Cases of the benchmark that the copy log lacks are listed apart. Runs
on the CPU:

    python3 scripts/floor_gap.py benchmarks/h200_chunk_gla_fwd_o_gk_vs_fla.txt \
        benchmarks/logs/h200_gla_copy_floor_bench_fla_635d56f.txt
"""
from __future__ import annotations

import math
import re
import sys

_DTYPE = re.compile(r"-(bf16|fp16|fp32)$")


def _case(name: str) -> str:
    """A case name without its dtype (the copy of the same bytes does not depend on it)."""
    return _DTYPE.sub("", name)


def read_copy(path: str) -> dict[str, tuple[float, float]]:
    """Per case (dtype dropped): the floor and the plain copy's time, in ms."""
    out = {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 7 and parts[0].startswith("B"):
            out[_case(parts[0])] = (float(parts[2]), float(parts[3]))
    return out


def read_bench(path: str) -> list[tuple[str, float, float]]:
    """Per case: its name, our median ms and our fraction of the floor."""
    out = []
    for line in open(path):
        parts = line.split()
        if len(parts) >= 6 and parts[0].startswith("B") and parts[3].endswith("x"):
            out.append((parts[0], float(parts[1]), float(parts[4])))
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(bench_path: str, copy_path: str) -> None:
    copy = read_copy(copy_path)
    rows, missing = [], []
    for name, ours, floor_fraction in read_bench(bench_path):
        if _case(name) not in copy:
            missing.append(name)
            continue
        floor, copied = copy[_case(name)]
        rows.append((name, ours, floor, copied, floor_fraction))
    print(f"{'case':<36} {'ours ms':>8} {'floor ms':>8} {'copy ms':>8} {'over copy us':>12} "
          f"{'copy/ours':>9} {'floor ours':>10}")
    for name, ours, floor, copied, fraction in rows:
        print(f"{name:<36} {ours:>8.4f} {floor:>8.4f} {copied:>8.4f} {1000 * (ours - copied):>12.1f} "
              f"{copied / ours:>9.3f} {fraction:>10.3f}")
    if rows:
        print(f"geomean over {len(rows)} cases: ours {geomean([r[4] for r in rows]):.3f} of the floor, "
              f"the copy {geomean([r[2] / r[3] for r in rows]):.3f}, ours at "
              f"{geomean([r[3] / r[1] for r in rows]):.3f} of the copy's speed")
    if missing:
        print(f"not in the copy log: {', '.join(missing)}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
