"""A/B of variant axes and tunables on an H200: per case of a case set, the frozen table's choice as
it is, then the same point under the named axis options (the choice's variant with each
combination of them in place of its own options, the tunables that variant fixes evaluated at the
case; the choice's own variant when no axis is named), crossed with the given tunable values (spec
formulas, evaluated at the case), crossed with Triton launch options the spec does not tune
(``--launch maxnreg=0,128``: 0 leaves the option out). Each is compiled, checked against the float64 golden and timed through the
tuner's worker in interleaved rounds (read-flush timing). Prints one line per (case, candidate):
the median of the rounds' medians, its ratio to the choice and its fraction of the memory floor;
then, per option, the geomean over the cases of its best candidate's speed over the choice's.

Usage (on an H200, wheels as in scripts/device_env.sh):
    python3 scripts/h200_ab_variant.py OP CASE_SET AXIS=OPTION[,OPTION...] [NAME=V1,V2 ...]
        [--launch OPTION=V1,V2] [--rounds N] [--all] [--warm K/N]
e.g. chunk_gla_fwd_o_gk users_holdout GRID=chunks2,chunks4 SHAPE=general
'BK=min(128,max(16,pow2(K)))' num_stages=2,3 (one K tile where K <= 128), or
chunk_gla_fwd_o_gk bench_fla EARLY_INTRA=False,True EVICT_H=False,True (the choice's own
variant with the four combinations). --all keeps the
launch-bound cases (floor under 20 us); --warm K/N only compiles share K of N of the candidates
(run N such processes side by side first: the Triton cache keeps what they compile).
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen import bench, compare  # noqa: E402
from opgen.backends import get_backend  # noqa: E402
from opgen.explain import explain  # noqa: E402
from opgen.expr import Expr, parse  # noqa: E402
from opgen.hardware import profile  # noqa: E402
from opgen.kernels import kernel_hashes  # noqa: E402
from opgen.records import record_path  # noqa: E402
from opgen.space import carried, case_inputs, evaluate_params, find_variant, is_legal, variants_for  # noqa: E402
from opgen.spec import load_spec  # noqa: E402
from opgen.fits import point_fits  # noqa: E402
from opgen.table import frozen_rows  # noqa: E402
from opgen.worker import Task, WorkerState, run_task  # noqa: E402


def candidates(spec, chip, choice: dict, params: dict, options: dict[str, list[str]],
               settings: dict[str, list[Expr]], launch: dict[str, list[int]]) -> list[tuple[str, str, dict]]:
    """(label, variant, point) to time for one case, the choice first: for each combination of
    ``options`` whose variant is legal at the case, the choice's point with ``settings`` evaluated
    at the case, carried there (the variant's fixed tunables), where it fits the chip's on-chip
    budget, with each combination of the ``launch`` options (a value of 0 leaves its option
    out), where it is not already among them."""
    flags = find_variant(spec, choice["variant"]).flags
    legal = {v.name for v in variants_for(spec, "cuda") if is_legal(spec, v, params)}
    out = [("choice", choice["variant"], dict(choice["config"]))]
    for combo in itertools.product(*options.values()):
        chosen = {**flags, **dict(zip(options, combo))}
        variant = "_".join(chosen[a] for a in spec.variants.axes)
        if variant not in legal:
            continue
        for values in itertools.product(*settings.values()):
            config = {**choice["config"], **{n: e.evaluate(params) for n, e in zip(settings, values)}}
            point = carried(spec, variant, config, params)
            if point is None or not point_fits(spec, chip, variant, point, params):
                continue
            for extra in itertools.product(*launch.values()):
                full = {**point, **{n: x for n, x in zip(launch, extra) if x}}
                if all(full != p for _, v, p in out if v == variant):
                    out.append(("+".join(combo) or "settings", variant, full))
    return out


def allow_launch_options(op: str, variants: set[str], names: list[str]) -> None:
    """Let the variant modules pass the extra launch options in a point on to the kernel."""
    for variant in variants:
        module = importlib.import_module(f"generated.{op}.kernels.cuda.{variant}")
        module.LAUNCH_OPTIONS = (*module.LAUNCH_OPTIONS, *(n for n in names if n not in module.LAUNCH_OPTIONS))


def _split(text: str) -> list[str]:
    """Comma-separated formulas; commas inside parentheses belong to their formula."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    return out + [text[start:]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("op")
    parser.add_argument("cases")
    parser.add_argument("values", nargs="*", help="AXIS=OPTION,... (variant axes) or NAME=V1,... (tunables)")
    parser.add_argument("--launch", action="append", default=[], help="OPTION=V1,V2: a Triton launch option")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--warm", default=None)
    args = parser.parse_args()
    spec = load_spec(ROOT / "specs" / f"{args.op}.yaml", ROOT)
    options: dict[str, list[str]] = {}
    settings: dict[str, list[Expr]] = {}
    for item in args.values:
        name, _, text = item.partition("=")
        if name in spec.variants.axes:
            options[name] = text.split(",")
        elif name in spec.tunables:
            settings[name] = [parse(t) for t in _split(text)]
        else:
            sys.exit(f"{item}: neither a variant axis nor a tunable of {args.op}")
    launch = {name: [int(x) for x in text.split(",")]
              for name, _, text in (item.partition("=") for item in args.launch)}
    warm = None if args.warm is None else tuple(int(x) for x in args.warm.split("/"))
    chip = profile("h200")
    table = frozen_rows(spec, chip, record_path(ROOT, chip.name, spec.op), kernel_hashes(ROOT, spec, chip.rendering))
    state = WorkerState(spec)
    bandwidth = compare.copy_bandwidth(get_backend("cuda", "cuda:0"))  # compiling processes skip the same cases
    ratios: dict[str, list[float]] = {}
    n = 0
    for row in spec.expand_cases(args.cases):
        params = evaluate_params(spec, case_inputs(spec, row))
        floor_ms = spec.traffic_bytes.evaluate(params) / bandwidth * 1e3
        if floor_ms < compare.LAUNCH_BOUND_MS and not args.all:
            continue
        tasks = []
        found = candidates(spec, chip, explain(ROOT, spec, chip, row, table), params, options, settings, launch)
        allow_launch_options(spec.op, {variant for _, variant, _ in found}, list(launch))
        for label, variant, point in found:
            n += 1
            if warm and n % warm[1] != warm[0]:
                continue
            tasks.append((label, variant, point, Task(
                op=spec.op, rendering="cuda", variant=variant, point=tuple(sorted(point.items())),
                case=tuple(sorted(row.items())), backend="cuda", device="cuda:0", programs=chip.cores,
                max_rel_l2=spec.accuracy.max_rel_l2.get(row["dtype"]), timed=warm is None)))
        times: list[list[float]] = [[] for _ in tasks]
        for _ in range(1 if warm else args.rounds):
            for i, (label, variant, _, task) in enumerate(tasks):
                result = run_task(task, state)
                if result.status != "ok":
                    print(f"{compare.case_id(row):<36} {variant}: {result.status} {result.reason[:160]}", flush=True)
                elif result.median_ms is not None:
                    times[i].append(result.median_ms)
        if warm or not times or not times[0] or len(tasks) == 1:
            continue
        base = statistics.median(times[0])
        best: dict[str, float] = {}
        for (label, variant, point, _), t in zip(tasks, times):
            if not t:
                continue
            ms = statistics.median(t)
            best[label] = min(best.get(label, math.inf), ms)
            changed = ",".join(f"{k}={point.get(k, 0)}" for k in (*settings, *launch))
            print(f"{compare.case_id(row):<36} {variant:<22} {changed:<14} {ms:8.4f} ms  {base / ms:6.3f}x  "
                  f"floor {floor_ms / ms:5.3f}", flush=True)
        for label, ms in best.items():
            if label != "choice":
                ratios.setdefault(label, []).append(base / ms)
    for label, values in ratios.items():
        print(f"best {label} candidate over the choice: geomean {bench.geomean(values):.3f}x, "
              f"min {min(values):.3f}x, max {max(values):.3f}x over {len(values)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
