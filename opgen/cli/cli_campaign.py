"""The ``opgen`` verbs of a campaign's flow: ``cases`` (draw a spec's case sets), ``tune`` (search on
a device, or ``--dry-run``), ``records`` (what the tuning records hold, and the ranked fill's
leave-one-out gate) and ``build`` (render ``generated/``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import options
from ..errors import OpgenError
from ..tune.settings import Settings
from .cli_project import device_list, only_cases, op_spec, project_root, records_path, shard_options

if TYPE_CHECKING:
    from ..spec.hardware import ChipProfile
    from ..spec.spec import OpSpec


def cmd_build(args: argparse.Namespace) -> int:
    from ..build import freeze

    root = project_root(args)
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


def cmd_cases(args: argparse.Namespace) -> int:
    from ..space.case_sample import cases_text, sample_cases
    from ..spec.spec import sampled_cases_path

    root = project_root(args)
    spec = op_spec(root, args.op)
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


def _measure_plan(root: Path, spec: OpSpec, chip: ChipProfile, rows: list[dict[str, Any]],
                  args: argparse.Namespace) -> str:
    """``opgen tune --trials 0 --measure-fill --dry-run``: what the measure step would run, from the
    records and kernels here (:func:`opgen.tune.measure_fill.measure_plan`), on no device."""
    from ..tune.campaign import measure_inputs
    from ..render.kernels import kernel_hashes
    from ..tune.measure_fill import measure_plan, outrun_line
    from ..space.plan import buckets

    tuned, pending, earlier, left_out, _ = measure_inputs(
        spec, chip, records_path(root, spec, chip, args), kernel_hashes(root, spec, chip.rendering),
        args.drop_below, args.drop_after, args.remeasure)
    return "\n".join([*(outrun_line(o) for o in left_out),
                      measure_plan(spec, chip, buckets(spec, rows), tuned, earlier, pending, left_out)])


def _check_tune_options(args: argparse.Namespace, chip: ChipProfile) -> None:
    """Refuse, before any work (a dry run too), a device of another kind than the chip's and an
    option that goes only with one not given."""
    from ..errors import UsageError

    # (the interpreter takes any device name: its shards stand for devices, on the CPU)
    if args.device and chip.backend != "interpreter" and args.device.split(":")[0] != chip.backend:
        raise UsageError(f"--device {args.device}: chip {chip.name} is tuned on {chip.backend} devices")
    if args.remeasure and not args.measure_fill:
        raise UsageError("--remeasure goes with --measure-fill")
    if args.shard:
        from ..tune.shard import parse_shard

        parse_shard(args.shard)


def cmd_tune(args: argparse.Namespace) -> int:
    import datetime

    from ..tune import campaign
    from ..run.bench import Protocol
    from ..space.dry_run import dry_run_table
    from ..spec.hardware import profile
    from ..space.plan import plan
    from ..tune.shard import parse_shard, run_shards, shard_plans

    root = project_root(args)
    spec = op_spec(root, args.op)
    chip = profile(args.chip)
    _check_tune_options(args, chip)
    rows = only_cases(spec.expand_cases(args.cases), args.case, args.cases)
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
        devices = device_list(args)
        search = shard_options(args, devices=None, cross_check=False, cross_check_all=False, measure_fill=False)
        codes = run_shards([search] * len(devices), devices)
        if (args.cross_check or args.cross_check_all or args.measure_fill) and not any(codes):
            codes += run_shards([shard_options(args, devices=None, trials=0)], devices[:1])
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
        records=records_path(root, spec, chip, args), date=args.date or datetime.date.today().isoformat(),
        progress=not args.no_progress, shard=parse_shard(args.shard) if args.shard else None,
        heartbeat=args.heartbeat, cross_check=args.cross_check, cross_check_all=args.cross_check_all,
        cross_margin=args.cross_margin, measure_fill=args.measure_fill, remeasure=args.remeasure,
        drop_below=args.drop_below, drop_after=args.drop_after))
    return 0


def cmd_records(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..spec.hardware import profile
    from ..render.kernels import kernel_hashes
    from ..storage.records import record_path
    from ..evidence.report import report

    root = project_root(args)
    spec = op_spec(root, args.op)
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
    from ..table.fill_score import fill_gate, gate_report
    from ..table.table import frozen_rows

    table = frozen_rows(spec, chip, path, hashes)
    gate = fill_gate(spec, chip, path, hashes, [r.key for r in table.rows if r.source is not None and r.measured is None])
    print("\n".join(gate_report(spec, gate, spec.op, chip.name)))
    return 1 if gate.losses else 0  # the rule loses more than its margin somewhere: measure there


def _pull(url: str, path: Path, op: str, chip: str, required: bool = False) -> None:
    """``records --pull``: the storage's records the file lacks appended to it (with ``required``,
    a StorageError where it holds none of ``op`` on ``chip``)."""
    from ..tune.campaign import pull
    from ..errors import UsageError
    from ..storage.storage import is_postgres, shown

    if not is_postgres(url):
        raise UsageError(f"--pull takes the PostgreSQL URL a campaign kept its records in, got {shown(url)!r}")
    pull(url, path, op, chip, required)

