"""The "Uses" sentence of a driver module's docstring names exactly the opgen modules it imports.

A module is named by its file's stem (``keys`` for ``opgen/spec/keys.py``): the packages of the flow
only group modules, and no two modules of them share a name. ``backends``, ``references`` and
``baselines`` are named as packages."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "opgen"
UNITS = {"backends", "references", "baselines"}  # packages named as one module
FLOW = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py") if p.parent.name not in UNITS)
MODULES = sorted([*PACKAGE.glob("*.py"), *(m for f in FLOW for m in (PACKAGE / f).glob("*.py"))])


def name(module: str) -> list[str]:
    """What an absolute ``opgen...`` module counts as: a flow package's module by its stem, any other
    by its first part below ``opgen``; a flow package itself by nothing (its names are modules)."""
    parts = module.split(".")[1:]
    if not parts or (parts[0] in FLOW and len(parts) == 1):
        return []
    return [parts[1] if parts[0] in FLOW else parts[0]]


def imported(path: Path, package: str | None = None) -> set[str]:
    """The opgen modules a module imports anywhere in it (inside functions too), itself aside;
    ``package`` is the module's own (by default the one its path under opgen/ says)."""
    if package is None:
        package = ".".join(["opgen", *path.relative_to(PACKAGE).parent.parts])
    here = package.split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative to the module's package
                base = here[:len(here) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            if module == "opgen" or module.removeprefix("opgen.") in FLOW:
                found |= {n for a in node.names for n in name(f"{module}.{a.name}")}
            elif module.startswith("opgen."):
                found |= set(name(module))
        elif isinstance(node, ast.Import):
            found |= {n for a in node.names if a.name.startswith("opgen.") for n in name(a.name)}
    return found - {path.stem}


def named(path: Path) -> set[str] | None:
    """The modules the docstring's "Uses ..." sentence names, None without one."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    match = re.search(r"^Uses (.*?)\.$", doc, re.M | re.S)
    return set(re.findall(r"``(\w+)``", match.group(1))) if match else None


def test_the_check_reads_imports_at_every_level(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text('"""Probe.\n\nUses ``spec``.\n"""\nfrom opgen.spec import spec\n\n\n'
                      "def f():\n    from opgen.spec.keys import bucket\n    import opgen.spec.expr\n"
                      "    from opgen import errors\n    from opgen.backends import get_backend\n")
    assert named(module) == {"spec"}
    assert imported(module, "opgen") == {"spec", "keys", "expr", "errors", "backends"}


def test_relative_imports_count_from_the_modules_package(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from . import fits\nfrom .table_rows import x\nfrom ..spec import keys\n"
                     "from ..spec.hardware import y\nfrom ..errors import z\nfrom .. import backends\n"
                     "from ..backends.cuda import w\n")
    assert imported(probe, "opgen.table") == {"fits", "table_rows", "keys", "hardware", "errors", "backends"}


def test_module_stems_are_unique() -> None:
    stems = [m.stem for m in MODULES if m.stem not in ("__init__", "__main__")]
    assert len(stems) == len(set(stems)), sorted(s for s in stems if stems.count(s) > 1)


@pytest.mark.parametrize("path", [m for m in MODULES if named(m) is not None],
                         ids=lambda p: p.relative_to(PACKAGE).with_suffix("").as_posix())
def test_a_modules_uses_line_names_what_it_imports(path: Path) -> None:
    assert named(path) == imported(path), (
        f"{path.name}: the docstring's Uses line names {sorted(named(path) or ())}, "
        f"the module imports {sorted(imported(path))}")
