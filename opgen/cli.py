"""The ``opgen`` command line: the only reader of argv and the environment.

Subcommands: ``build`` (render ``generated/``; ``--check`` exits 1 when it is stale),
``cases`` (draw the case sets of a spec's ``sampling`` section into their file),
``tune`` (an offline campaign on a device; ``--dry-run`` prints the search space only, or with
``--trials 0 --measure-fill`` what the measure step would compile and time),
``bench`` (a generated op against a baseline, side by side), ``host-time`` (the host work one
call of each generated op costs up to its kernels' launch, beside a torch ``add_``), ``records``
(what the tuning
records hold), ``explain`` (what the frozen table runs for one call's shape, and why; exit 1
where the op refuses the call), ``resources`` (what the compiler says of the kernels the frozen
table launches: registers, spills, shared memory, occupancy; no device), ``report``
(a markdown page with plots of an op on a chip, from the committed files), ``schema``
(the JSON Schema of the spec format) and
``replay`` (the search replayed on a recorded exhaustive sweep).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import options
from .case_sample import MAX_CASES
from .errors import OpgenError
from .shard import FROM_STDIN
from .settings import Settings
from .storage import HEARTBEAT_SECONDS

if TYPE_CHECKING:
    from .hardware import ChipProfile
    from .spec import OpSpec


def _find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding ``specs/`` and ``templates/``."""
    for candidate in (start, *start.parents):
        if (candidate / "specs").is_dir() and (candidate / "templates").is_dir():
            return candidate
    raise OpgenError(f"no opgen project (specs/ and templates/) at or above {start}")


def _root(args: argparse.Namespace) -> Path:
    """The project root: ``--root`` or the nearest one above the current directory."""
    return Path(args.root).resolve() if args.root else _find_root(Path.cwd())


def _op_spec(root: Path, op: str):
    """The spec of ``op``, an operator of the project's ``specs/`` (a name, never a path).

    Raises:
        UsageError: for a name that is no op of the project, listing the ops.
    """
    from .errors import UsageError
    from .spec import load_spec

    ops = sorted(p.stem for p in (root / "specs").glob("*.yaml"))
    if op not in ops:
        raise UsageError(f"{op!r} is not an op of {root / 'specs'} (ops: {', '.join(ops) or 'none'})")
    return load_spec(root / "specs" / f"{op}.yaml", root)


def _options(args: argparse.Namespace, **changes: object) -> dict[str, object]:
    """The parsed options as a JSON-able value with ``changes``: what a shard process is given."""
    return {**{k: v for k, v in vars(args).items() if k != "func"}, **changes}


def _only_cases(rows: list[dict[str, Any]], ids: list[str] | None, set_name: str) -> list[dict[str, Any]]:
    """The rows of case set ``set_name`` whose ids (``B4-S288-...-fp16``, as the bench tables name
    them) are among ``ids`` (``--case``); every row where none is given."""
    from .compare import case_id
    from .errors import UsageError

    if not ids:
        return rows
    known = sorted({case_id(r) for r in rows})
    missing = [i for i in ids if i not in known]
    if missing:
        shown = ", ".join(known[:6]) + (f", ... ({len(known)} in all)" if len(known) > 6 else "")
        raise UsageError(f"--case {', '.join(missing)}: no such case in case set {set_name!r} (its cases: {shown})")
    return [r for r in rows if case_id(r) in ids]


def _check_devices(args: argparse.Namespace) -> list[str]:
    """The ``--devices`` list, refused together with ``--device`` or ``--shard``."""
    from .errors import UsageError

    if args.device or args.shard:
        raise UsageError("--devices runs one shard per device: leave out --device and --shard")
    return [d.strip() for d in args.devices.split(",") if d.strip()]


def _cmd_build(args: argparse.Namespace) -> int:
    from . import freeze

    root = _root(args)
    notes: list[str] = []
    files = freeze.build_all(root, notes)
    for note in notes:
        print(f"opgen build: {note}", file=sys.stderr)
    if args.check:
        stale = freeze.stale(root, files)
        if stale:
            print(f"generated/ is stale ({len(stale)} files differ); run `opgen build`:", file=sys.stderr)
            for path in stale:
                print(f"  {path}", file=sys.stderr)
            return 1
        print(f"generated/ is up to date ({len(files)} files)")
        return 0
    changed = freeze.write(root, files)
    print(f"opgen build: {len(files)} files, {len(changed)} changed")
    for path in changed:
        print(f"  {path}")
    return 0


def _measure_plan(root: Path, spec: OpSpec, chip: ChipProfile, rows: list[dict[str, Any]],
                  args: argparse.Namespace) -> str:
    """``opgen tune --trials 0 --measure-fill --dry-run``: what the measure step would run, from the
    records and kernels here (:func:`opgen.measure_fill.measure_plan`), on no device."""
    from .campaign import measure_inputs
    from .kernels import kernel_hashes
    from .measure_fill import measure_plan, outrun_line
    from .plan import buckets

    tuned, pending, earlier, left_out, _ = measure_inputs(
        spec, chip, _records_path(root, spec, chip, args), kernel_hashes(root, spec, chip.rendering),
        args.drop_below, args.drop_after, args.remeasure)
    return "\n".join([*(outrun_line(o) for o in left_out),
                      measure_plan(spec, chip, buckets(spec, rows), tuned, earlier, pending, left_out)])


def _records_path(root: Path, spec: OpSpec, chip: ChipProfile, args: argparse.Namespace) -> Path:
    """``--records``, or the op's records file of the chip."""
    from .records import record_path

    return Path(args.records).resolve() if args.records else record_path(root, chip.name, spec.op)


def _cmd_tune(args: argparse.Namespace) -> int:
    import datetime

    from . import campaign
    from .bench import Protocol
    from .dry_run import dry_run_table
    from .hardware import profile
    from .plan import plan
    from .shard import parse_shard, run_shards, shard_plans

    root = _root(args)
    spec = _op_spec(root, args.op)
    chip = profile(args.chip)
    rows = _only_cases(spec.expand_cases(args.cases), args.case, args.cases)
    variants = args.variants.split(",") if args.variants else None
    plans = plan(spec, chip, rows, variants)
    if args.shard:
        plans = shard_plans(plans, *parse_shard(args.shard), cap=args.trials)
    if args.dry_run and args.measure_fill and args.trials == 0:
        print(_measure_plan(root, spec, chip, rows, args))
        return 0
    if args.dry_run:
        print(dry_run_table(spec, chip, plans))
        return 0
    if args.devices:  # one shard of the buckets per device, then the cross-check on the first
        devices = _check_devices(args)
        search = _options(args, devices=None, cross_check=False, cross_check_all=False, measure_fill=False)
        codes = run_shards([search] * len(devices), devices)
        if (args.cross_check or args.cross_check_all or args.measure_fill) and not any(codes):
            codes += run_shards([_options(args, devices=None, trials=0)], devices[:1])
        if any(codes):
            raise OpgenError(f"tune shards exited with {codes} (devices {','.join(devices)})")
        return 0
    settings = Settings(trials=args.trials, study_seconds=args.study_seconds,
                        campaign_seconds=args.campaign_seconds, seed=args.seed,
                        point_timeout=args.point_timeout, exhaustive_below=args.exhaustive_below,
                        compile_workers=args.compile_workers, tie_margin=args.tie_margin,
                        protocol=Protocol(warmup=args.warmup, repeat=args.repeat))
    campaign.run(campaign.TuneRun(
        root=root, spec=spec, chip=chip, rows=rows, plans=plans, variants=variants, settings=settings,
        device=args.device, storage=args.storage or str(root / ".tune" / f"{chip.name}-{spec.op}.journal"),
        records=_records_path(root, spec, chip, args), date=args.date or datetime.date.today().isoformat(),
        progress=not args.no_progress, shard=parse_shard(args.shard) if args.shard else None,
        heartbeat=args.heartbeat, cross_check=args.cross_check, cross_check_all=args.cross_check_all,
        cross_margin=args.cross_margin, measure_fill=args.measure_fill, remeasure=args.remeasure,
        drop_below=args.drop_below, drop_after=args.drop_after))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import compare
    from .backends import get_backend
    from .bench import Protocol
    from .errors import SpecError
    from .shard import assign, parse_shard
    from .spec import forced_axes

    root = _root(args)
    sys.path.insert(0, str(root))
    spec = _op_spec(root, args.op)
    if args.baseline not in spec.baselines:
        raise SpecError(spec.path, "baselines", f"a baseline named {args.baseline!r}", sorted(spec.baselines))
    rows = _only_cases(spec.expand_cases(args.cases, where=args.where), args.case, args.cases)
    if args.set:
        rows = _with_values(spec, rows, args.set)
    if args.merge:
        generated = compare.generated_hash(root, spec.op)
        merged, toolchain = _merged(rows, [Path(f) for f in args.merge], generated)
        _print_table(merged, args, _provenance(spec.op, generated, toolchain))
        return 0
    if args.devices:
        return _bench_on_devices(args, _check_devices(args), rows)
    if args.shard:
        k, n = parse_shard(args.shard)
        rows = [r for r, s in zip(rows, assign([1.0] * len(rows), n)) if s == k]
    backend = get_backend(args.backend, args.device)
    target = spec.baselines[args.baseline]
    forced = forced_axes(target)
    if forced is not None:  # the op itself with some axes forced, e.g. variant:ALGO=stage0
        from .hardware import chip_for_device_name

        chip = chip_for_device_name(backend.toolchain()["device"], args.backend)
        base = compare.variant_baseline(spec, chip, forced)
    else:
        from .worker import resolve

        base = resolve(target)
    bandwidth = compare.copy_bandwidth(backend)
    print(f"{spec.op} vs {args.baseline} on {backend.toolchain()}; copy bandwidth {bandwidth / 1e12:.3f} TB/s", flush=True)
    protocol = Protocol(warmup=args.warmup, repeat=args.repeat)
    results, failed = [], []
    for row in rows:
        try:
            results.append(compare.run_case(spec, row, backend, base, bandwidth, args.seed, args.rounds, protocol))
        except compare.CaseFailed as exc:  # named; the other cases still run
            failed.append({"case": compare.case_id(row), "error": str(exc)})
            print(f"{failed[-1]['case']}  FAILED {failed[-1]['error']}", flush=True)
            continue
        print(compare.table(results[-1:], args.baseline).splitlines()[1], flush=True)
    generated, toolchain = compare.generated_hash(root, spec.op), backend.toolchain()
    if args.json:
        _write_json(Path(args.json), args, generated, toolchain, results, failed)
    if results:
        _print_table(results, args, _provenance(spec.op, generated, toolchain))
    return _failures(failed, len(rows))


def _failures(failed: list[dict[str, str]], total: int) -> int:
    """Name the cases that failed (on stderr); the exit status: 1 if any did."""
    for f in failed:
        print(f"opgen bench: {f['case']} failed: {f['error']}", file=sys.stderr)
    if failed:
        print(f"opgen bench: {len(failed)} of {total} cases failed", file=sys.stderr)
    return 1 if failed else 0


def _with_values(spec, rows: list[dict], items: list[str]) -> list[dict]:
    """``rows`` with the ``NAME=VALUE`` words of ``--set`` in each, the repeats left out."""
    from .explain import parse_values

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
    from . import compare

    text = compare.table(results, args.baseline)
    print(text)
    if args.output:
        Path(args.output).write_text(f"{provenance}\n{text}\n")


def _provenance(op: str, generated: str, toolchain: dict[str, str]) -> str:
    return f"# {op}: generated/{op} {generated}, measured on {json.dumps(toolchain, sort_keys=True)}"


def _bench_on_devices(args: argparse.Namespace, devices: list[str], rows: list[dict]) -> int:
    """One shard of the cases per device, each side by side in its own process; one table."""
    import tempfile

    from . import compare
    from .shard import run_shards

    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(tmp) / f"shard{i}.json" for i in range(len(devices))]
        codes = run_shards([_options(args, devices=None, output=None, json=str(f)) for f in files], devices)
        # a shard that failed cases exits 1 after writing its file; one without a file broke
        if any(codes) and not all(f.exists() for f in files):
            raise OpgenError(f"bench shards exited with {codes} (devices {','.join(devices)})")
        failed = [x for f in files for x in json.loads(f.read_text()).get("failed", ())]
        lost = {x["case"] for x in failed}
        generated = compare.generated_hash(_root(args), args.op)
        results, toolchain = _merged([r for r in rows if compare.case_id(r) not in lost], files, generated)
    if args.json:  # the merged results, as one shard would have written them
        _write_json(Path(args.json), args, generated, toolchain, results, failed)
    if results:
        _print_table(results, args, _provenance(args.op, generated, toolchain))
    return _failures(failed, len(rows))


def _merged(rows: list[dict], files: list[Path], generated: str) -> tuple[list, dict[str, str]]:
    """The results of the ``--json`` files of bench shards, in case order, and their toolchain
    (:func:`opgen.compare.read_shards`), every shard measured on this tree's generated code."""
    from .compare import read_shards

    results, toolchain, _ = read_shards(rows, files, generated)
    return results, toolchain


def _cmd_host_time(args: argparse.Namespace) -> int:
    import os

    from . import host_time
    from .backends import get_backend

    root = _root(args)
    host_time.check_launch(args.backend, args.launch)
    if args.backend == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: CPU tensors
    sys.path.insert(0, str(root))
    ops = args.ops or sorted(p.stem for p in (root / "specs").glob("*.yaml"))
    specs = [_op_spec(root, op) for op in ops]
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
    for spec in specs:
        if args.cases not in spec.cases and not args.ops:  # an op named on the command line must have it
            print(f"opgen host-time: {spec.op} has no case set {args.cases!r}: skipped", file=sys.stderr)
            continue
        rows = spec.expand_cases(args.cases)
        results += host_time.measure(spec, rows, backend, args.launch, args.rounds, args.calls, args.seed)
    print(host_time.table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            host=host, launch=args.launch, cases=args.cases, rounds=args.rounds, calls=args.calls,
            results=[dict(dataclasses.asdict(r), seen_ratio=r.seen_ratio, unseen_ratio=r.unseen_ratio)
                     for r in results]), indent=1))
    return 0


def _cmd_cases(args: argparse.Namespace) -> int:
    from .case_sample import cases_text, sample_cases
    from .spec import sampled_cases_path

    root = _root(args)
    spec = _op_spec(root, args.op)
    sampled = sample_cases(spec, args.sample, args.seed, args.holdout, args.measure, args.measure_extra)
    given = [f"--{k.replace('_', '-')} {v}" for k, v in (
        ("sample", args.sample), ("seed", args.seed), ("holdout", args.holdout), ("measure", args.measure),
        ("measure_extra", args.measure_extra)) if v is not None]
    text = cases_text(spec, sampled, " ".join(["opgen cases", spec.op, *given]))
    path = Path(args.out) if args.out else sampled_cases_path(spec, root)
    if args.check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            print(f"{path} is not what the sampling section draws; run `opgen cases {spec.op}`", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    sizes = ", ".join(f"{name} {len(rows)}" for name, rows in sampled.parts.items())
    print(f"wrote {path}: {sizes}")
    if sampled.topped_up:
        print(f"drawn further to cover variants {', '.join(sampled.topped_up)}")
    return 0


def _cmd_records(args: argparse.Namespace) -> int:
    from .errors import UsageError
    from .hardware import profile
    from .kernels import kernel_hashes
    from .records import record_path
    from .report import report

    root = _root(args)
    spec = _op_spec(root, args.op)
    chip = profile(args.chip)
    if args.records and not args.pull:  # a file to report on (--pull may make it)
        try:
            options.file_to_read(args.records)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--records: {exc}") from None
    path = Path(args.records) if args.records else record_path(root, chip.name, spec.op)
    if args.pull:
        _pull(args.pull, path, spec.op, chip.name, required=True)
    hashes = kernel_hashes(root, spec, chip.rendering)
    print(report(spec, chip, path, hashes))
    if not path.exists():
        return 0
    from .fill_rank import fill_gate, gate_report
    from .table import frozen_rows

    table = frozen_rows(spec, chip, path, hashes)
    gate = fill_gate(spec, chip, path, hashes, [r.key for r in table.rows if r.source is not None and r.measured is None])
    print("\n".join(gate_report(spec, gate, spec.op, chip.name)))
    return 1 if gate.losses else 0  # the rule loses more than its margin somewhere: measure there


def _pull(url: str, path: Path, op: str, chip: str, required: bool = False) -> None:
    """``records --pull``: the storage's records the file lacks appended to it (with ``required``,
    a StorageError where it holds none of ``op`` on ``chip``)."""
    from .campaign import pull
    from .errors import UsageError
    from .storage import is_postgres, shown

    if not is_postgres(url):
        raise UsageError(f"--pull takes the PostgreSQL URL a campaign kept its records in, got {shown(url)!r}")
    pull(url, path, op, chip, required)


def _cmd_explain(args: argparse.Namespace) -> int:
    from . import explain
    from .hardware import profile

    root = _root(args)
    spec = _op_spec(root, args.op)
    chip = profile(args.chip)
    result = explain.explain(root, spec, chip, explain.parse_values(spec, args.values))
    if args.compile:
        from .resources import compiled_call

        result = compiled_call(root, result, spec, chip, python=args.python)
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else explain.text(result))
    return 1 if "refused" in result else 0  # the op refuses the call: no kernel runs it


def _cmd_resources(args: argparse.Namespace) -> int:
    from .errors import UsageError
    from .hardware import profile
    from .resources import resources, text

    root = _root(args)
    spec = _op_spec(root, args.op)
    if args.check_budget:
        from .resources import check_budget, check_text

        cases = args.cases or ("bench" if "bench" in spec.cases else next(iter(spec.cases)))
        found = check_budget(root, spec, profile(args.chip), spec.expand_cases(cases), args.sample, args.seed,
                             args.variants.split(",") if args.variants else None, not args.no_choices, args.jobs,
                             args.python, Path(args.cache) if args.cache else None, args.compile_timeout or None)
        print(json.dumps(found, indent=1, sort_keys=True) if args.json else check_text(found))
        return 1 if found["underestimates"] else 0
    rows = spec.expand_cases(args.cases) if args.cases else None
    chip, cache = profile(args.chip), Path(args.cache) if args.cache else None
    keep = tuple(n for n in (args.keep or "").split(",") if n)
    if args.spill_free is not None:
        if args.spill_free < 1:
            raise UsageError(f"--spill-free {args.spill_free}: the points to compile a choice must be 1 or more")
        if chip.backend != "cuda":
            raise UsageError("--spill-free needs an NVIDIA chip: the Ascend front end reports no registers")
        unknown = sorted(set(keep) - set(spec.tunables_for(chip.backend)))
        if unknown:
            raise UsageError(f"--keep {','.join(unknown)}: no tunable of {spec.op} on {chip.backend}")
    elif keep:
        raise UsageError("--keep goes with --spill-free")
    report = resources(root, spec, chip, rows, args.jobs, args.python, cache, args.compile_timeout or None)
    if args.spill_free is not None:
        from .resources import default_workers, spill_free

        report["spill_free"] = spill_free(root, spec, chip, report, args.spill_free, args.seed, keep,
                                          args.jobs or default_workers(), args.python, cache,
                                          args.compile_timeout or None)
    print(json.dumps(report, indent=1, sort_keys=True) if args.json else text(report))
    if "spill_free" in report and not args.json:
        from .resources import spill_free_text

        print(spill_free_text(report["spill_free"], keep))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .hardware import profile
    from .review_page import write

    root = _root(args)
    spec = _op_spec(root, args.op)
    chip = profile(args.chip)
    out = Path(args.out) if args.out else root / "report" / chip.name / spec.op
    for path in write(root, spec, chip, out, args.storage):
        print(f"wrote {path}")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from .schema import schema_text

    if args.out:
        Path(args.out).write_text(schema_text(), encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(schema_text())
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    import math

    from . import replay

    sweep = replay.load_sweep(Path(args.records), args.op, args.chip, args.variant)
    budget = max(1, math.floor(args.fraction * len(sweep.times)))
    runs = replay.replay(sweep, budget, range(args.seeds))
    print(replay.report(sweep, runs, budget, args.within))
    return 0


def _add_build(sub: Any) -> None:
    """``opgen build``'s arguments."""
    build = sub.add_parser("build", help="render generated/ from specs, templates and records")
    build.add_argument("--check", action="store_true", help="exit 1 if generated/ is stale; write nothing")
    build.set_defaults(func=_cmd_build)

def _add_cases(sub: Any) -> None:
    """``opgen cases``'s arguments."""
    cases_p = sub.add_parser("cases", help="draw the case sets of an op's sampling section into its file")
    cases_p.add_argument("op", help="operator (specs/<op>.yaml)")
    cases_p.add_argument("--sample", type=options.integer(1, MAX_CASES, "cases one draw may check"), help="cases to draw (default: the section's count)")
    cases_p.add_argument("--seed", type=int, help="seed of the draw and the split (default: the section's)")
    cases_p.add_argument("--holdout", type=options.part, help="share held out (default: the section's)")
    cases_p.add_argument("--measure", type=options.part, help="share kept for the measured fill (default: the section's)")
    cases_p.add_argument("--measure-extra", type=options.integer(0, MAX_CASES),
                         help="cases drawn last, into the measure part alone (default: the section's measure_extra)")
    cases_p.add_argument("--out", type=options.file_to_write, help="write here instead of the section's file")
    cases_p.add_argument("--check", action="store_true", help="exit 1 if the file differs from the draw; write nothing")
    cases_p.set_defaults(func=_cmd_cases)

def _add_tune(sub: Any) -> None:
    """``opgen tune``'s arguments."""
    tune_p = sub.add_parser("tune", help="search tunables on a device; append tuning records")
    tune_p.add_argument("op", help="operator (specs/<op>.yaml)")
    tune_p.add_argument("--chip", required=True, help="chip profile (h200, ascend910b3, interpreter, ...)")
    tune_p.add_argument("--cases", default="bench", help="case set of the spec (default: bench)")
    tune_p.add_argument("--case", action="append", metavar="ID",
                        help="only this case of --cases, by the id the bench tables give it "
                             "(B4-S288-H64-G1-N32-P128-R4-C8-fp16); repeatable")
    tune_p.add_argument("--variants", type=options.names, help="comma-separated variant names (default: all legal)")
    tune_p.add_argument("--device", help="torch device (default: cuda:0, npu:0 or cpu)")
    tune_p.add_argument("--dry-run", action="store_true",
                        help="print the search space and exit (with --trials 0 --measure-fill: the buckets the "
                             "measure step would measure, their candidates, and those an earlier run keeps)")
    tune_p.add_argument("--storage", type=options.storage, help="optuna storage: RDB URL or journal file (default .tune/)")
    tune_p.add_argument("--trials", type=options.non_negative_int, default=40, help="measured points per study at most (0: no search)")
    tune_p.add_argument("--study-seconds", type=options.non_negative, default=900.0)
    tune_p.add_argument("--campaign-seconds", type=options.non_negative, default=3 * 3600.0,
                        help="wall-clock budget of the run: the studies share it, and --measure-fill "
                             "begins no bucket past it (a later run measures the rest)")
    tune_p.add_argument("--point-timeout", type=options.seconds, default=300.0,
                        help="seconds per point (points that timed out under a shorter one are measured again)")
    tune_p.add_argument("--warmup", type=options.non_negative_int, default=5)
    tune_p.add_argument("--repeat", type=options.positive_int, default=25)
    tune_p.add_argument("--seed", type=int, default=0)
    tune_p.add_argument("--date", type=options.date, help="date stamped on records (default: today)")
    tune_p.add_argument("--no-progress", action="store_true", help="no progress bar")
    tune_p.add_argument("--records", type=options.file_to_write, help="record file (default records/<chip>/<op>.jsonl)")
    tune_p.add_argument("--exhaustive-below", type=options.non_negative_int, default=64, help="search exhaustively up to this many points")
    tune_p.add_argument("--cross-check", action="store_true",
                        help="re-measure each tuned bucket's winner against the table's fill from the others")
    tune_p.add_argument("--cross-check-all", action="store_true",
                        help="--cross-check, and every other bucket's winner re-measured on each bucket too")
    tune_p.add_argument("--cross-margin", type=options.non_negative, default=0.10, help="loss that flags the table")
    tune_p.add_argument("--measure-fill", action="store_true",
                        help="re-measure every tuned winner's point on each untuned bucket of --cases, side "
                             "by side: the build fills each with the fastest (with --trials 0: measure only); "
                             "a bucket whose latest measure run holds every candidate on the current kernels "
                             "is kept, so a cut run resumes")
    tune_p.add_argument("--remeasure", action="store_true",
                        help="with --measure-fill: measure every bucket again, even one an earlier run covers")
    tune_p.add_argument("--drop-below", type=options.share, default=0.95,
                        help="with --measure-fill: leave out a candidate that ran under this share of the fastest "
                             "one's speed on every bucket the records measured it on (0: keep every candidate)")
    tune_p.add_argument("--drop-after", type=options.positive_int, default=5,
                        help="with --measure-fill: the measured buckets a candidate needs before --drop-below "
                             "may leave it out")
    tune_p.add_argument("--tie-margin", type=options.non_negative, default=Settings.tie_margin,
                        help="relative gap under which two times of the side-by-side tie (then the smaller "
                             "on-chip estimate wins, then the point's name)")
    tune_p.add_argument("--compile-workers", type=options.non_negative_int, default=0,
                        help="processes compiling and checking a batch of points in parallel before timing")
    tune_p.add_argument("--shard", help="K/N: tune only the K-th of N shares of the buckets (hosts sharing a storage)")
    tune_p.add_argument("--devices", type=options.device_list, help="comma-separated devices (cuda:0,cuda:1): one share of the buckets each, in parallel")
    tune_p.add_argument("--heartbeat", type=options.positive_int, default=HEARTBEAT_SECONDS,
                        help="PostgreSQL storage: seconds between heartbeats of a running trial; one that "
                             "misses three is failed and measured again by another process")
    tune_p.set_defaults(func=_cmd_tune)

def _add_bench(sub: Any) -> None:
    """``opgen bench``'s arguments."""
    bench_p = sub.add_parser("bench", help="time a generated op against a baseline, side by side")
    bench_p.add_argument("op", help="operator (specs/<op>.yaml)")
    bench_p.add_argument("--baseline", required=True, help="a baseline named in the spec (e.g. fla)")
    bench_p.add_argument("--cases", default="bench", help="case set of the spec")
    bench_p.add_argument("--case", action="append", metavar="ID",
                         help="only this case of --cases, by its id in the tables; repeatable")
    bench_p.add_argument("--set", nargs="+", metavar="NAME=VALUE",
                         help="values set in every case (e.g. use_exp2=true for a baseline that computes "
                              "exp2 only); cases made equal by them run once")
    bench_p.add_argument("--backend", default="cuda", choices=("cuda", "npu"))
    bench_p.add_argument("--device", help="torch device (default: the backend's first)")
    bench_p.add_argument("--rounds", type=options.positive_int, default=5, help="interleaved rounds")
    bench_p.add_argument("--warmup", type=options.non_negative_int, default=10)
    bench_p.add_argument("--repeat", type=options.positive_int, default=50)
    bench_p.add_argument("--seed", type=int, default=0)
    bench_p.add_argument("--output", type=options.file_to_write, help="also write the table to this file")
    bench_p.add_argument("--where", metavar="FORMULA",
                         help="run only the cases for which this formula of their fields is true (e.g. "
                              "'chunk_size >= 16'), read as the case set holds them, before --set")
    bench_p.add_argument("--shard", help="K/N: run only the K-th of N shares of the cases")
    bench_p.add_argument("--devices", type=options.device_list, help="comma-separated devices (cuda:0,cuda:1): one share of the cases each, in parallel")
    bench_p.add_argument("--json", type=options.file_to_write, help="also write the results as JSON (what --merge reads; with --devices, the merged results)")
    bench_p.add_argument("--merge", nargs="+", type=options.file_to_read, metavar="JSON",
                         help="run nothing: print one table from the --json files of shards run apart")
    bench_p.set_defaults(func=_cmd_bench)

def _add_host_time(sub: Any) -> None:
    """``opgen host-time``'s arguments."""
    host_p = sub.add_parser("host-time", help="the host work one call of each generated op costs up to its "
                                              "kernels' launch, beside a torch add_")
    host_p.add_argument("ops", nargs="*", help="operators (default: every op of specs/)")
    host_p.add_argument("--cases", default="host", help="case set of each spec (default: host)")
    host_p.add_argument("--backend", default="interpreter", choices=("interpreter", "cuda", "npu"),
                        help="where the tensors live (default: interpreter, CPU tensors)")
    host_p.add_argument("--device", help="torch device (default: the backend's first)")
    host_p.add_argument("--launch", default="none", choices=("none", "real"),
                        help="none: Triton's launch replaced by a no-op (any host); real: the launch itself (a device)")
    host_p.add_argument("--rounds", type=options.positive_int, default=201, help="interleaved rounds")
    host_p.add_argument("--calls", type=options.positive_int, default=10,
                        help="calls a round (few: a round the host's other work preempts is an outlier the median drops)")
    host_p.add_argument("--seed", type=int, default=0)
    host_p.add_argument("--json", type=options.file_to_write, help="also write the results as JSON")
    host_p.set_defaults(func=_cmd_host_time)

def _add_records(sub: Any) -> None:
    """``opgen records``'s arguments."""
    records_p = sub.add_parser("records", help="report what the tuning records of an op on a chip hold")
    records_p.add_argument("op")
    records_p.add_argument("--chip", required=True)
    records_p.add_argument("--records", type=options.file_to_write, help="record file (default: records/<chip>/<op>.jsonl)")
    records_p.add_argument("--pull", metavar="URL", type=options.database_url,
                           help="first append the records a PostgreSQL tuning storage holds and the file lacks")
    records_p.set_defaults(func=_cmd_records)

def _add_explain(sub: Any) -> None:
    """``opgen explain``'s arguments."""
    explain_p = sub.add_parser("explain", help="what the frozen table runs for one call's shape, and why")
    explain_p.add_argument("op")
    explain_p.add_argument("--chip", required=True)
    explain_p.add_argument("values", nargs="+", metavar="NAME=VALUE",
                           help="dims, scalars, dtype, <tensor>_given of the call (e.g. B=2 T=1024 dtype=bfloat16)")
    explain_p.add_argument("--json", action="store_true", help="print the answer as JSON")
    explain_p.add_argument("--compile", action="store_true",
                           help="also compile the kernels it runs at this shape for the chip, on this host (as "
                                "opgen resources: registers, spills, shared memory, occupancy; the Ascend front "
                                "end's verdict on an NPU chip)")
    explain_p.add_argument("--python", help="with --compile: a Python whose Triton has the NVIDIA backend")
    explain_p.set_defaults(func=_cmd_explain)

def _add_resources(sub: Any) -> None:
    """``opgen resources``'s arguments."""
    resources_p = sub.add_parser(
        "resources", help="what the compiler says of the kernels the frozen table launches, no device",
        description="Every kernel the frozen table of CHIP launches (each distinct choice at the case it was measured on, "
                    "and the spec's default at those shapes; or, with --cases, what the table runs on each "
                    "case), compiled for the chip on this host without launching it. NVIDIA: registers per "
                    "thread, spill stores and loads, stack, shared memory, warps, and the blocks per "
                    "multiprocessor they allow; cached by Triton's compile key under .cache/opgen-resources. "
                    "The compile needs upstream Triton's NVIDIA backend: where this Python's Triton lacks it "
                    "(triton-ascend), it runs in a subprocess of --python, $OPGEN_CUDA_PYTHON, or the "
                    ".venv-descriptors that scripts/descriptor_interpreter.sh makes (in the project, or beside "
                    "this Python's venv). Ascend: the front end's verdict (TTIR -> Linalg) beside the spec's "
                    "UB estimate; the compiler's UB figure needs an NPU.")
    resources_p.add_argument("op")
    resources_p.add_argument("--chip", required=True)
    resources_p.add_argument("--cases", help="what the table runs on each case of this case set, instead of its choices")
    resources_p.add_argument("--json", action="store_true", help="print the answer as JSON")
    resources_p.add_argument("--jobs", type=int, help="processes compiling the kernels not cached (default: the CPUs)")
    resources_p.add_argument("--python", help="a Python whose Triton has the NVIDIA backend, for the compile step")
    resources_p.add_argument("--cache", help="folder of the cached figures (default: .cache/opgen-resources)")
    resources_p.add_argument("--compile-timeout", type=float, default=600.0,
                             help="seconds a kernel may take to compile before it is reported as not compiled "
                                  "(0: no limit)")
    resources_p.add_argument("--check-budget", action="store_true",
                             help="the spec's budget formula against the compiled shared memory, on the table's "
                                  "choices and --sample points a variant drawn from its space at the cases of "
                                  "--cases (default: bench, or the spec's first case set); exit 1 on an "
                                  "underestimate")
    resources_p.add_argument("--spill-free", type=int, metavar="N",
                             help="for each choice whose kernels spill, compile the N points of its space nearest it "
                                  "(fewest tunables changed first) at its case, and name the nearest that spills nothing")
    resources_p.add_argument("--keep", type=options.names, help="with --spill-free: tunables held at the choice's values "
                                            "(comma-separated, e.g. CHUNK_MAXNREG,DOT_PRECISION)")
    resources_p.add_argument("--sample", type=int, default=2, help="with --check-budget: points drawn a variant")
    resources_p.add_argument("--seed", type=int, default=0, help="seed of --check-budget's draw and of "
                                                                 "--spill-free's order among points as near")
    resources_p.add_argument("--variants", type=options.names, help="with --check-budget: only these variants (comma-separated)")
    resources_p.add_argument("--no-choices", action="store_true", help="with --check-budget: the drawn points alone")
    resources_p.set_defaults(func=_cmd_resources)

def _add_report(sub: Any) -> None:
    """``opgen report``'s arguments."""
    report_p = sub.add_parser("report", help="a markdown page with plots of an op on a chip, from the committed files")
    report_p.add_argument("op")
    report_p.add_argument("--chip", required=True)
    report_p.add_argument("--out", type=options.folder_to_write, help="folder for the page and its PNGs (default: report/<chip>/<op>)")
    report_p.add_argument("--storage", type=options.storage_to_read, help="read the tuning history from this optuna storage (RDB URL or journal "
                          "file) instead of the records")
    report_p.set_defaults(func=_cmd_report)

def _add_schema(sub: Any) -> None:
    """``opgen schema``'s arguments."""
    schema_p = sub.add_parser("schema", help="the JSON Schema of the spec format")
    schema_p.add_argument("--out", type=options.file_to_write, help="write it to this file (the repository keeps specs/spec.schema.json)")
    schema_p.set_defaults(func=_cmd_schema)

def _add_replay(sub: Any) -> None:
    """``opgen replay``'s arguments."""
    replay_p = sub.add_parser("replay", help="replay the search on a recorded exhaustive sweep")
    replay_p.add_argument("op")
    replay_p.add_argument("--chip", required=True)
    replay_p.add_argument("--records", required=True, type=options.file_to_read, help="record file holding the sweep")
    replay_p.add_argument("--variant", required=True)
    replay_p.add_argument("--fraction", type=options.fraction, default=0.3, help="trial budget as a fraction of the sweep")
    replay_p.add_argument("--within", type=options.non_negative, default=0.03, help="gap to the exhaustive best that counts as a hit")
    replay_p.add_argument("--seeds", type=options.positive_int, default=20)
    replay_p.set_defaults(func=_cmd_replay)

def parser() -> options.Parser:
    """The ``opgen`` command line: the global options, then one sub-command per verb."""
    top = options.Parser(prog="opgen", description=__doc__.splitlines()[0])
    top.add_argument("--root", help="project root (default: found from the current directory)")
    sub = top.add_subparsers(dest="command", required=True)
    for add in (_add_build, _add_cases, _add_tune, _add_bench, _add_host_time, _add_records, _add_explain,
                _add_resources, _add_report, _add_schema, _add_replay):
        add(sub)
    return top


COMMANDS = {"build": _cmd_build, "cases": _cmd_cases, "tune": _cmd_tune, "bench": _cmd_bench, "records": _cmd_records,
            "replay": _cmd_replay, "explain": _cmd_explain, "schema": _cmd_schema, "report": _cmd_report,
            "resources": _cmd_resources, "host-time": _cmd_host_time}
"""Each verb's function (a shard process, parsed by its parent, names its verb)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opgen`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == [FROM_STDIN]:  # a shard process (opgen.shard): its options, parsed by its parent
        args = argparse.Namespace(**json.loads(sys.stdin.read()))
        args.func = COMMANDS[args.command]
    else:
        args = parser().parse_args(argv)
    try:
        return args.func(args)
    except OpgenError as exc:
        print(options.masked(f"opgen {args.command}: error: {exc}"), file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`opgen records ... | head`): not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file that cannot be read or written after its path was checked
        where = f": {exc.filename}" if exc.filename else ""
        print(options.masked(f"opgen {args.command}: error: {exc.strerror or exc}{where}"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
