"""The ``opgen`` command line: the only reader of argv and the environment.

Subcommands: ``build`` (render ``generated/``; ``--check`` exits 1 when it is stale) and
``tune`` (an offline campaign on a device; ``--dry-run`` prints the search space only).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import OpgenError


def _find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding ``specs/`` and ``templates/``."""
    for candidate in (start, *start.parents):
        if (candidate / "specs").is_dir() and (candidate / "templates").is_dir():
            return candidate
    raise OpgenError(f"no opgen project (specs/ and templates/) at or above {start}")


def _cmd_build(args: argparse.Namespace) -> int:
    from . import freeze

    root = Path(args.root).resolve() if args.root else _find_root(Path.cwd())
    files = freeze.build_all(root)
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


def _cmd_tune(args: argparse.Namespace) -> int:
    import datetime
    import os

    from . import freeze, tune
    from .bench import Protocol
    from .errors import UnsupportedInput
    from .hardware import profile
    from .records import latest_winners, read, record_path
    from .space import Point
    from .spec import load_spec

    root = Path(args.root).resolve() if args.root else _find_root(Path.cwd())
    spec = load_spec(root / "specs" / f"{args.op}.yaml", root)
    chip = profile(args.chip)
    rows = spec.expand_cases(args.cases)
    plans = tune.plan(spec, chip, rows, args.variants.split(",") if args.variants else None)
    if args.dry_run:
        print(tune.dry_run_table(spec, chip, plans))
        return 0
    stale = freeze.stale(root, freeze.build_all(root))
    if stale:
        raise UnsupportedInput(f"generated/ is stale ({len(stale)} files): run `opgen build` first, "
                               "so the tuned kernels are the ones that will be frozen")
    backend_name = chip.backend
    device = args.device or {"cuda": "cuda:0", "npu": "npu:0", "interpreter": "cpu"}[backend_name]
    env = {"TRITON_INTERPRET": "1"} if backend_name == "interpreter" else {}
    if backend_name == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
    from .backends import get_backend

    backend = get_backend(backend_name, device)
    toolchain = backend.toolchain()
    device_name = toolchain.pop("device", "")
    if backend_name != "interpreter" and not any(s in device_name for s in chip.device_names):
        raise UnsupportedInput(f"device {device!r} is {device_name!r}, not a {chip.name}: tables are per chip")
    programs = chip.programs if backend_name == "interpreter" else (
        backend.cores() if backend_name == "npu" else __import__("torch").cuda.get_device_properties(device).multi_processor_count)
    hashes = tune.kernel_hashes(root, spec, chip.rendering)
    path = record_path(root, chip.name, spec.op)
    earlier = {k: Point(w.variant, tuple(w.point.items())) for k, w in
               latest_winners(read(path, op=spec.op, chip=chip.name).records).items()} if path.exists() else {}
    date = args.date or datetime.date.today().isoformat()
    settings = tune.Settings(trials=args.trials, study_seconds=args.study_seconds,
                             campaign_seconds=args.campaign_seconds, seed=args.seed,
                             point_timeout=args.point_timeout,
                             protocol=Protocol(warmup=args.warmup, repeat=args.repeat))
    storage = tune.open_storage(args.storage or str(root / ".tune" / f"{chip.name}-{spec.op}.journal"))
    campaign = tune.Campaign(spec, chip, str(root), backend_name, device, programs, storage,
                             tune.record_sink(path, spec, chip.name, toolchain, hashes, date),
                             toolchain, settings, hashes, env, dict(spec.accuracy.max_rel_l2),
                             progress=not args.no_progress)
    winners = campaign.run(plans, earlier)
    print(tune.summary(winners, tuple(spec.dispatch.key)))
    print(f"records: {path.relative_to(root)}; run `opgen build` to freeze them")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opgen`` console script."""
    parser = argparse.ArgumentParser(prog="opgen", description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="project root (default: found from the current directory)")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="render generated/ from specs, templates and records")
    build.add_argument("--check", action="store_true", help="exit 1 if generated/ is stale; write nothing")
    build.set_defaults(func=_cmd_build)
    tune_p = sub.add_parser("tune", help="search tunables on a device; append tuning records")
    tune_p.add_argument("op", help="operator (specs/<op>.yaml)")
    tune_p.add_argument("--chip", required=True, help="chip profile (h200, ascend910b3, interpreter, ...)")
    tune_p.add_argument("--cases", default="bench", help="case set of the spec (default: bench)")
    tune_p.add_argument("--variants", help="comma-separated variant names (default: all legal)")
    tune_p.add_argument("--device", help="torch device (default: cuda:0, npu:0 or cpu)")
    tune_p.add_argument("--dry-run", action="store_true", help="print the search space and exit")
    tune_p.add_argument("--storage", help="optuna storage: RDB URL or journal file (default .tune/)")
    tune_p.add_argument("--trials", type=int, default=40, help="measured points per study at most")
    tune_p.add_argument("--study-seconds", type=float, default=900.0)
    tune_p.add_argument("--campaign-seconds", type=float, default=3 * 3600.0)
    tune_p.add_argument("--point-timeout", type=float, default=300.0, help="seconds per point")
    tune_p.add_argument("--warmup", type=int, default=5)
    tune_p.add_argument("--repeat", type=int, default=25)
    tune_p.add_argument("--seed", type=int, default=0)
    tune_p.add_argument("--date", help="date stamped on records (default: today)")
    tune_p.add_argument("--no-progress", action="store_true", help="no progress bar")
    tune_p.set_defaults(func=_cmd_tune)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except OpgenError as exc:
        print(f"opgen {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
