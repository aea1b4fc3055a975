"""Template headers say what the build passes: the names after ``Expects:`` in a template's
``{# ... #}`` header are the names the template reads, and the build passes each of them."""
import re
from pathlib import Path

import pytest
from jinja2 import meta, nodes

from opgen.build import branches
from opgen.render import kernels
from opgen.render.render import environment

ROOT = Path(__file__).resolve().parents[1]
# every template rendered with a context of its own (included pieces read their includer's names)
TEMPLATES = [p for p in sorted(kernels.DRIVER_TEMPLATES.glob("*.j2")) + sorted(ROOT.glob("templates/*/*.j2"))
             if "Expects:" in p.read_text()]


def _expects(text: str) -> set[str]:
    """The names of the header's ``Expects:`` sentence (remarks in parentheses left out)."""
    header = text[text.index("{#") + 2:text.index("#}")]
    found = re.search(r"Expects:(.*?)\.(\s|$)", header, re.S)
    assert found, "the header has no Expects: sentence"
    names = re.sub(r"\([^)]*\)", "", found.group(1))
    return {n.strip() for n in names.replace("\n", " ").split(",") if n.strip()}


@pytest.fixture(scope="module")
def passed(project_build):
    """Template name -> the context names the build passes it (over every op): conftest's
    project_build, one build of the project per run (test_build reads its files)."""
    return project_build[1]


def test_every_kernel_and_driver_template_is_covered():
    names = {p.name for p in TEMPLATES}
    assert {"api.py.j2", "table.py.j2", "chunk_o.py.j2", "bwd_fwd.py.j2", "folded.py.j2"} <= names


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_header_names_what_the_template_reads_and_the_build_passes(path, passed):
    text = path.read_text()
    env = environment([path.parent])
    tree = env.parse(text)
    assigned = {a.target.name for a in tree.find_all(nodes.Assign) if isinstance(a.target, nodes.Name)}
    reads = meta.find_undeclared_variables(tree) - assigned  # a name set in branches reads as free
    expects = _expects(text)
    assert expects == reads, f"header lists {sorted(expects - reads)} unread, misses {sorted(reads - expects)}"
    assert expects <= passed[path.name], f"the build does not pass {sorted(expects - passed[path.name])}"


@pytest.mark.parametrize("op", ["chunk_gla_fwd_o_gk", "mamba3_mimo_bwd_fwd"])
def test_the_public_docstring_ends_with_raises_and_holds_only_errors_there(op):
    """Google style: the prose before ``Args:``, then Args, Returns and Raises in that order, and
    every line under ``Raises:`` names an exception."""
    import ast

    tree = ast.parse((ROOT / "generated" / op / "__init__.py").read_text())
    doc = ast.get_docstring(next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == op))
    sections = [line for line in doc.splitlines() if line in ("Args:", "Returns:", "Raises:")]
    assert sections == ["Args:", "Returns:", "Raises:"]
    prose = doc.split("Args:")[0]
    assert "strides" in prose  # what the call does with a strided view is said before the arguments
    raises = doc.split("Raises:")[1].strip().splitlines()
    assert raises and all(re.match(r"[A-Z][A-Za-z]*Error: ", line.strip()) for line in raises), raises


def test_the_default_functions_render_no_branch_that_does_nothing():
    """A branch on an option its axis never takes, and an assignment of the value a tunable holds
    there before any branch changed it, are not rendered; one that may change the value (another
    value, a value changed by an earlier branch, True for 1, a formula the option does not decide)
    is."""
    fixed = [("GRID", "tiled", [("occupancy", "1")]),                   # no-op: occupancy is 1 already
             ("SCALE", "fp32", [("A_PAIR", "False"), ("BK", "64")]),     # BK's default is a formula
             ("SHAPE", "single", [("A_PAIR", "True")]),                  # a change
             ("SHAPE", "vloop", [("A_PAIR", "False")]),                  # after a change: kept
             ("SHAPE", "h1", [("BV", "N")]),                             # BV is N where SHAPE is h1
             ("SHAPE", "wide", [("BV", "N")]),                           # SHAPE is never wide
             ("GRID", "tma", [("occupancy", "True"), ("EVEN", "False")])]  # True is not 1
    tunables = {"occupancy": "1", "A_PAIR": "False", "BK": "min(64, K)",
                "BV": "64 if SHAPE in ('single', 'vloop') else N", "EVEN": "has_z and GRID == 'tiled'"}
    axes = {"GRID": "'tiled' if K > 64 else 'tma'", "SCALE": "scale_path(K)",
            "SHAPE": "'single' if K < 64 else 'vloop' if H == 1 else 'h1'"}
    assert branches.live_branches(fixed, tunables, axes) == [
        ("SCALE", "fp32", [("BK", "64")]), ("SHAPE", "single", [("A_PAIR", "True")]),
        ("SHAPE", "vloop", [("A_PAIR", "False")]),
        ("GRID", "tma", [("occupancy", "True"), ("EVEN", "False")])]  # has_z and False: has_z if falsy
    assert not branches.may_hold("'persistent'", "tiled") and branches.may_hold("'persistent'", "persistent")
    assert not branches.may_hold("'a' if K > 64 else 'b'", "tiled")  # a choice among constants
    assert branches.may_hold("pick(K)", "tiled")  # any other formula may take any option
    text = (ROOT / "generated" / "chunk_gla_fwd_o_gk" / "__init__.py").read_text()
    body = text[text.index("def _default_npu"):text.index("def _default_cuda")]
    assert 'GRID = "persistent"' in body and "if GRID ==" not in body
    body = text[text.index("def _default_cuda"):text.index("def _default_interpreter")]
    assert 'SHAPE = "h1" if H == 1 else "general"' in body and "if SHAPE ==" not in body
