"""Load ``specs/<op>.yaml`` into frozen, validated models.

A spec is read as YAML without duplicate keys, its sampled case sets joined, then validated in
turn by the schema (:mod:`opgen.spec.spec_model`), the cross-reference checks
(:mod:`opgen.spec.spec_semantics`) and the value checks (:mod:`opgen.spec.spec_values`); each raises
:class:`~opgen.errors.SpecError` naming the file, the key path and what was expected. The
models the driver reads are importable from here. No torch, no triton. Uses ``errors``, ``spec_model``,
``spec_semantics`` and ``spec_values``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import SpecError
from .spec_model import DTYPES, Check, KeyField, OpSpec, Sampling, schema_error
from .spec_semantics import forced_axes, validate_semantics
from .spec_values import UniqueKeyLoader, check_values

__all__ = ["DTYPES", "Check", "KeyField", "OpSpec", "Sampling", "forced_axes", "load_spec", "load_specs",
           "sampled_cases_path"]


def load_spec(path: str | Path, root: str | Path | None = None) -> OpSpec:
    """Load and validate one spec file.

    Args:
        path: the YAML file.
        root: directory that error messages are relative to (default: the current directory).

    Raises:
        SpecError: on unreadable YAML, a schema violation or an inconsistent spec.
    """
    path = Path(path)
    try:
        shown = str(path.resolve().relative_to(Path(root or Path.cwd()).resolve()))
    except ValueError:
        shown = str(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None and "line" not in problem else ""
        raise SpecError(shown, "<root>", "valid YAML", problem + where) from None
    except UnicodeDecodeError as exc:
        raise SpecError(shown, "<root>", "UTF-8 text", f"byte {exc.object[exc.start]:#04x} at offset "
                        f"{exc.start}") from None
    except OSError as exc:
        raise SpecError(shown, "<root>", "a readable file", exc.strerror) from None
    if not isinstance(data, dict):
        raise SpecError(shown, "<root>", "a mapping", type(data).__name__)
    if data.get("op") is not None and data["op"] != path.stem:
        raise SpecError(shown, "op", f"the file's stem {path.stem!r}", data["op"])
    data = _with_sampled_cases(data, path, shown)
    try:
        spec = OpSpec.model_validate({**data, "path": shown})
    except ValidationError as exc:
        raise schema_error(shown, exc) from None
    validate_semantics(spec, shown)
    check_values(spec, shown, DTYPES)
    return spec


def sampled_cases_path(spec: OpSpec, root: str | Path | None = None) -> Path | None:
    """The file the spec's sampling section writes its case sets to (None without one)."""
    if spec.sampling is None:
        return None
    return (Path(root or Path.cwd()) / spec.path).parent / spec.sampling.file


def _with_sampled_cases(data: dict[str, Any], path: Path, shown: str) -> dict[str, Any]:
    """``data`` with the case sets of its sampling section's file (when it exists) among its cases."""
    sampling = data.get("sampling")
    if not isinstance(sampling, dict) or not isinstance(sampling.get("file"), str):
        return data  # the schema names what is wrong
    file = path.parent / sampling["file"]
    if not file.is_file():
        return data  # not drawn yet: `opgen cases <op>` writes it
    where = f"{shown} sampling.file {sampling['file']}"
    try:
        sets = yaml.load(file.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        raise SpecError(where, "<root>", "a readable YAML file of case sets", str(exc).splitlines()[0]) from None
    if not isinstance(sets, dict) or not all(isinstance(v, list) for v in sets.values()):
        raise SpecError(where, "<root>", "a mapping of case set names to lists of cases", type(sets).__name__)
    inline = data.get("cases") or {}
    clash = sorted(set(sets) & set(inline)) if isinstance(inline, dict) else []
    if clash:
        raise SpecError(shown, "cases", f"no case set named like one of {sampling['file']}", clash)
    return {**data, "cases": {**inline, **sets}} if isinstance(inline, dict) else data


def load_specs(spec_dir: str | Path, root: str | Path | None = None) -> list[OpSpec]:
    """Every ``*.yaml`` in ``spec_dir``, sorted by file name."""
    return [load_spec(p, root) for p in sorted(Path(spec_dir).glob("*.yaml"))]
