"""The import contracts of pyproject.toml's ``[tool.importlinter]`` hold: opgen's packages, and the
modules of each, follow the flow, and no module or package imports another that imports it back,
imports inside functions included."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the ``opgen`` package under ``root``, with that tree's contracts."""
    code = ("from importlinter.cli import lint_imports; "
            "raise SystemExit(lint_imports('pyproject.toml', no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_package_keeps_its_import_contracts() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{CONTRACTS} kept, 0 broken" in result.stdout


def test_an_import_cycle_inside_a_function_breaks_them(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "opgen", tmp_path / "opgen", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    expr = tmp_path / "opgen" / "spec" / "expr.py"  # the bottom of the flow importing its top
    expr.write_text(expr.read_text() + "\n\ndef _probe() -> None:\n    from .. import cli  # noqa: F401\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "0 kept, 2 broken" in result.stdout, result.stdout
    assert "opgen.spec.expr -> opgen.cli" in result.stdout
