"""A/B of chunk_gla_fwd_o_gk's EARLY_INTRA and EVICT_H on the H200: each bench case's recorded winner
with the four combinations, compiled, checked and timed through the tuner's worker, in interleaved
rounds. Prints one line per (case, combination): the median of the rounds' medians (ms) and its
ratio to the winner as recorded (both off).

Usage (on an H200): python3 scripts/h200_ab_gla.py [CASE_SET] [ROUNDS] [DTYPE]
"""
from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen.compare import case_id  # noqa: E402
from opgen.hardware import profile  # noqa: E402
from opgen.records import key_of, latest_winners, read, record_path  # noqa: E402
from opgen.space import case_inputs, evaluate_params  # noqa: E402
from opgen.spec import load_spec  # noqa: E402
from opgen.worker import Task, WorkerState, run_task  # noqa: E402

OP = "chunk_gla_fwd_o_gk"


def main(cases: str = "bench_fla", rounds: int = 3, dtype: str | None = None) -> int:
    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    state = WorkerState(spec)
    chip = profile("h200")
    winners = latest_winners(read(record_path(ROOT, "h200", OP), op=OP, chip="h200").records)
    combos = list(itertools.product((False, True), repeat=2))
    for row in spec.expand_cases(cases):
        if dtype is not None and row["dtype"] != dtype:
            continue
        won = winners.get(key_of(spec, evaluate_params(spec, case_inputs(spec, row))))
        if won is None:
            print(f"{case_id(row):<36} no recorded winner", flush=True)
            continue
        times: dict[tuple[bool, bool], list[float]] = {c: [] for c in combos}
        for _ in range(rounds):
            for early, evict in combos:
                point = {**won.point, "EARLY_INTRA": early, "EVICT_H": evict}
                task = Task(op=OP, rendering="cuda", variant=won.variant,
                            point=tuple(sorted(point.items())), case=tuple(sorted(row.items())), backend="cuda",
                            device="cuda:0", programs=chip.cores, max_rel_l2=spec.accuracy.max_rel_l2.get(row["dtype"]))
                result = run_task(task, state)
                if result.status != "ok":
                    print(f"{case_id(row):<36} {won.variant} early={early} evict={evict}: {result.status} "
                          f"{result.reason[:200]}", flush=True)
                    continue
                times[(early, evict)].append(result.median_ms)
        base = statistics.median(times[(False, False)]) if times[(False, False)] else float("nan")
        for combo in combos:
            if times[combo]:
                t = statistics.median(times[combo])
                print(f"{case_id(row):<36} {won.variant:<20} early={combo[0]!s:<5} evict={combo[1]!s:<5} "
                      f"{t:8.4f} ms  {base / t:6.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(*args[:1], *(int(a) for a in args[1:2]), *args[2:3]))
