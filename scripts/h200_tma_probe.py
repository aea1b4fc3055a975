"""Probe of Hopper TMA loads for chunk_gla_fwd_o_gk on an H200, before any template has them: per
case of a case set, the frozen table's choice against one hand-written kernel whose q, g, v, h (and
optionally A) tiles are loaded and o stored through host-built tensor descriptors
(``triton.tools.tensor_descriptor``, Triton >= 3.4), over a small grid of its settings: the tiled
grid or a persistent one (the task loop, with no loop inside it, is what the software pipeliner
issues ahead at num_stages), V tile, warps, and A through the triangular pointer load or a
descriptor. Each candidate is checked against the float64 golden and timed by the tuner's worker
in interleaved rounds (read-flush timing), as scripts/h200_ab_variant.py does.

Usage (on an H200, wheels as in scripts/device_env.sh):
    python3 scripts/h200_tma_probe.py CASE_SET [--rounds N] [--warm K/N] [--all]
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import types
from pathlib import Path

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen import bench, compare  # noqa: E402
from opgen.backends import get_backend  # noqa: E402
from opgen.explain import explain  # noqa: E402
from opgen.hardware import profile  # noqa: E402
from opgen.kernels import kernel_hashes  # noqa: E402
from opgen.records import record_path  # noqa: E402
from opgen.space import case_inputs, evaluate_params  # noqa: E402
from opgen.spec import load_spec  # noqa: E402
from opgen.table import frozen_rows  # noqa: E402
from opgen.worker import Task, WorkerState, run_task  # noqa: E402

OP = "chunk_gla_fwd_o_gk"
PROBE = f"generated.{OP}.kernels.cuda.tma_probe"


@triton.jit
def tma_kernel(q_d, g_d, v_d, A, A_d, h_d, o_d, scale, T, B, H,
               V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KT: tl.constexpr,
               USE_EXP2: tl.constexpr, FOLD: tl.constexpr, TRIL_LOAD: tl.constexpr):
    NT = tl.cdiv(T, BT)
    NV = tl.cdiv(V, BV)
    n_tasks = NV * H * NT * B
    o_r = tl.arange(0, BT)
    for task in range(tl.program_id(0), n_tasks, tl.num_programs(0)):
        i_v = task % NV
        i_h = (task // NV) % H
        i_t = (task // (NV * H)) % NT
        i_b = task // (NV * H * NT)
        mat = (i_b * NT + i_t) * H + i_h
        b_o = tl.zeros([BT, BV], dtype=tl.float32)
        for kt in tl.static_range(KT):
            b_q = q_d.load([i_b, i_t * BT, i_h, kt * BK]).reshape(BT, BK).to(tl.float32)
            b_g = g_d.load([i_b, i_t * BT, i_h, kt * BK]).reshape(BT, BK)
            b_h = h_d.load([mat, kt * BK, i_v * BV]).reshape(BK, BV)
            if USE_EXP2:
                b_g = tl.exp2(b_g)
            else:
                b_g = tl.exp(b_g)
            if FOLD:
                b_a = (b_q * b_g * scale).to(v_d.dtype)
            else:
                b_a = (b_q * b_g).to(v_d.dtype)
            b_o += tl.dot(b_a, b_h.to(v_d.dtype))
        if not FOLD:
            b_o *= scale
        if TRIL_LOAD:
            row = (i_b * T * H + i_h).to(tl.int64)
            p_A = A + row * BT + (i_t * BT + o_r[:, None]).to(tl.int64) * (H * BT) + o_r[None, :]
            b_A = tl.load(p_A, mask=(i_t * BT + o_r[:, None] < T) & (o_r[:, None] >= o_r[None, :]), other=0.0)
        else:
            b_A = A_d.load([i_b, i_t * BT, i_h, 0]).reshape(BT, BT)
            b_A = tl.where(o_r[:, None] >= o_r[None, :], b_A, 0.0)
        b_v = v_d.load([i_b, i_t * BT, i_h, i_v * BV]).reshape(BT, BV)
        b_A_hi = b_A.to(v_d.dtype)
        b_A_lo = (b_A - b_A_hi.to(tl.float32)).to(v_d.dtype)
        b_o += tl.dot(b_A_hi, b_v)
        b_o += tl.dot(b_A_lo, b_v)
        o_d.store([i_b, i_t * BT, i_h, i_v * BV], b_o.to(v_d.dtype).reshape(1, BT, 1, BV))


def prepare(q, v, g, A, h, o, scale, use_exp2, BT, num_programs, point):
    """Grid, arguments and launch options of one call: descriptors over q, g, v, A, o
    ([B, T, H, *], zero-filled past T and past K or V) and h ([B * NT * H, K, V])."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = point["BK"], point["BV"]
    NT = triton.cdiv(T, BT)
    n_tasks = triton.cdiv(V, BV) * H * NT * B
    grid = (min(num_programs, n_tasks) if point["PERSISTENT"] else n_tasks,)
    kwargs = dict(
        q_d=TensorDescriptor.from_tensor(q, [1, BT, 1, BK]),
        g_d=TensorDescriptor.from_tensor(g, [1, BT, 1, BK]),
        v_d=TensorDescriptor.from_tensor(v, [1, BT, 1, BV]),
        A=A, A_d=TensorDescriptor.from_tensor(A, [1, BT, 1, BT]),
        h_d=TensorDescriptor.from_tensor(h.view(B * NT * H, K, V), [1, BK, BV]),
        o_d=TensorDescriptor.from_tensor(o, [1, BT, 1, BV]),
        scale=float(scale), T=T, B=B, H=H, V=V, BT=BT, BK=BK, BV=BV, KT=triton.cdiv(K, BK),
        USE_EXP2=bool(use_exp2), FOLD=bool(point["FOLD"]), TRIL_LOAD=bool(point["TRIL_LOAD"]))
    return grid, kwargs, {"num_warps": point["num_warps"], "num_stages": point["num_stages"]}


def launch(q, v, g, A, h, o, scale, use_exp2, BT, num_programs, point):
    """Run the probe kernel once; return the compiled kernel."""
    grid, kwargs, options = prepare(q, v, g, A, h, o, scale, use_exp2, BT, num_programs, point)
    return tma_kernel[grid](**kwargs, **options)


def probe_points(params: dict, choice: dict) -> list[dict]:
    """The probe's settings at one case: K in tiles of at most 128, V tiles of 64 and 128 (not past
    V), the tiled grid (num_stages 1) or a persistent one of 1 or 2 programs per core (2 or 3
    stages), 4 or 8 warps, A through the triangular load or a descriptor."""
    K, V = params["K"], params["V"]
    BK = min(128, max(16, triton.next_power_of_2(K)))
    fold = choice["variant"].split("_")[0] != "post"
    grids = [(False, 1, 1), (True, 1, 2), (True, 1, 3), (True, 2, 2), (True, 2, 3)]
    out = []
    for BV, (persistent, occupancy, stages), warps, tril in itertools.product(
            [b for b in (64, 128) if b <= max(16, triton.next_power_of_2(V))], grids, (4, 8), (True, False)):
        out.append(dict(BK=BK, BV=BV, PERSISTENT=persistent, occupancy=occupancy, num_stages=stages,
                        num_warps=warps, TRIL_LOAD=tril, FOLD=fold))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--warm", default=None)
    args = parser.parse_args()
    sys.modules[PROBE] = types.SimpleNamespace(launch=launch)
    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    warm = None if args.warm is None else tuple(int(x) for x in args.warm.split("/"))
    chip = profile("h200")
    table = frozen_rows(spec, chip, record_path(ROOT, chip.name, OP), kernel_hashes(ROOT, spec, chip.rendering))
    state = WorkerState(spec)
    bandwidth = None if warm else compare.copy_bandwidth(get_backend("cuda", "cuda:0"))
    best_ratio: list[float] = []
    floors: list[tuple[float, float]] = []
    n = 0
    for row in spec.expand_cases(args.cases):
        params = evaluate_params(spec, case_inputs(spec, row))
        floor_ms = None if bandwidth is None else spec.traffic_bytes.evaluate(params) / bandwidth * 1e3
        if floor_ms is not None and floor_ms < compare.LAUNCH_BOUND_MS and not args.all:
            continue
        choice = explain(ROOT, spec, chip, row, table)
        found = [("choice", choice["variant"], dict(choice["config"]))]
        found += [("tma", "tma_probe", p) for p in probe_points(params, choice)]
        tasks = []
        for label, variant, point in found:
            n += 1
            if warm and n % warm[1] != warm[0]:
                continue
            tasks.append((label, variant, point, Task(
                op=OP, rendering="cuda", variant=variant, point=tuple(sorted(point.items())),
                case=tuple(sorted(row.items())), backend="cuda", device="cuda:0", programs=chip.cores,
                max_rel_l2=spec.accuracy.max_rel_l2.get(row["dtype"]), timed=warm is None)))
        times: list[list[float]] = [[] for _ in tasks]
        for _ in range(1 if warm else args.rounds):
            for i, (label, variant, point, task) in enumerate(tasks):
                result = run_task(task, state)
                if result.status != "ok":
                    if _ == 0:
                        print(f"{compare.case_id(row):<36} {label} {point}: {result.status} "
                              f"{result.reason[:300]}", flush=True)
                elif result.median_ms is not None:
                    times[i].append(result.median_ms)
        if warm or not times or not times[0]:
            continue
        base = statistics.median(times[0])
        best = math.inf
        for (label, variant, point, _), t in sorted(zip(tasks, times), key=lambda x: statistics.median(x[1]) if x[1] else math.inf):
            if not t:
                continue
            ms = statistics.median(t)
            if label == "tma":
                best = min(best, ms)
            settings = "choice" if label == "choice" else (
                f"BV={point['BV']} {'pers' + str(point['occupancy']) if point['PERSISTENT'] else 'tiled'} "
                f"s{point['num_stages']} w{point['num_warps']} {'tril' if point['TRIL_LOAD'] else 'descA'}")
            print(f"{compare.case_id(row):<36} {settings:<32} {ms:8.4f} ms  {base / ms:6.3f}x  "
                  f"floor {floor_ms / ms:5.3f}", flush=True)
        if best < math.inf:
            best_ratio.append(base / best)
            floors.append((floor_ms / base, floor_ms / best))
            print(f"{compare.case_id(row):<36} best tma {base / best:.3f}x the choice, floor "
                  f"{floor_ms / base:.3f} -> {floor_ms / best:.3f}", flush=True)
    if best_ratio:
        print(f"best tma over the choice: geomean {bench.geomean(best_ratio):.3f}x, min {min(best_ratio):.3f}x, "
              f"max {max(best_ratio):.3f}x over {len(best_ratio)} cases; floor geomean "
              f"{bench.geomean(f for f, _ in floors):.3f} -> {bench.geomean(f for _, f in floors):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
