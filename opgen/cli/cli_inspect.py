"""The ``opgen`` verbs that read the committed files, no device: ``explain`` (what the frozen table
runs for one call), ``resources`` (what the compiler says of the kernels it launches), ``report``
(the markdown page), ``schema`` (the spec format's JSON Schema) and ``replay`` (the search replayed
on a recorded sweep).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_project import op_spec, project_root


def cmd_explain(args: argparse.Namespace) -> int:
    from ..evidence import explain
    from ..spec.hardware import profile

    root = project_root(args)
    spec = op_spec(root, args.op)
    chip = profile(args.chip)
    result = explain.explain(root, spec, chip, explain.parse_values(spec, args.values))
    if args.compile:
        from ..evidence.resources import compiled_call

        result = compiled_call(root, result, spec, chip, python=args.python)
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else explain.text(result))
    return 1 if "refused" in result else 0  # the op refuses the call: no kernel runs it


def cmd_resources(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..spec.hardware import profile
    from ..evidence.resources import resources, text

    root = project_root(args)
    spec = op_spec(root, args.op)
    if args.check_budget:
        from ..evidence.resource_checks import check_budget, check_text

        from ..space.plan import known_variants

        cases = args.cases or ("bench" if "bench" in spec.cases else next(iter(spec.cases)))
        known_variants(spec, profile(args.chip), args.variants.split(",") if args.variants else None)
        found = check_budget(root, spec, profile(args.chip), spec.expand_cases(cases), args.sample, args.seed,
                             args.variants.split(",") if args.variants else None, not args.no_choices, args.jobs,
                             args.python, Path(args.cache) if args.cache else None, args.compile_timeout or None)
        print(json.dumps(found, indent=1, sort_keys=True) if args.json else check_text(found))
        return 1 if found["underestimates"] else 0
    rows = spec.expand_cases(args.cases) if args.cases else None
    chip, cache = profile(args.chip), Path(args.cache) if args.cache else None
    if args.spill_free is not None:
        if args.spill_free < 1:
            raise UsageError(f"--spill-free {args.spill_free}: the points to compile a choice must be 1 or more")
        if chip.backend != "cuda":
            raise UsageError("--spill-free needs an NVIDIA chip: the Ascend front end reports no registers")
        from ..evidence.resource_checks import parse_search

        keep, settings, twins = parse_search(spec, chip, args.keep, args.set, args.twins)
    elif args.keep or args.set or args.twins:
        raise UsageError("--keep, --set and --twins go with --spill-free")
    report = resources(root, spec, chip, rows, args.jobs, args.python, cache, args.compile_timeout or None)
    if args.spill_free is not None:
        from ..evidence.resource_checks import spill_free
        from ..evidence.resources import default_workers

        report["spill_free"] = spill_free(root, spec, chip, report, args.spill_free, args.seed, keep,
                                          args.jobs or default_workers(), args.python, cache,
                                          args.compile_timeout or None, settings, twins)
    print(json.dumps(report, indent=1, sort_keys=True) if args.json else text(report))
    if "spill_free" in report and not args.json:
        from ..evidence.resource_checks import spill_free_text

        print(spill_free_text(report["spill_free"], keep))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..spec.hardware import profile
    from ..evidence.review_page import write

    root = project_root(args)
    spec = op_spec(root, args.op)
    chip = profile(args.chip)
    out = Path(args.out) if args.out else root / "report" / chip.name / spec.op
    for path in write(root, spec, chip, out, args.storage):
        print(f"wrote {path}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from ..spec.schema import schema_text

    if args.out:
        Path(args.out).write_text(schema_text(), encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(schema_text())
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    import math

    from ..evidence import replay

    sweep = replay.load_sweep(Path(args.records), args.op, args.chip, args.variant)
    budget = max(1, math.floor(args.fraction * len(sweep.times)))
    runs = replay.replay(sweep, budget, range(args.seeds))
    print(replay.report(sweep, runs, budget, args.within))
    return 0

