"""The "Uses" sentence of a driver module's docstring names exactly the opgen modules it imports."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "opgen"
MODULES = sorted(PACKAGE.glob("*.py"))


def imported(path: Path) -> set[str]:
    """The opgen modules a module imports anywhere in it (inside functions too), itself aside."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:  # a sibling of the opgen package
                module = "opgen." + module if module else "opgen"
            if module == "opgen":
                found |= {alias.name for alias in node.names}
            elif module.startswith("opgen."):
                found.add(module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("opgen.")}
    return found - {path.stem}


def named(path: Path) -> set[str] | None:
    """The modules the docstring's "Uses ..." sentence names, None without one."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    match = re.search(r"^Uses (.*?)\.$", doc, re.M | re.S)
    return set(re.findall(r"``(\w+)``", match.group(1))) if match else None


def test_the_check_reads_imports_at_every_level(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text('"""Probe.\n\nUses ``spec``.\n"""\nfrom opgen import spec\n\n\n'
                      "def f():\n    from opgen.keys import bucket\n    import opgen.expr\n")
    assert named(module) == {"spec"}
    assert imported(module) == {"spec", "keys", "expr"}


@pytest.mark.parametrize("path", [m for m in MODULES if named(m) is not None],
                         ids=lambda p: p.stem)
def test_a_modules_uses_line_names_what_it_imports(path: Path) -> None:
    assert named(path) == imported(path), (
        f"{path.name}: the docstring's Uses line names {sorted(named(path) or ())}, "
        f"the module imports {sorted(imported(path))}")
