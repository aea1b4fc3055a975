"""Wrapping of generated modules within 100 characters (opgen.render.wrap.wrap_source): no statement
changes, every line fits, kernel identities stay the template's output."""
import ast
from pathlib import Path

from opgen.render import kernels
from opgen.storage.records import kernel_hash
from opgen.spec.spec import load_spec
from opgen.render.wrap import wrap_line, wrap_source

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = '''"""A module whose docstring has one line that runs on and on, well past the width this module is wrapped to."""
import math


def f(alpha, beta, gamma):
    """One line of docstring that is far too long to fit within the width of a hundred characters."""
    # A comment line that is also far too long to fit within the width of a hundred characters, by far.
    value = math.sqrt(alpha * alpha + beta * beta) + gamma * (alpha - beta)  # a trailing comment too
    total = (alpha + beta + gamma + alpha * beta + beta * gamma + gamma * alpha + alpha * beta * gamma,
             -alpha, [beta, -gamma][0:1], {"key": alpha}[  "key"])
    return value, total
'''


def _code(text):
    """The module's AST with docstrings blanked (wrapping may refill them)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            body[0].value.value = ""
    return ast.dump(tree)


def test_wrap_source_fits_every_line_and_changes_no_statement():
    out = wrap_source(SAMPLE)
    assert max(len(line) for line in out.split("\n")) <= 100
    assert _code(out) == _code(SAMPLE)
    assert "# a trailing comment too" in out  # moved above its statement, not dropped
    ns_in, ns_out = {}, {}
    exec(compile(SAMPLE, "in", "exec"), ns_in)
    exec(compile(out, "out", "exec"), ns_out)
    assert ns_in["f"](3.0, 4.0, 5.0) == ns_out["f"](3.0, 4.0, 5.0)


def test_wrap_source_writes_signs_and_slices_as_a_formatter_does():
    line = ("    x = some_function_name(-alpha, beta[None, :], gamma[:, None] * -delta, epsilon=-1.0) "
            "+ another_function(zeta)")
    out = wrap_source(line)
    assert "(-alpha" in out and "[None, :]" in out and "* -delta" in out and "epsilon=-1.0" in out
    assert max(len(x) for x in out.split("\n")) <= 100


def test_kernel_modules_fit_100_columns_and_keep_the_template_output_as_identity():
    spec = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
    for k in kernels.render_kernels(ROOT, spec, ("cuda",))[:6]:
        assert k.text == wrap_source(k.source)
        assert k.hash == kernel_hash(k.source)
        assert max(len(line) for line in k.text.split("\n")) <= 100, k.path
        assert _code(k.text) == _code(k.source), k.path


def test_a_line_whose_brackets_do_not_balance_is_left_as_it_is():
    """A continuation line of a longer statement wraps the same on every Python version (3.12
    tokenizes its closing bracket alone, 3.11 does not)."""
    line = "        HAS_Z=has_z, HAS_D=d is not None, MIN_DOT=_min_dot(), DOT_PRECISION=point.get(\"P\", \"ieee\")),"
    assert wrap_line(line, 60) == [line]
    opened = "    calls.append((kernel, grid, dict(dout=dout, v=v, mimo_v=mimo_v, mimo_o=mimo_o, z=z,"
    assert wrap_line(opened, 60) == [opened]


def test_an_f_string_is_one_token_on_every_python_version():
    line = '    raise ValueError(f"q must have {n} dims (B, T, H, K), got {tuple(q.shape)} for the case {case!r} here")'
    wrapped = wrap_line(line, 60)
    assert len(wrapped) > 1 and all(len(x) <= 60 for x in wrapped)
    # the f-string is split only outside its braces, into adjacent f-string literals
    assert all(x.count("{") == x.count("}") for x in wrapped)
    compile("\n".join(w.strip() for w in wrapped).replace("\n", " "), "<wrapped>", "exec")
