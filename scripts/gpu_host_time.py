"""Host time of a generated op's call on a GPU: eager, compiled and CUDA-graph replay, each with
contiguous and with strided inputs, beside the call's device time.

For each op and each case of a spec case set (default ``host``; ``bench`` for the shapes the
tables were tuned on), the inputs on the device, then per mode the host seconds per call
(``opgen.bench.host_overhead``: calls queued back to back behind a held device, so the host never
waits for it), the median over ``--rounds`` rounds of ``--calls`` calls:

    eager             ``generated.<op>.<op>(**inputs)``, contiguous inputs (the signature seen
                      before: the API's short path)
    eager_strided     the same with the activations as strided views (the API copies each once)
    compiled          ``torch.compile(fullgraph=True)`` of a function making the call (Inductor:
                      the op's Triton kernels in its graph where torch can trace them)
    compiled_strided  the same on strided views
    graph             a CUDA graph of the eager call, replayed (``torch.cuda.CUDAGraph.replay``)
    graph_strided     the same, captured on strided views (the copies inside the graph)

and the device time of the eager call (``opgen.bench.measure``: events, the cache flushed, the
median), so each host figure stands beside the kernels it launches; with the compiled call's
graph breaks and the largest difference of its outputs from the eager call's (the check that the
kernels torch.compile traced into its graph compute what the eager call does). Writes ``host_time.md`` (one
table per op) and ``host_time.json`` into ``--out``. Needs an NVIDIA GPU (H100 or H200: the ops'
tables); not run in CI.

Usage, from the repository root:

    python3 scripts/gpu_host_time.py --out benchmarks/logs/host_time [--ops OP ...] [--cases host]
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from opgen import bench  # noqa: E402
from opgen.backends import get_backend  # noqa: E402
from opgen.baselines.strided import activations, strided_view  # noqa: E402
from opgen.compare import case_id  # noqa: E402
from opgen.host_time import host_description  # noqa: E402
from opgen.spec import load_spec  # noqa: E402
from opgen.worker import case_arguments  # noqa: E402

MODES = ("eager", "eager_strided", "compiled", "compiled_strided", "graph", "graph_strided")


def _graph_replay(call, device):
    """``call`` captured once in a CUDA graph (after warm-up calls on a side stream, as torch's
    documentation has it); the graph's replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def _callables(op, arguments, strided_names, device):
    """Each mode's callable of no arguments (:data:`MODES`)."""
    strided = {k: strided_view(v) if k in strided_names and isinstance(v, torch.Tensor) else v
               for k, v in arguments.items()}
    compiled = torch.compile(lambda **kw: op(**kw), fullgraph=True)
    out = {}
    for suffix, args in (("", arguments), ("_strided", strided)):
        out["eager" + suffix] = lambda args=args: op(**args)
        out["compiled" + suffix] = lambda args=args: compiled(**args)
        out["graph" + suffix] = _graph_replay(lambda args=args: op(**args), device)
    return out


def measure_case(spec, row, backend, rounds, calls, seed):
    """One case: the host microseconds per call of each mode, the eager call's device time."""
    module = importlib.import_module(f"generated.{spec.op}")
    op = getattr(module, spec.op)
    _, inputs = case_arguments(spec, row, seed, backend.device)
    arguments = {name: inputs[name] for name in (*spec.signature.tensors, *spec.signature.scalars)}
    fns = _callables(op, arguments, activations(spec.op), torch.device(backend.device))
    host = {}
    for mode in MODES:
        fn = fns[mode]
        for _ in range(3):
            fn()
        host[mode] = statistics.median(bench.host_overhead(backend, fn, calls) * 1e6 for _ in range(rounds))
    device_us = bench.median(bench.measure(backend, fns["eager"])) * 1e3
    breaks = torch._dynamo.explain(lambda **kw: op(**kw))(**arguments).graph_break_count
    return dict(op=spec.op, case=case_id(row), device_us=device_us, graph_breaks=breaks,
                compiled_diff=_largest_difference(fns["eager"](), fns["compiled"]()),
                **{f"{mode}_us": host[mode] for mode in MODES})


def _largest_difference(eager, compiled):
    """The largest absolute difference between the eager and the compiled call's outputs (0.0:
    the compiled graph ran the same kernels to the same bits)."""
    pairs = zip(eager, compiled) if isinstance(eager, tuple) else [(eager, compiled)]
    return max((0.0 if a is None and b is None else (a.float() - b.float()).abs().max().item()
                for a, b in pairs), default=0.0)


def table(rows):
    """One markdown table: a row per case, each mode's host microseconds, the eager device time."""
    head = ["case", *MODES, "device (eager)", "graph breaks", "compiled - eager"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["case"], *(f"{r[f'{m}_us']:.1f}" for m in MODES), f"{r['device_us']:.1f}",
                 str(r["graph_breaks"]), f"{r['compiled_diff']:.3g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for host_time.md and host_time.json")
    parser.add_argument("--ops", nargs="*", help="operators (default: every op of specs/)")
    parser.add_argument("--cases", default="host", help="case set of each spec (default: host)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=20, help="calls a round, queued behind a held device")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    backend = get_backend("cuda", args.device)
    ops = args.ops or sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))
    results, text = [], []
    host = host_description(backend)
    text.append(f"Host microseconds per call (median over {args.rounds} rounds of {args.calls} calls queued "
                f"behind a held device) and the eager call's device microseconds; "
                f"{json.dumps(host, sort_keys=True)}\n")
    for op in ops:
        spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
        rows = []
        for row in spec.expand_cases(args.cases):
            rows.append(measure_case(spec, row, backend, args.rounds, args.calls, args.seed))
            print(json.dumps(rows[-1]), flush=True)
        results += rows
        text.append(f"## {op}\n\n{table(rows)}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_time.md").write_text("\n".join(text))
    (args.out / "host_time.json").write_text(json.dumps(dict(host=host, cases=args.cases, rounds=args.rounds,
                                                             calls=args.calls, results=results), indent=1))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
