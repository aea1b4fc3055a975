"""The ``module:name`` paths a spec names (its references and baselines) resolved without importing
them: the module's source is found (the project root first, then the installed packages) and
read as a syntax tree, and the name must be defined at its top level. ``opgen build`` refuses a
spec whose tuner or bench would fail on such a path later. Uses ``errors``, ``spec_model``,
``spec_semantics``.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from ..errors import SpecError
from .spec_model import OpSpec
from .spec_semantics import forced_axes


def check_paths(spec: OpSpec, root: Path) -> None:
    """Raise SpecError naming the key whose ``module:name`` path names no module, or a name its
    module does not define at its top level."""
    paths = {f"reference.{key}": value for key, value in spec.reference.model_dump().items() if value}
    paths.update({f"baselines.{name}": target for name, target in spec.baselines.items()
                  if forced_axes(target) is None})
    for key, target in paths.items():
        module, _, name = target.partition(":")
        source = _source(module, root)
        if source is None:
            raise SpecError(spec.path, key, f"a module:name path whose module exists (under {root} or installed)",
                            target)
        if name not in _top_level_names(source):
            raise SpecError(spec.path, key, f"a name {source} defines at its top level", target)


def _source(module: str, root: Path) -> Path | None:
    """The source file of ``module``: under ``root`` (a module or a package), else where Python
    finds it (parent packages are imported, the module itself is not)."""
    parts = module.split(".")
    for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    sys.path.insert(0, str(root))
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path.remove(str(root))
    origin = found.origin if found is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _top_level_names(source: Path) -> set[str]:
    """The names a module binds at its top level: functions, classes, assignments and imports."""
    names: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8"), str(source)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names
