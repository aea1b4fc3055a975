"""What a generated op's call costs around its kernels on a GPU: host time eager, compiled and in a
CUDA graph; the op and a small block eager against ``torch.compile``; strided and transposed
inputs against contiguous. Issue-style targets are printed beside the figures; nothing is asserted.

For each op and each case of a spec case set (default ``host``; ``bench`` for the shapes the
tables were tuned on), the inputs on the device, then:

Host microseconds per call (``opgen.run.bench.host_overhead``: calls queued back to back behind a
held device, so the host never waits for it; the median over ``--rounds`` rounds of ``--calls``):

    add_              one torch ``add_`` on two 16-element tensors on the device, for scale
    eager             ``generated.<op>.<op>(**inputs)``, contiguous inputs (a signature seen
                      before: the API's short path)
    eager_strided     the activations as strided views (the first half of a tensor twice as wide)
    eager_transposed  the activations as transposed views (dims 1 and 2 swapped in memory)
    compiled          ``torch.compile(fullgraph=True)`` of a function making the call (Inductor:
                      the op's Triton kernels in its graph where torch can trace them)
    block_eager       ``silu(a) -> op -> out * 2 + 1``, ``a`` the op's first activation and ``out``
                      its first output, eager
    block_compiled    the block under ``torch.compile(fullgraph=True)``
    reduce_overhead   the op under ``torch.compile(mode="reduce-overhead", fullgraph=True)``
    graph             a CUDA graph of the eager call, replayed (``torch.cuda.CUDAGraph.replay``)

Wall microseconds per call (``wall_*``: ``--calls`` calls back to back, no hold, synchronised at
the end: what a loop of calls costs, host and device together) for eager, compiled, block_eager,
block_compiled, reduce_overhead and graph; and device milliseconds (``opgen.run.bench.measure``:
events, the cache flushed, the median) of eager, eager_strided and eager_transposed.

Also per case: the compiled call's and block's graph breaks, and the largest difference of the
compiled call's outputs from the eager call's. Writes ``host_time.md`` and ``host_time.json`` into
``--out``. Needs an NVIDIA GPU (H100 or H200: the ops' tables); not run in CI.

Usage, from the repository root:

    python3 scripts/gpu_host_time.py --out DIR [--ops OP ...] [--cases host bench] [--case ID ...]
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from opgen.run import bench  # noqa: E402
from opgen.backends import get_backend  # noqa: E402
from opgen.baselines.strided import activations, strided_view  # noqa: E402
from opgen.evidence.compare import case_id  # noqa: E402
from opgen.evidence.host_time import host_description  # noqa: E402
from opgen.spec.spec import load_spec  # noqa: E402
from opgen.run.worker import case_arguments  # noqa: E402

HOST = ("add_", "eager", "eager_strided", "eager_transposed", "compiled", "block_eager", "block_compiled",
        "reduce_overhead", "graph")
WALL = ("eager", "compiled", "block_eager", "block_compiled", "reduce_overhead", "graph")
DEVICE = ("eager", "eager_strided", "eager_transposed")


def transposed_view(x: torch.Tensor) -> torch.Tensor:
    """x's values with dims 1 and 2 swapped in memory (a [B, H, T, ...] buffer seen as [B, T, H, ...]);
    a tensor of fewer than 3 dims as a strided view."""
    if x.dim() < 3:
        return strided_view(x)
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def first_output(out):
    """The op's first produced output (a tuple's first tensor that is not None)."""
    if isinstance(out, torch.Tensor):
        return out
    return next(t for t in out if t is not None)


def _graph_replay(call, device):
    """A function replaying a CUDA graph of ``call``, captured at its first call (after warm-up calls
    on a side stream, as torch's documentation has it)."""
    replay = []

    def run():
        if not replay:
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(3):
                    call()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            replay.append(graph.replay)
        return replay[0]()
    return run


def _views(arguments, names, view):
    """The arguments with the tensors named in ``names`` replaced by ``view`` of them."""
    return {k: view(v) if k in names and isinstance(v, torch.Tensor) else v for k, v in arguments.items()}


def _callables(op, arguments, names, first, device):
    """Each mode's callable of no arguments, and the functions compiled for them."""
    def block(**kw):
        kw = dict(kw)
        kw[first] = torch.nn.functional.silu(kw[first])
        return first_output(op(**kw)) * 2 + 1

    def call(**kw):
        return op(**kw)

    def graphed(**kw):  # a function of its own: Dynamo caches compiled code per function
        return op(**kw)

    compiled = torch.compile(call, fullgraph=True)
    compiled_block = torch.compile(block, fullgraph=True)
    overhead = torch.compile(graphed, mode="reduce-overhead", fullgraph=True)
    x = torch.zeros(16, device=device)
    y = torch.ones(16, device=device)
    strided = _views(arguments, names, strided_view)
    transposed = _views(arguments, names, transposed_view)
    fns = {
        "add_": lambda: x.add_(y),
        "eager": lambda: op(**arguments),
        "eager_strided": lambda: op(**strided),
        "eager_transposed": lambda: op(**transposed),
        "compiled": lambda: compiled(**arguments),
        "block_eager": lambda: block(**arguments),
        "block_compiled": lambda: compiled_block(**arguments),
        "reduce_overhead": lambda: overhead(**arguments),
        "graph": _graph_replay(lambda: op(**arguments), device),
    }
    return fns, call, block


def wall_us(backend, fn, calls):
    """Microseconds per call of ``calls`` calls back to back, synchronised at the end only."""
    fn()
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    backend.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure_case(spec, row, backend, rounds, calls, seed):
    """One case: host and wall microseconds per call of each mode, device milliseconds, checks."""
    module = importlib.import_module(f"generated.{spec.op}")
    op = getattr(module, spec.op)
    _, inputs = case_arguments(spec, row, seed, backend.device)
    arguments = {name: inputs[name] for name in (*spec.signature.tensors, *spec.signature.scalars)}
    names = activations(spec.op)
    first = next(n for n in spec.signature.tensors if n in names and arguments[n] is not None)
    fns, call, block = _callables(op, arguments, names, first, torch.device(backend.device))
    failed = {}  # a mode that fails (a trace torch refuses, a capture) is named; the others measured
    for mode, fn in list(fns.items()):
        try:
            for _ in range(3):
                fn()
            backend.synchronize()
        except Exception as exc:  # noqa: BLE001
            failed[mode] = _reason(exc)
            del fns[mode]
    nan = float("nan")
    host = {m: statistics.median(bench.host_overhead(backend, fns[m], calls) * 1e6 for _ in range(rounds))
            if m in fns else nan for m in HOST}
    wall = {m: statistics.median(wall_us(backend, fns[m], calls) for _ in range(rounds)) if m in fns else nan
            for m in WALL}
    device = {m: bench.median(bench.measure(backend, fns[m])) if m in fns else nan for m in DEVICE}
    breaks = {}
    for name, fn in (("op", call), ("block", block)):
        try:
            breaks[name] = torch._dynamo.explain(fn)(**arguments).graph_break_count
        except Exception as exc:  # noqa: BLE001
            failed[f"explain {name}"] = _reason(exc)
            breaks[name] = -1
    diff = _largest_difference(fns["eager"](), fns["compiled"]()) if "compiled" in fns else nan
    return dict(op=spec.op, case=case_id(row), graph_breaks=breaks, compiled_diff=diff,
                host_us=host, wall_us=wall, device_ms=device, failed=failed)


def _reason(exc):
    """An exception's kind and first line."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def _largest_difference(eager, compiled):
    """The largest absolute difference between the eager and the compiled call's outputs (0.0:
    the compiled graph ran the same kernels to the same bits)."""
    pairs = zip(eager, compiled) if isinstance(eager, tuple) else [(eager, compiled)]
    return max((0.0 if a is None and b is None else (a.float() - b.float()).abs().max().item()
                for a, b in pairs), default=0.0)


def table(rows):
    """Markdown tables of one op's cases: host, wall and device figures, then the targets' ratios."""
    out = []
    head = ["case", *HOST]
    out += ["Host us per call:", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join([r["case"], *(f"{r['host_us'][m]:.1f}" for m in HOST)]) + " |" for r in rows]
    head = ["case", *(f"wall {m}" for m in WALL), *(f"device {m} ms" for m in DEVICE), "breaks op/block",
            "compiled - eager"]
    out += ["", "Wall us per call (back to back), device ms, checks:", "", "| " + " | ".join(head) + " |",
            "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["case"], *(f"{r['wall_us'][m]:.1f}" for m in WALL), *(f"{r['device_ms'][m]:.4f}" for m in DEVICE),
                 f"{r['graph_breaks']['op']}/{r['graph_breaks']['block']}", f"{r['compiled_diff']:.3g}"]
        out.append("| " + " | ".join(cells) + " |")
    head = ["case", "eager host / add_ (<= 2)", "compiled / eager wall (<= 1)", "block compiled / eager wall (<= 1)",
            "reduce-overhead / graph host (<= 2)", "strided / contiguous device (<= 1.05)",
            "transposed / contiguous device (<= 1.05)"]
    out += ["", "Targets:", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        h, w, d = r["host_us"], r["wall_us"], r["device_ms"]
        cells = [r["case"], f"{h['eager'] / h['add_']:.2f}", f"{w['compiled'] / w['eager']:.2f}",
                 f"{w['block_compiled'] / w['block_eager']:.2f}", f"{h['reduce_overhead'] / h['graph']:.2f}",
                 f"{d['eager_strided'] / d['eager']:.3f}", f"{d['eager_transposed'] / d['eager']:.3f}"]
        out.append("| " + " | ".join(cells) + " |")
    out += [f"- {r['case']}, {mode} failed: {why}" for r in rows for mode, why in r["failed"].items()]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for host_time.md and host_time.json")
    parser.add_argument("--ops", nargs="*", help="operators (default: every op of specs/)")
    parser.add_argument("--cases", nargs="+", default=["host"], help="case sets of each spec (default: host)")
    parser.add_argument("--case", action="append", default=[], metavar="ID",
                        help="only the cases of these ids, in sets other than host (repeatable; default: every case)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=20, help="calls a round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    backend = get_backend("cuda", args.device)
    ops = args.ops or sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))
    results, text = [], []
    host = host_description(backend)
    text.append(f"Median over {args.rounds} rounds of {args.calls} calls; {json.dumps(host, sort_keys=True)}\n")
    for op in ops:
        spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
        for cases in args.cases:
            rows = []
            try:
                expanded = spec.expand_cases(cases)
            except Exception as exc:  # a set this spec lacks: said, the others measured
                print(f"{op}: no case set {cases} ({exc})", flush=True)
                continue
            for row in expanded:
                if cases != "host" and args.case and case_id(row) not in args.case:
                    continue
                try:
                    rows.append(measure_case(spec, row, backend, args.rounds, args.calls, args.seed))
                except Exception as exc:  # a case that fails is reported, the rest still measured
                    print(f"{op} {case_id(row)}: {type(exc).__name__}: {exc}", flush=True)
                    continue
                print(json.dumps(rows[-1]), flush=True)
            results += rows
            if rows:
                text.append(f"## {op}, case set {cases}\n\n{table(rows)}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_time.md").write_text("\n".join(text))
    (args.out / "host_time.json").write_text(json.dumps(dict(host=host, cases=args.cases, rounds=args.rounds,
                                                             calls=args.calls, results=results), indent=1))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
