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

This module builds the parser and runs a verb; each verb's arguments are in ``cli_parser``, its
function in ``cli_campaign`` (build, cases, tune, records), ``cli_bench`` (bench, host-time) or
``cli_inspect`` (explain, resources, report, schema, replay).
"""
from __future__ import annotations

import argparse
import json
import sys

from .. import options
from ..errors import OpgenError
from ..tune.shard import FROM_STDIN
from .cli_bench import cmd_bench, cmd_host_time
from .cli_campaign import cmd_build, cmd_cases, cmd_records, cmd_tune
from .cli_inspect import cmd_explain, cmd_replay, cmd_report, cmd_resources, cmd_schema
from .cli_parser import add_verbs


def parser() -> options.Parser:
    """The ``opgen`` command line: the global options, then one sub-command per verb."""
    top = options.Parser(prog="opgen", description=__doc__.splitlines()[0])
    top.add_argument("--root", help="project root (default: found from the current directory)")
    sub = top.add_subparsers(dest="command", required=True)
    add_verbs(sub)
    return top


COMMANDS = {"build": cmd_build, "cases": cmd_cases, "tune": cmd_tune, "bench": cmd_bench, "records": cmd_records,
            "replay": cmd_replay, "explain": cmd_explain, "schema": cmd_schema, "report": cmd_report,
            "resources": cmd_resources, "host-time": cmd_host_time}
"""Each verb's function (a shard process, parsed by its parent, names its verb)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opgen`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == [FROM_STDIN]:  # a shard process (opgen.tune.shard): its options, parsed by its parent
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
