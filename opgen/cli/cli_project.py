"""What every ``opgen`` verb reads from its arguments: the project root (``--root`` or the nearest
folder above holding ``specs/`` and ``templates/``), an op's spec by name, the cases of a case set
``--case`` keeps, the ``--devices`` list, the records file, and the options a shard process is given.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OpgenError

if TYPE_CHECKING:
    from ..spec.hardware import ChipProfile
    from ..spec.spec import OpSpec


def find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding ``specs/`` and ``templates/``."""
    for candidate in (start, *start.parents):
        if (candidate / "specs").is_dir() and (candidate / "templates").is_dir():
            return candidate
    raise OpgenError(f"no opgen project (specs/ and templates/) at or above {start}")


def project_root(args: argparse.Namespace) -> Path:
    """The project root: ``--root`` or the nearest one above the current directory."""
    return Path(args.root).resolve() if args.root else find_root(Path.cwd())


def op_spec(root: Path, op: str):
    """The spec of ``op``, an operator of the project's ``specs/`` (a name, never a path).

    Raises:
        UsageError: for a name that is no op of the project, listing the ops.
    """
    from ..errors import UsageError
    from ..spec.spec import load_spec

    ops = sorted(p.stem for p in (root / "specs").glob("*.yaml"))
    if op not in ops:
        raise UsageError(f"{op!r} is not an op of {root / 'specs'} (ops: {', '.join(ops) or 'none'})")
    return load_spec(root / "specs" / f"{op}.yaml", root)


def shard_options(args: argparse.Namespace, **changes: object) -> dict[str, object]:
    """The parsed options as a JSON-able value with ``changes``: what a shard process is given."""
    return {**{k: v for k, v in vars(args).items() if k != "func"}, **changes}


def only_cases(rows: list[dict[str, Any]], ids: list[str] | None, set_name: str) -> list[dict[str, Any]]:
    """The rows of case set ``set_name`` whose ids (``B4-S288-...-fp16``, as the bench tables name
    them) are among ``ids`` (``--case``); every row where none is given."""
    from ..evidence.compare import case_id
    from ..errors import UsageError

    if not ids:
        return rows
    known = sorted({case_id(r) for r in rows})
    missing = [i for i in ids if i not in known]
    if missing:
        shown = ", ".join(known[:6]) + (f", ... ({len(known)} in all)" if len(known) > 6 else "")
        raise UsageError(f"--case {', '.join(missing)}: no such case in case set {set_name!r} (its cases: {shown})")
    return [r for r in rows if case_id(r) in ids]


def device_list(args: argparse.Namespace) -> list[str]:
    """The ``--devices`` list, refused together with ``--device`` or ``--shard``."""
    from ..errors import UsageError

    if args.device or args.shard:
        raise UsageError("--devices runs one shard per device: leave out --device and --shard")
    return [d.strip() for d in args.devices.split(",") if d.strip()]


def records_path(root: Path, spec: OpSpec, chip: ChipProfile, args: argparse.Namespace) -> Path:
    """``--records``, or the op's records file of the chip."""
    from ..storage.records import record_path

    return Path(args.records).resolve() if args.records else record_path(root, chip.name, spec.op)

