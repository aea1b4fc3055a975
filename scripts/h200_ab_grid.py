"""A/B of chunk_gla_fwd_o_gk's grid orders on an H200: per case of a case set, the frozen table's
choice as it is, the same point under the other one-tile-per-program grid (tiled: the chunks of one
head side by side; heads: the heads of one chunk side by side), and, where K <= 128 and the choice
loops over K, the vloop variant under both grids at the point carried there (one K tile, the
intra-chunk operands loaded first). Each is compiled, checked against the float64 golden and timed
through the tuner's worker in interleaved rounds (read-flush timing). Prints one line per (case,
candidate): the median of the rounds' medians, its ratio to the table's choice and its fraction of
the memory floor; then the geomean ratio of each grid's best candidate to the choice.

Usage (on an H200, wheels as in scripts/device_env.sh):
    python3 scripts/h200_ab_grid.py CASE_SET [ROUNDS] [--all] [--warm K/N]
--all keeps launch-bound cases (floor under 20 us); --warm K/N only compiles share K of N of the
candidates (run N of them side by side first: the Triton cache keeps what they compile).
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen import bench, compare  # noqa: E402
from opgen.backends import get_backend  # noqa: E402
from opgen.explain import explain  # noqa: E402
from opgen.hardware import profile  # noqa: E402
from opgen.kernels import kernel_hashes  # noqa: E402
from opgen.records import record_path  # noqa: E402
from opgen.space import case_inputs, evaluate_params, find_variant  # noqa: E402
from opgen.spec import load_spec  # noqa: E402
from opgen.table import frozen_rows  # noqa: E402
from opgen.worker import Task, WorkerState, run_task  # noqa: E402

OP = "chunk_gla_fwd_o_gk"
GRIDS = ("tiled", "heads")


def candidates(spec, choice: dict, params: dict) -> list[tuple[str, str, dict]]:
    """(label, variant, point) to time for one case: the choice first."""
    variant, point = choice["variant"], dict(choice["config"])
    flags = find_variant(spec, variant).flags
    out = [("choice", variant, point)]
    if flags["GRID"] not in GRIDS or flags["SHAPE"] == "h1":
        return out
    for grid in GRIDS:
        name = f"{flags['SCALE_PATH']}_{flags['SHAPE']}_{grid}"
        if name != variant:
            out.append((grid, name, point))
    if flags["SHAPE"] == "general" and params["K"] <= 128:
        carried = {**point, "BK": max(16, 1 << (params["K"] - 1).bit_length()), "EARLY_INTRA": True}
        for grid in GRIDS:
            out.append((f"vloop {grid}", f"{flags['SCALE_PATH']}_vloop_{grid}", carried))
    return out


def main(cases: str, rounds: int = 3, keep_all: bool = False, warm: tuple[int, int] | None = None) -> int:
    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    chip = profile("h200")
    table = frozen_rows(spec, chip, record_path(ROOT, chip.name, OP), kernel_hashes(ROOT, spec, chip.rendering))
    state = WorkerState(spec)
    bandwidth = None if warm else compare.copy_bandwidth(get_backend("cuda", "cuda:0"))
    ratios: dict[str, list[float]] = {}
    n = 0
    for row in spec.expand_cases(cases):
        params = evaluate_params(spec, case_inputs(spec, row))
        floor_ms = None if bandwidth is None else spec.traffic_bytes.evaluate(params) / bandwidth * 1e3
        if floor_ms is not None and floor_ms < compare.LAUNCH_BOUND_MS and not keep_all:
            continue
        choice = explain(ROOT, spec, chip, row, table)
        tasks = []
        for label, variant, point in candidates(spec, choice, params):
            n += 1
            if warm and n % warm[1] != warm[0]:
                continue
            tasks.append((label, variant, Task(
                op=OP, rendering="cuda", variant=variant, point=tuple(sorted(point.items())),
                case=tuple(sorted(row.items())), backend="cuda", device="cuda:0", programs=chip.cores,
                max_rel_l2=spec.accuracy.max_rel_l2.get(row["dtype"]), timed=warm is None)))
        times: dict[str, list[float]] = {label: [] for label, _, _ in tasks}
        for _ in range(1 if warm else rounds):
            for label, variant, task in tasks:
                result = run_task(task, state)
                if result.status != "ok":
                    print(f"{compare.case_id(row):<36} {label:<12} {variant}: {result.status} {result.reason[:160]}",
                          flush=True)
                elif result.median_ms is not None:
                    times[label].append(result.median_ms)
        if warm or not times.get("choice") or len(tasks) == 1:
            continue
        base = statistics.median(times["choice"])
        best: dict[str, float] = {}
        for label, variant, _ in tasks:
            if not times[label]:
                continue
            t = statistics.median(times[label])
            grid = "heads" if "heads" in label or label == "heads" else "tiled"
            best[grid] = min(best.get(grid, math.inf), t)
            print(f"{compare.case_id(row):<36} {label:<12} {variant:<22} {t:8.4f} ms  {base / t:6.3f}x  "
                  f"floor {floor_ms / t:5.3f}", flush=True)
        for grid, t in best.items():
            ratios.setdefault(grid, []).append(base / t)
    for grid, values in ratios.items():
        print(f"best {grid} candidate over the choice: geomean {bench.geomean(values):.3f}x over {len(values)} cases")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    warm = None
    if "--warm" in args:
        i = args.index("--warm")
        k, m = args[i + 1].split("/")
        warm = (int(k), int(m))
        del args[i:i + 2]
    keep_all = "--all" in args
    args = [a for a in args if a != "--all"]
    sys.exit(main(args[0], int(args[1]) if len(args) > 1 else 3, keep_all, warm))
