"""Generated modules as black lays them out (opgen.render.pyformat): an op's API, tables and cuda
kernels are black's output at the pinned mode, formatting them again changes nothing, and a
kernel's identity stays the template's output."""
import ast
from pathlib import Path

import black
import pytest

from opgen.render import kernels
from opgen.render.pyformat import MODE, WIDTH, fill_prose, format_source
from opgen.spec.spec import load_spec
from opgen.storage.records import kernel_hash

ROOT = Path(__file__).resolve().parents[1]
OPS = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))


@pytest.mark.parametrize("op", OPS)
def test_an_ops_api_tables_and_cuda_kernels_are_blacks_layout_of_themselves(op):
    """The op's API and tables, and its cuda kernels (the other renderings and the strided twins
    come from the same templates through the same formatter)."""
    base = ROOT / "generated" / op
    paths = sorted(base.glob("*.py")) + sorted((base / "kernels" / "cuda").glob("*.py"))
    assert len(paths) > 3
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert black.format_str(text, mode=MODE) == text, path
        assert fill_prose(text) == text, path


def test_the_package_modules_are_formatted_too():
    """generated/__init__.py is; generated/_interpreter.py is a verbatim copy of
    opgen/run/interpreter.py (its header names that file's hash), not formatted."""
    text = (ROOT / "generated" / "__init__.py").read_text(encoding="utf-8")
    assert black.format_str(text, mode=MODE) == text


def test_kernel_modules_are_the_template_output_formatted_and_keep_its_identity():
    spec = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
    for k in kernels.render_kernels(ROOT, spec, ("cuda",))[:4]:
        assert k.text == format_source(k.source)
        assert k.hash == kernel_hash(k.source)
        assert ast.dump(ast.parse(k.text)) == ast.dump(ast.parse(k.source)) or _prose(k.text) == _prose(k.source)


def _prose(text):
    """The module's AST with each string statement's whitespace collapsed (filled docstrings)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.value.value = " ".join(node.value.value.split())
    return ast.dump(tree)


SAMPLE = '''"""A module whose docstring has one line that runs on and on, well past the width this module is formatted to."""
import math


def f(alpha, beta, gamma):
    """One line of docstring that is far too long to fit within the width of a hundred characters."""
    # A comment line that is also far too long to fit within the width of a hundred characters, by far.
    value = math.sqrt(alpha * alpha + beta * beta) + gamma * (alpha - beta)  # a trailing comment
    total = (alpha + beta + gamma + alpha * beta + beta * gamma + gamma * alpha + alpha * beta * gamma,
             -alpha, [beta, -gamma][0:1], {"key": alpha}[  "key"], (1, 2,))
    return value, total
'''


def test_code_comments_and_docstrings_fit_and_no_statement_changes():
    out = format_source(SAMPLE)
    assert max(len(line) for line in out.split("\n")) <= WIDTH
    assert _prose(out) == _prose(SAMPLE)
    assert format_source(out) == out and black.format_str(out, mode=MODE) == out
    assert "(1, 2)" in out  # a template's trailing comma keeps no bracket split


def test_the_cache_gives_what_black_gives(tmp_path, monkeypatch):
    monkeypatch.setenv("OPGEN_FORMAT_CACHE", str(tmp_path))
    source = "x = [1,\n 2]\n"
    first = format_source.__wrapped__(source)
    assert first == "x = [1, 2]\n" and len(list(tmp_path.iterdir())) == 1
    assert format_source.__wrapped__(source) == first
