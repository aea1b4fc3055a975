"""The ``opgen`` command line: the only reader of argv and the environment.

Subcommands: ``build`` (render ``generated/``; ``--check`` exits 1 when it is stale).
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opgen`` console script."""
    parser = argparse.ArgumentParser(prog="opgen", description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="project root (default: found from the current directory)")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="render generated/ from specs, templates and records")
    build.add_argument("--check", action="store_true", help="exit 1 if generated/ is stale; write nothing")
    build.set_defaults(func=_cmd_build)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except OpgenError as exc:
        print(f"opgen {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
