"""The whole Mamba-3 MIMO backward on a GPU: ``composed.mamba3_mimo_backward`` against upstream's
``mamba_mimo_bwd_combined`` (``opgen.baselines.mamba3_mimo_backward``), side by side.

Not run in CI; needs an NVIDIA GPU and the TileLang bundle (``source .tilelang/activate.sh``
first; ``TILELANG_CACHE_DIR`` keeps the compiled kernels across runs; a cold build of the second
stage takes about a minute a configuration). ``opgen bench`` times one spec's generated op
against a baseline; the composed backward has no spec, hence this script.

Cases: upstream's official grid, B=4 S=2048 H=16 G=1 bf16 with D, over the (N, P, R, C) rows of
``specs/mamba3_mimo_bwd_fwd.yaml``'s case set ``official``, without the Z gate and with it
(``official_z``); ``--case`` picks rows by the ids the table prints. Inputs from
``opgen.references.mamba3_mimo_forward.make_inputs`` (the float64 parameters rounded to float32),
theta as the angles (``raw_angles=False``, what upstream's wrapper takes).

Per case, each side is called once (its first-call seconds, compiles included), then timed in
interleaved rounds (``opgen.run.bench.side_by_side``: cache flushed, device held, the median of device
milliseconds): ``ours``, ``upstream`` (the wrapper's steps, kernels built once) and, with
``--wrapper``, ``wrapper`` (``mamba_mimo_bwd_combined`` itself, builder calls included). Each
gradient of ours is compared with upstream's: rel. L2 in float64, and "agrees" when it is at most
``--ulps`` bfloat16 unit roundoffs (2^-8 each; upstream rounds its intermediates to bf16, so
agreement is to bf16 rounding, not closer). With ``--golden``, each side's rel. L2 against
``full_backward_reference`` (float64, on the device) too. A side that raises is reported with its
error and the other side still runs (upstream refuses N=16: its second stage does not compile).

Writes ``mamba3_backward.md`` (the table) and ``mamba3_backward.json`` (every case) into the
folder given as ``--out``.

Usage, from the repository root:

    python3 scripts/gpu_mamba3_backward.py --out DIR [--case ID ...] [--sets official official_z]
        [--wrapper] [--golden] [--rounds 3] [--repeat 15] [--ulps 4]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from opgen.run import bench  # noqa: E402
from opgen.run.accuracy import rel_l2  # noqa: E402
from opgen.backends import get_backend  # noqa: E402
from opgen.baselines import mamba3_mimo_backward as upstream  # noqa: E402
from opgen.evidence.compare import case_id  # noqa: E402
from opgen.references.mamba3_mimo_forward import make_inputs  # noqa: E402
from opgen.spec.spec import load_spec  # noqa: E402

BF16_UNIT_ROUNDOFF = 2.0 ** -8


def cases(sets: list[str], only: list[str] | None) -> list[dict]:
    """The rows of bwd_fwd's official case sets (B4 S2048 H16 G1), picked by id if asked."""
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    rows = [row for name in sets for row in spec.expand_cases(name)]
    if only:
        rows = [r for r in rows if case_label(r) in only]
        missing = set(only) - {case_label(r) for r in rows}
        if missing:
            raise SystemExit(f"no case {sorted(missing)} in {sets}")
    return rows


def case_label(row: dict) -> str:
    """The bench's case id plus -Z for the Z gate."""
    return case_id(row) + ("-Z" if row.get("z_given") else "")


def inputs(row: dict, device: str) -> dict:
    """The layer's arguments for ``row`` on ``device`` (parameters in float32)."""
    x = make_inputs(row["B"], row["S"], row["H"], row["G"], row["N"], row["P"], row["R"],
                    chunk_size=row["chunk_size"], dtype=getattr(torch, row["dtype"]),
                    has_z=bool(row.get("z_given")), has_d=bool(row.get("d_given")), seed=0)
    out = {n: (t.to(device=device, dtype=torch.float32 if t.dtype == torch.float64 else t.dtype)
               if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    out["chunk_size"] = row["chunk_size"]
    return out


def error_text(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def first_call(fn, args: dict) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn(**args)
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def compare(names: tuple[str, ...], ours: tuple, theirs: tuple, tol: float) -> dict[str, dict]:
    """Per gradient both sides return: rel. L2 of ours against upstream's, and agreement."""
    out = {}
    for name, a, b in zip(names, ours, theirs):
        if a is None or b is None:
            continue
        err = rel_l2(a.double(), b.double())
        out[name] = {"rel_l2": err, "agrees": bool(err <= tol)}
    return out


def run_case(row: dict, args: argparse.Namespace, backend, tol: float) -> dict:
    from composed.mamba3_mimo_backward import GRADIENTS, mamba3_mimo_backward

    x = inputs(row, backend.device)
    sides = {"ours": mamba3_mimo_backward, "upstream": upstream.tilelang}
    if args.wrapper:
        sides["wrapper"] = upstream.tilelang_wrapper
    result: dict = {"case": case_label(row), "row": row, "first_s": {}, "errors": {}, "ms": {}}
    outs = {}
    for side, fn in sides.items():
        try:
            outs[side], result["first_s"][side] = first_call(fn, x)
        except Exception as exc:  # noqa: BLE001 - reported, the other sides still run
            result["errors"][side] = error_text(exc)
            if args.verbose:
                traceback.print_exc()
    if outs:
        fns = {side: (lambda fn=sides[side]: fn(**x)) for side in outs}
        result["ms"] = bench.side_by_side(backend, fns, rounds=args.rounds,
                                          protocol=bench.Protocol(warmup=args.warmup,
                                                                  repeat=args.repeat))
    if "ours" in outs and "upstream" in outs:
        result["agreement"] = compare(GRADIENTS, outs["ours"], outs["upstream"], tol)
    if "upstream" in outs and "wrapper" in outs:  # the same kernels: equal up to launch order
        result["wrapper_vs_upstream"] = compare(GRADIENTS, outs["wrapper"], outs["upstream"], tol)
    if args.golden and outs:
        from opgen.references.mamba3_mimo_bwd_bwd import full_backward_reference

        gold = full_backward_reference(**x, device=backend.device)
        result["golden_rel_l2"] = {
            side: {n: rel_l2(g.double(), gold[n]) for n, g in zip(GRADIENTS, out) if g is not None}
            for side, out in outs.items()}
        del gold
    del outs, x
    torch.cuda.empty_cache()
    return result


def fmt_ms(result: dict, side: str) -> str:
    ms = result["ms"].get(side)
    return f"{ms:.3f}" if ms is not None else ("refused" if "Unsupported" in
                                                result["errors"].get(side, "") else "failed")


def table(results: list[dict], wrapper: bool, tol: float) -> str:
    head = ["case", "ours ms", "upstream ms"] + (["wrapper ms"] if wrapper else []) + [
        "speedup", "gradients agreeing", "worst gradient (rel. L2)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    speedups = []
    for r in results:
        ours, up = r["ms"].get("ours"), r["ms"].get("upstream")
        speed = f"{up / ours:.2f}x" if ours and up else "-"
        if ours and up:
            speedups.append(up / ours)
        agree = r.get("agreement", {})
        worst = max(agree, key=lambda n: agree[n]["rel_l2"], default=None)
        cells = [r["case"], fmt_ms(r, "ours"), fmt_ms(r, "upstream")]
        if wrapper:
            cells.append(fmt_ms(r, "wrapper"))
        cells += [speed, f"{sum(a['agrees'] for a in agree.values())}/{len(agree)}" if agree else "-",
                  f"{worst} {agree[worst]['rel_l2']:.2e}" if worst else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"Agreement: rel. L2 of ours against upstream's at most {tol:.3g} "
             f"({tol / BF16_UNIT_ROUNDOFF:g} bf16 unit roundoffs)."]
    if speedups:
        notes.append(f"Speed-up (upstream ms / ours ms), geomean over {len(speedups)} cases: "
                     f"{bench.geomean(speedups):.3f}.")
    errors = [f"- {r['case']} {side}: {text}" for r in results for side, text in r["errors"].items()]
    return "\n".join(lines + [""] + notes + ([""] + errors if errors else [])) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the .md and .json")
    p.add_argument("--sets", nargs="+", default=["official", "official_z"],
                   help="case sets of specs/mamba3_mimo_bwd_fwd.yaml")
    p.add_argument("--case", action="append", help="only this case id (as the table prints it)")
    p.add_argument("--wrapper", action="store_true", help="also time mamba_mimo_bwd_combined itself")
    p.add_argument("--golden", action="store_true", help="also each side's error against float64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--ulps", type=float, default=4.0, help="agreement bar in bf16 unit roundoffs")
    p.add_argument("--verbose", action="store_true", help="print each failure's traceback")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_mamba3_backward.py needs an NVIDIA GPU")
    backend = get_backend("cuda")
    tol = args.ulps * BF16_UNIT_ROUNDOFF
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for row in cases(args.sets, args.case):
        results.append(run_case(row, args, backend, tol))
        r = results[-1]
        print(r["case"], {s: round(v, 4) for s, v in r["ms"].items()}, r["errors"] or "", flush=True)
        (args.out / "mamba3_backward.json").write_text(json.dumps(
            {"toolchain": backend.toolchain(), "tolerance": tol, "results": results},
            indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o)))
    text = table(results, args.wrapper, tol)
    header = f"# composed.mamba3_mimo_backward against mamba_mimo_bwd_combined\n\n{backend.toolchain()}\n\n"
    (args.out / "mamba3_backward.md").write_text(header + text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
