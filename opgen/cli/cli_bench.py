"""The ``opgen`` verbs that time generated ops on a device: ``bench`` (side by side with a
baseline, sharded over ``--devices`` or merged from shards' ``--json`` files) and ``host-time``
(the host work of a call up to its kernels' launch).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ..errors import OpgenError, UsageError
from .cli_project import device_list, only_cases, op_spec, project_root, shard_options


def cmd_bench(args: argparse.Namespace) -> int:
    from ..evidence import compare
    from ..backends import get_backend
    from ..run.bench import Protocol
    from ..errors import SpecError
    from ..tune.shard import assign, parse_shard
    from ..spec.spec import forced_axes

    root = project_root(args)
    sys.path.insert(0, str(root))
    spec = op_spec(root, args.op)
    if args.baseline not in spec.baselines:
        raise SpecError(spec.path, "baselines", f"a baseline named {args.baseline!r}", sorted(spec.baselines))
    rows = only_cases(spec.expand_cases(args.cases, where=args.where), args.case, args.cases)
    if args.set:
        rows = with_values(spec, rows, args.set)
    if args.compile_only and (args.merge or args.devices or args.json or args.output):
        raise UsageError("--compile-only times nothing: it takes no --merge, --devices, --json or --output")
    if args.merge:
        generated = compare.generated_hash(root, spec.op)
        merged, toolchain = _merged(rows, [Path(f) for f in args.merge], generated)
        _print_table(merged, args, _provenance(spec.op, generated, toolchain))
        return 0
    if args.devices:
        return _bench_on_devices(args, device_list(args), rows)
    if args.shard:
        k, n = parse_shard(args.shard)
        rows = [r for r, s in zip(rows, assign([1.0] * len(rows), n)) if s == k]
    backend = get_backend(args.backend, args.device)
    target = spec.baselines[args.baseline]
    forced = forced_axes(target)
    if forced is not None:  # the op itself with some axes forced, e.g. variant:ALGO=stage0
        from ..spec.hardware import chip_for_device_name

        chip = chip_for_device_name(backend.toolchain()["device"], args.backend)
        base = compare.variant_baseline(spec, chip, forced)
    else:
        from ..run.worker import resolve

        base = resolve(target)
    if args.compile_only:
        return _compile_only(spec, rows, backend, base, args.seed)
    bandwidth = compare.copy_bandwidth(backend)
    print(f"{spec.op} vs {args.baseline} on {backend.toolchain()}; copy bandwidth {bandwidth / 1e12:.3f} TB/s", flush=True)
    protocol = Protocol(warmup=args.warmup, repeat=args.repeat)
    results, failed = _each_case(
        rows, lambda row: compare.run_case(spec, row, backend, base, bandwidth, args.seed, args.rounds, protocol),
        lambda result: compare.table([result], args.baseline).splitlines()[1])
    generated, toolchain = compare.generated_hash(root, spec.op), backend.toolchain()
    if args.json:
        _write_json(Path(args.json), args, generated, toolchain, results, failed)
    if results:
        _print_table(results, args, _provenance(spec.op, generated, toolchain))
    return _failures(failed, len(rows))


def _compile_only(spec, rows: list[dict], backend, base, seed: int) -> int:
    """``--compile-only``: each side called once per case (``compare.compile_case``), a line per
    case; the exit status as for a timed run."""
    from ..evidence import compare

    _, failed = _each_case(rows, lambda row: (compare.case_id(row), *compare.compile_case(spec, row, backend, base, seed)),
                           lambda r: f"{r[0]}  first call: ours {r[1]:.2f} s, baseline {r[2]:.2f} s")
    return _failures(failed, len(rows))


def _each_case(rows: list[dict], run, line) -> tuple[list, list[dict[str, str]]]:
    """``run(row)`` on each case, printing ``line(result)`` or, where it raises ``CaseFailed``, the
    case and its error (the other cases still run); the results and the failures."""
    from ..evidence import compare

    results, failed = [], []
    for row in rows:
        try:
            result = run(row)
        except compare.CaseFailed as exc:
            failed.append({"case": compare.case_id(row), "error": str(exc)})
            print(f"{failed[-1]['case']}  FAILED {failed[-1]['error']}", flush=True)
            continue
        results.append(result)
        print(line(result), flush=True)
    return results, failed


def _failures(failed: list[dict[str, str]], total: int) -> int:
    """Name the cases that failed (on stderr); the exit status: 1 if any did."""
    for f in failed:
        print(f"opgen bench: {f['case']} failed: {f['error']}", file=sys.stderr)
    if failed:
        print(f"opgen bench: {len(failed)} of {total} cases failed", file=sys.stderr)
    return 1 if failed else 0


def with_values(spec, rows: list[dict], items: list[str]) -> list[dict]:
    """``rows`` with the ``NAME=VALUE`` words of ``--set`` in each, the repeats left out."""
    from ..evidence.explain import parse_values

    override = parse_values(spec, items, complete=False)
    out: dict[tuple, dict] = {}
    for row in rows:
        row = {**row, **override}
        out.setdefault(tuple(sorted(row.items())), row)
    return list(out.values())


def _write_json(path: Path, args: argparse.Namespace, generated: str, toolchain: dict[str, str],
                results: list, failed: list[dict[str, str]] = ()) -> None:
    """A bench shard's results as ``--merge`` and ``opgen report`` read them (every CaseResult
    field, agreement too), with the baseline, case set and ``--where`` formula they ran and the
    cases that failed (case id, what it raised)."""
    path.write_text(json.dumps(dict(op=args.op, baseline=args.baseline, cases=args.cases, where=args.where,
                                    generated=generated, toolchain=toolchain,
                                    results=[dataclasses.asdict(r) for r in results], failed=list(failed))))


def _print_table(results: list, args: argparse.Namespace, provenance: str) -> None:
    """Print the table; ``--output`` also gets it, after a line naming what was measured."""
    from ..evidence import compare

    text = compare.table(results, args.baseline)
    print(text)
    if args.output:
        Path(args.output).write_text(f"{provenance}\n{text}\n")


def _provenance(op: str, generated: str, toolchain: dict[str, str]) -> str:
    return f"# {op}: generated/{op} {generated}, measured on {json.dumps(toolchain, sort_keys=True)}"


def _bench_on_devices(args: argparse.Namespace, devices: list[str], rows: list[dict]) -> int:
    """One shard of the cases per device, each side by side in its own process; one table."""
    import tempfile

    from ..evidence import compare
    from ..tune.shard import run_shards

    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(tmp) / f"shard{i}.json" for i in range(len(devices))]
        codes = run_shards([shard_options(args, devices=None, output=None, json=str(f)) for f in files], devices)
        # a shard that failed cases exits 1 after writing its file; one without a file broke
        if any(codes) and not all(f.exists() for f in files):
            raise OpgenError(f"bench shards exited with {codes} (devices {','.join(devices)})")
        failed = [x for f in files for x in json.loads(f.read_text()).get("failed", ())]
        lost = {x["case"] for x in failed}
        generated = compare.generated_hash(project_root(args), args.op)
        results, toolchain = _merged([r for r in rows if compare.case_id(r) not in lost], files, generated)
    if args.json:  # the merged results, as one shard would have written them
        _write_json(Path(args.json), args, generated, toolchain, results, failed)
    if results:
        _print_table(results, args, _provenance(args.op, generated, toolchain))
    return _failures(failed, len(rows))


def _merged(rows: list[dict], files: list[Path], generated: str) -> tuple[list, dict[str, str]]:
    """The results of the ``--json`` files of bench shards, in case order, and their toolchain
    (:func:`opgen.evidence.compare.read_shards`), every shard measured on this tree's generated code."""
    from ..evidence.compare import read_shards

    results, toolchain, _ = read_shards(rows, files, generated)
    return results, toolchain


def cmd_host_time(args: argparse.Namespace) -> int:
    import os

    from ..evidence import host_time
    from ..backends import get_backend

    root = project_root(args)
    host_time.check_launch(args.backend, args.launch)
    if args.backend == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: CPU tensors
    sys.path.insert(0, str(root))
    ops = args.ops or sorted(p.stem for p in (root / "specs").glob("*.yaml"))
    todo = []  # (spec, its rows), every case set checked before any work
    for spec in (op_spec(root, op) for op in ops):
        if args.cases not in spec.cases and not args.ops:  # an op named on the command line must have it
            print(f"opgen host-time: {spec.op} has no case set {args.cases!r}: skipped", file=sys.stderr)
            continue
        todo.append((spec, spec.expand_cases(args.cases)))
    if not todo:
        raise UsageError(f"no op has a case set {args.cases!r}")
    if args.backend == "interpreter" and args.device and args.device.split(":")[0] != "cpu":
        raise UsageError(f"device {args.device!r} is not a cpu device (the interpreter runs on CPU tensors)")
    backend = get_backend(args.backend, args.device)
    host = host_time.host_description(backend)
    if args.backend == "interpreter":
        import torch

        torch.set_num_threads(host_time.INTERPRETER_THREADS)
        host["torch_threads"] = str(host_time.INTERPRETER_THREADS)
    what = "a no-op in Triton's place" if args.launch == "none" else "Triton's, real"
    print(f"host work per call up to the kernels' launch (launch: {what}); median over {args.rounds} "
          f"rounds of {args.calls} calls; {json.dumps(host, sort_keys=True)}", flush=True)
    results = []
    for spec, rows in todo:
        results += host_time.measure(spec, rows, backend, args.launch, args.rounds, args.calls, args.seed)
    print(host_time.table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            host=host, launch=args.launch, cases=args.cases, rounds=args.rounds, calls=args.calls,
            results=[dict(dataclasses.asdict(r), seen_ratio=r.seen_ratio, unseen_ratio=r.unseen_ratio)
                     for r in results]), indent=1))
    return 0

