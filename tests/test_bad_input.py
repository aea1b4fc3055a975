"""Malformed specs, formulas and op calls get an error that names the problem, never a traceback
from deep inside opgen or a generated module, and never a silently wrong value."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from opgen.errors import ExprError, SpecError
from opgen.spec.expr import MAX_BITS, MAX_ITEMS, bounded, bounded_pow, parse, python_helpers
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
GLA = ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml"


def _write(tmp_path: Path, text: str | bytes, stem: str = "chunk_gla_fwd_o_gk") -> Path:
    path = tmp_path / f"{stem}.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _dump(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    text = GLA.read_text()
    first = text.index("\ntunables:")
    doubled = text + text[first:text.index("\nconstraints:")]  # a second tunables: block at the end
    with pytest.raises(SpecError, match=r"duplicate key 'tunables' at line \d+ \(first at line \d+\)"):
        load_spec(_write(tmp_path, doubled), tmp_path)


def test_a_spec_that_is_not_utf8_is_an_error_not_a_decode_traceback(tmp_path):
    text = GLA.read_text().replace("Origin", "Orig\u00efn", 1).encode("latin-1", errors="replace")
    with pytest.raises(SpecError, match="UTF-8 text"):
        load_spec(_write(tmp_path, text), tmp_path)


@pytest.mark.parametrize("change, expected", [
    (lambda d: d.update(op="torch"), "no Python keyword nor one of"),
    (lambda d: d["signature"]["scalars"]["scale"].update(default=float("inf")), "a finite float value"),
    (lambda d: d["checks"][0].update(message="v must match {q_dtype"), "a message str.format can fill"),
    (lambda d: d["checks"][0].update(message="v must match {q_dtype:zz}"), "a message str.format can fill"),
    (lambda d: d["checks"][0].update(message="v must match {nothing}"), "placeholders among the inputs"),
    (lambda d: next(iter(d["cases"].values()))[0].update(T="fifty"), "a int value"),
    (lambda d: next(iter(d["cases"].values()))[0].update(T=[37, 0]), "cases.interpreter.0.T: expected a size in [1, 2**63 - 1]; got 0"),
    (lambda d: next(iter(d["cases"].values()))[0].update(B=2 ** 63), "expected a size in [1, 2**63 - 1]"),
    (lambda d: d["tunables"]["BK"]["domain"].update(cuda=[]), "tunables.BK.domain.cuda: expected at least one value"),
    (lambda d: d["tunables"]["BK"]["domain"].update(cuda=[32, 10 ** 40]),
     "tunables.BK.domain.cuda.1: expected an int in [-2**63, 2**63 - 1]; got 1" + "0" * 40),
    (lambda d: d["tunables"]["BK"]["domain"].update(cuda=[32, float("inf")]), "tunables.BK.domain.cuda.1: expected a finite float"),
    (lambda d: d["tunables"]["BK"]["domain"].update(cuda=[16, "32", 64, True]),
     "tunables.BK.domain.cuda: expected values of one kind (bool, int, float or str); got \"[16, '32', 64, True] (bool, int, str)\""),
    (lambda d: d["tunables"]["BK"]["domain"].update(npu=[32, 64, 32]), "tunables.BK.domain.npu: expected each value once"),
])
def test_values_the_generated_code_could_not_use_are_refused(tmp_path, change, expected):
    data = yaml.safe_load(GLA.read_text())
    change(data)
    stem = data["op"]
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, _dump(data), stem), tmp_path)
    assert expected in str(info.value)


def test_an_integer_too_long_to_read_names_its_line(tmp_path):
    text = GLA.read_text().replace("T: [37, 64, 100]", "T: [37, 64, " + "9" * 5000 + "]", 1)
    line = text[:text.index("9" * 5000)].count("\n") + 1
    with pytest.raises(SpecError, match=f"an integer of 5000 characters at line {line}, too long to read"):
        load_spec(_write(tmp_path, text), tmp_path)


@pytest.mark.parametrize("source, expected", [
    ("-" * 5000 + "1", "characters"),
    ("+".join(["1"] * 50000), "characters"),
    ("abs(" * 80 + "N" + ")" * 80, "nested more than 64 levels"),
    ("-" * 100 + "N", "nested more than 64 levels"),
])
def test_formulas_too_long_or_deep_are_refused_at_parse(source, expected):
    with pytest.raises(ExprError, match=expected):
        parse(source)


# Each kind of formula that would build without bound: what it builds, the error saying so.
GROWTH = [
    ("N ** 9 ** 9", "exponent 387420489 exceeds 64"),
    ("((((((2**64)**64)**64)**64)**64)**64)", "an integer of 4097 bits (at most 4096)"),
    ("(N ** 64) ** 64", "an integer of more than 81600 bits"),
    ("BIG * BIG", "an integer of at least 6001 bits"),
    ("BIG ** 2", "an integer of more than 6000 bits"),
    ("'x' * 10 ** 15", "repeated more than 4096 times"),
    ("(1, 2) * N", "repeated more than 4096 times"),
    ("('x' * 4096) * 4096 * 4096", "a string of 16777216 characters (at most 4096)"),
    ("(('x' * 64,) * 64,) * 64", "a tuple of more than 4096 items (nested ones counted)"),
    ("('x' * 4000) + ('y' * 4000)", "a string of more than 4096 characters"),
    ("(0,) * 3000 + (1,) * 3000", "a tuple of more than 4096 items"),
    ("'%0999999999999d' % 1", "% formatting of a string is not allowed"),
    ("('%' + '0999999999999d') % N", "% formatting of a string is not allowed"),
]


@pytest.mark.parametrize("source, expected", GROWTH)
def test_formulas_that_would_hang_or_fill_memory_fail_fast(source, expected):
    with pytest.raises(ExprError, match=re.escape(expected)) as info:
        parse(source).evaluate({"N": 10 ** 6, "BIG": 2 ** 3000})
    assert repr(source) in str(info.value)  # the formula is named


@pytest.mark.parametrize("source, expected", GROWTH)
def test_generated_code_bounds_what_opgen_bounds(source, expected):
    expr = parse(source)
    helpers: dict = {}
    exec(python_helpers(expr.python_calls()), helpers)  # noqa: S102 - the rendered helpers
    with pytest.raises(ValueError, match=re.escape(expected)):
        eval(expr.to_python(), helpers, {"N": 10 ** 6, "BIG": 2 ** 3000})  # noqa: S307


@pytest.mark.parametrize("source", ["1 << N", "N >> 1", "f'{N:>999999999}'", "'{:>999999999}'.format(N)", "N @ N"])
def test_operators_that_build_without_bound_are_not_in_the_language(source):
    with pytest.raises(ExprError, match="not allowed"):
        parse(source)


def test_the_limits_hold_at_their_edge():
    assert bounded(2 ** MAX_BITS - 1) and bounded("x" * MAX_ITEMS) and bounded((("ab",),) * 1000)
    assert parse("2 ** 64 * 2 ** 63 * N").evaluate({"N": 3}) == 3 * 2 ** 127
    assert parse("(2 ** 63) ** 64 * 8 - 1").evaluate({}) == 2 ** 4035 - 1
    for source in ("2 ** 64 * 2 ** 64 * (2 ** 63) ** 64", "(2 ** 63) ** 64 * 2 ** 64"):
        with pytest.raises(ExprError, match="bits"):
            parse(source).evaluate({})


def test_generated_code_calls_the_helpers_only_where_an_operand_may_be_a_sequence():
    expr = parse("B * H * NT + (8 if K % 8 == 0 else 1) + dtype * 2 + 2 ** K")
    numbers = {"B", "H", "NT", "K"}
    assert expr.to_python(numbers) == ("bounded_add(bounded_add(B * H * NT + (8 if K % 8 == 0 else 1), "
                                       "bounded_mul(dtype, 2)), bounded_pow(2, K))")
    assert expr.python_calls(numbers) == {"bounded", "bounded_add", "bounded_mul", "bounded_pow"}
    assert parse("B * H * NT + K % 8").to_python(numbers) == "B * H * NT + K % 8"
    assert parse("max(B, K) * min(T) + abs(H) * cdiv(B, H)").to_python(numbers) == \
        "bounded_add(bounded_mul(max(B, K), min(T)), abs(H) * cdiv(B, H))"  # min(T) is an item of T


def test_generated_formulas_bound_exponents_as_opgen_does():
    expr = parse("N ** 9 ** 9 + 2 ** N")
    assert expr.to_python() == "bounded_pow(N, bounded_pow(9, 9)) + bounded_pow(2, N)"
    assert expr.python_calls() == {"bounded", "bounded_pow"} and expr.calls == ()
    assert bounded_pow(2, 10) == 1024
    with pytest.raises(ValueError, match="exceeds 64"):
        bounded_pow(3, 65)


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_mamba3_with_no_key_groups_names_the_size(interpret):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd
    from opgen.references.mamba3_mimo_bwd_fwd import make_inputs

    x = make_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, seed=1)
    x["q"], x["k"] = x["q"][:, :, :, :0], x["k"][:, :, :, :0]  # G = 0
    with pytest.raises(ValueError, match="every dimension must be positive, got .* G=0"):
        mamba3_mimo_bwd_fwd(**x)


@pytest.mark.parametrize("scale, shown", [(10 ** 400, "an int of 401 digits"), (1e39, "1e+39"),
                                          (float("nan"), "nan"), (-3.5e38, "-3.5e+38")])
def test_gla_scale_must_fit_float32(interpret, scale, shown):
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk

    q = torch.zeros(1, 64, 1, 32, dtype=torch.float16)
    g, A, h = torch.zeros(1, 64, 1, 32), torch.zeros(1, 64, 1, 64), torch.zeros(1, 1, 1, 32, 32)
    with pytest.raises(ValueError, match=r"scale must be a finite float32 value .* got " + re.escape(shown)):
        chunk_gla_fwd_o_gk(q, q.clone(), g, A, h, scale=scale, chunk_size=64)
    assert os.environ["TRITON_INTERPRET"] == "1"


# --- the build and the command line, on the toy project -------------------------------------------
TOY = Path(__file__).resolve().parent / "toy_project"


def _toy(tmp_path: Path) -> Path:
    shutil.copytree(TOY, tmp_path / "toy")
    return tmp_path / "toy"


def _opgen(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(root), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def _edit(root: Path, old: str, new: str) -> None:
    spec = root / "specs" / "toy_op.yaml"
    text = spec.read_text()
    assert old in text
    spec.write_text(text.replace(old, new))


def test_check_and_build_see_links_caches_modes_and_folders(tmp_path):
    root = _toy(tmp_path)
    assert _opgen(root, "build").returncode == 0
    gen = root / "generated" / "toy_op"
    module = gen / "kernels" / "cuda" / "good.py"
    (gen / "stray_link.py").symlink_to(module)  # a link is never generated
    (gen / "__pycache__").mkdir(exist_ok=True)
    (gen / "__pycache__" / "planted.py").write_text("x = 1\n")
    module.chmod(0o755)
    (gen / "kernels" / "empty").mkdir()
    table = gen / "table_interpreter.py"
    table.unlink()
    table.mkdir()  # a folder where a generated file belongs
    check = _opgen(root, "build", "--check")
    assert check.returncode == 1
    for path in ("stray_link.py", "__pycache__/planted.py", "kernels/cuda/good.py", "table_interpreter.py"):
        assert f"generated/toy_op/{path}" in check.stderr, path
    assert _opgen(root, "build").returncode == 0
    assert _opgen(root, "build", "--check").returncode == 0
    assert not (gen / "stray_link.py").exists() and not (gen / "kernels" / "empty").exists()
    assert table.is_file() and not module.stat().st_mode & 0o111


@pytest.mark.parametrize("old, new, expected", [
    ('  - "BLOCK <= max(16, pow2(N))"\n', '  - "BLOCK <= max(16, pow2(N))"\nchecks:\n'
     '  - {rule: "N // 0 == 0", error: ValueError, message: "never"}\n', "checks.0 cannot be evaluated"),
    ('ub_bytes: "BLOCK * 4 * (2 if multibuffer else 1)"', 'ub_bytes: "BLOCK > 4"', "a byte count"),
    ('ub_bytes: "BLOCK * 4 * (2 if multibuffer else 1)"', "ub_bytes: \"'a lot'\"", "a byte count"),
    ("N: {expr: N, buckets", 'N: {expr: "cdiv(N, 0)", buckets', "dispatch.key.N cannot be evaluated"),
    ("golden: toy_reference:golden", "golden: toy_reference:nosuch",
     "reference.golden: expected a name"),
    ("golden: toy_reference:golden", "golden: no_such_module:golden",
     "reference.golden: expected a module:name path whose module exists"),
    ("inputs: toy_reference:make_inputs", "inputs: toy_reference.deeper:make_inputs",
     "reference.inputs: expected a module:name path whose module exists"),
])
def test_the_build_refuses_what_would_fail_later(tmp_path, old, new, expected):
    root = _toy(tmp_path)
    _edit(root, old, new)
    result = _opgen(root, "build")
    assert result.returncode != 0 and expected in result.stderr and "Traceback" not in result.stderr
    assert not (root / "generated").exists()  # refused before anything is written


NESTED = "((((((2**64)**64)**64)**64)**64)**64)"
KEY = "N: {expr: N, buckets"
CONSTRAINT = '  - "BLOCK <= max(16, pow2(N))"\n'
BUDGET = '"BLOCK * 4 * (2 if multibuffer else 1)"'


# Every kind of formula of the toy spec, made to fail on its case: the build names the case, the key
# path and the formula.
@pytest.mark.parametrize("old, new, expected", [
    (KEY, 'N: {expr: "cdiv(N, 0)", buckets',
     "dispatch.key.N cannot be evaluated: formula 'cdiv(N, 0)': ZeroDivisionError"),
    (KEY, f'N: {{expr: "N + {NESTED}", buckets', "dispatch.key.N cannot be evaluated: formula 'N + ((((((2**64)"),
    (KEY, "N: {expr: \"'big'\", buckets", "dispatch.key.N gives 'big', not a finite number to bucket"),
    (KEY, 'N: "(N, N)"\n    M: {expr: N, buckets', "dispatch.key.N gives (50, 50), not a string, boolean or finite"),
    (CONSTRAINT, '  - "BLOCK <= N // (N - 50)"\n', "constraints.0 cannot be evaluated with good at the "),
    (CONSTRAINT, f'  - "BLOCK <= {NESTED}"\n', "constraints.0 cannot be evaluated with good"),
    (BUDGET, '"BLOCK * 4 // (0 if MODE == \'wrong\' else 1)"', "budgets.npu.ub_bytes cannot be evaluated with wrong at"),
    (BUDGET, f'"BLOCK * 4 + {NESTED}"', "the ascend910b1 default fails: formula 'BLOCK * 4 + ((((((2**64)"),
    ('BLOCK: "16"}', f'BLOCK: "16 + {NESTED}"}}', "default fails: formula '16 + ((((((2**64)"),
    (CONSTRAINT, f'{CONSTRAINT}params:\n  NB: "N * {NESTED}"\n', "its params do not evaluate: formula 'N * (((((("),
    ('hang: {doc: "never returns"}', 'hang: {doc: "never returns", when: "N // 0 > 1"}',
     "variants.axes.MODE.hang.when cannot be evaluated: formula 'N // 0 > 1'"),
    ('crash: {doc: "kills its process"}', 'crash: {doc: "x", fixed: {BLOCK: "N // (N - 50)"}}',
     "variants.axes.MODE.crash.fixed.BLOCK cannot be evaluated"),
    ("when: bias_given", "when: \"bias_given + 'x'\"", "signature.outputs.y_plus.when cannot be evaluated"),
])
def test_the_build_evaluates_every_formula_on_every_case(tmp_path, old, new, expected):
    from opgen.space.case_checks import check_cases
    from opgen.errors import BuildError

    root = _toy(tmp_path)
    _edit(root, old, new)
    with pytest.raises(BuildError) as info:
        check_cases(load_spec(root / "specs" / "toy_op.yaml", root))
    assert "specs/toy_op.yaml: case smoke[0] {'N': 50, 'dtype': 'float32'}: " in str(info.value)
    assert expected in str(info.value)


@pytest.mark.parametrize("body, expected", [
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion too deep"),
    ("{% for i in range(10 ** 9) %}{% endfor %}", "range(1000000000,) of 1000000000 items (at most 100000)"),
    ("{% for i in range(0, 10 ** 12, 2) %}{% endfor %}", "of 500000000000 items (at most 100000)"),
    ("{{ ('x' * 4096) * 4096 * 4096 }}", "str * int past 1000000"),
    ("{{ [0] * 10 ** 9 }}", "list * int past 1000000"),
    ("{{ 2 ** 64 ** 64 ** 64 ** 64 }}", "an int of 262145 bits ** 64: past 1000000 bits"),  # left to right
    ("{{ 3 ** (10 ** 7) }}", "an int of 2 bits ** 10000000: past 1000000 bits"),
    ("{{ '%0999999999999d' % 1 }}", "a format width past 1000000"),
    ("{{ '{:0999999999d}'.format(1) }}", "a format width past 1000000"),
    ("{{ 'x'.center(10 ** 10) }}", "str.center past 1000000 characters"),
    ("{{ 'x' | center(10 ** 10) }}", "center(10000000000) past 1000000 characters"),
    ("{{ ''.__class__ }}", "unsafe"),
    ("{{ 'a' | indent(10 ** 10) }}", "indent(10000000000) past 1000000 characters"),
    ("{{ '%*d' | format(10 ** 9, 1) }}", "format(1000000000, 1) past 1000000"),
    ("{{ '%0999999999d' | format(1) }}", "a format width past 1000000"),
    ("{{ '%*d' % (10 ** 9, 1) }}", "a '*' format width past 1000000"),
    ("{{ '{:>{}}'.format(1, 10 ** 10) }}", "a format width past 1000000 in '{:>{}}'"),
    ("{{ ('a' * 1000) | replace('a', 'a' * 1000) }}", "replace of 1000 characters past 1000000"),
    ("{{ ('a' * 1000).replace('a', 'a' * 1000) }}", "replace of 1000 characters past 1000000"),
    ("{{ [1] | batch(10 ** 10) | list }}", "batch(10000000000) past 1000000"),
    ("{{ [1, 2] | slice(10 ** 9) | list }}", "slice(1000000000) past 1000000"),
    ("{{ 'a b' | wordwrap(10 ** 10) }}", "wordwrap(10000000000) past 1000000"),
    ("{{ 'x' | truncate(10 ** 10) }}", "truncate(10000000000) past 1000000"),
    ("{{ [1] * [2] }}", "TypeError: can't multiply sequence"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ 'x' * 3.5 }}", "TypeError"),
])
def test_a_template_that_would_recurse_or_loop_without_end_is_named(tmp_path, body, expected):
    from opgen.errors import RenderError
    from opgen.render.render import environment, render

    (tmp_path / "t.py.j2").write_text(f"x = 1  # {body}\n")
    with pytest.raises(RenderError) as info:
        render(environment([tmp_path]), "t.py.j2", {})
    assert "template t.py.j2: " in str(info.value) and expected in str(info.value)
    (tmp_path / "t.py.j2").write_text("x = {{ range(2, 8, 3) | list | length }}\n")
    assert render(environment([tmp_path]), "t.py.j2", {}) == "x = 2\n"


def test_a_template_without_launch_or_not_utf8_is_named(tmp_path):
    root = _toy(tmp_path)
    template = root / "templates" / "toy_op" / "kernel.py.j2"
    text = template.read_text()
    template.write_text(text.replace("def launch(", "def start("))
    result = _opgen(root, "build")
    assert result.returncode != 0 and "without a top-level launch()" in result.stderr
    template.write_bytes(text.replace("y = 2 x", "y = 2 \u00d7 x").encode("latin-1") + b"\n# \xff\n")
    result = _opgen(root, "build")
    assert result.returncode != 0 and "is not UTF-8 text" in result.stderr and "Traceback" not in result.stderr


def test_the_command_line_takes_ops_by_name_and_records_as_files(tmp_path):
    root = _toy(tmp_path)
    outside = tmp_path / "outside" / "specs"
    outside.mkdir(parents=True)
    shutil.copy(root / "specs" / "toy_op.yaml", outside / "op.yaml")
    result = _opgen(root, "tune", "../outside/specs/op", "--chip", "interpreter", "--cases", "smoke")
    assert result.returncode != 0 and "is not an op of" in result.stderr and "toy_op" in result.stderr
    (root / "records").mkdir(exist_ok=True)
    result = _opgen(root, "records", "toy_op", "--chip", "interpreter", "--records", str(root / "records"))
    assert result.returncode != 0 and "is a folder" in result.stderr


def test_a_records_line_with_a_key_twice_is_refused_naming_the_line(tmp_path):
    from opgen.errors import RecordError
    from opgen.storage.records import read

    lines = (ROOT / "records" / "h200" / "chunk_gla_fwd_o_gk.jsonl").read_text().splitlines()[:2]
    doubled = lines[1].replace('{', '{"median_ms":-1.0,', 1)  # JSON would keep the later value silently
    path = tmp_path / "chunk_gla_fwd_o_gk.jsonl"
    path.write_text(lines[0] + "\n" + doubled + "\n")
    with pytest.raises(RecordError, match=r"chunk_gla_fwd_o_gk.jsonl:2: key '\w+' given twice"):
        read(path, op="chunk_gla_fwd_o_gk", chip="h200")
    path.write_text(lines[0] + "\n" + lines[1] + "\n")
    assert len(read(path, op="chunk_gla_fwd_o_gk", chip="h200").records) == 2


def test_a_constraint_that_would_hang_the_dry_run_is_named(tmp_path):
    root = _toy(tmp_path)
    _edit(root, '"BLOCK <= max(16, pow2(N))"', '"BLOCK <= max(16, pow2(N)) + ((((((2**64)**64)**64)**64)**64)**64)"')
    result = _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "smoke", "--dry-run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "formula 'BLOCK <= max(16, pow2(N)) + ((((((2**64)**64)**64)**64)**64)**64)'" in result.stderr
    assert "an integer of 4097 bits (at most 4096)" in result.stderr


# --- command line settings: refused before any work, a dry run included ----------------------------
def _main(capsys, *args: str) -> tuple[int, str]:
    """``opgen --root <toy> args`` in this process: its exit status and what it printed on stderr."""
    from opgen.cli.main import main

    try:
        code = main(["--root", str(TOY), *args])
    except SystemExit as exc:  # argparse refuses an option with status 2
        code = exc.code
    return code, capsys.readouterr().err


TUNE = ("tune", "toy_op", "--chip", "interpreter", "--cases", "smoke", "--dry-run")
REPORT = ("report", "toy_op", "--chip", "interpreter")
REPLAY = ("replay", "toy_op", "--chip", "interpreter", "--variant", "good", "--records", str(GLA))


@pytest.mark.parametrize("args, expected", [
    ((*TUNE, "--point-timeout", "0"), "argument --point-timeout: expected a finite number > 0, got '0'"),
    ((*TUNE, "--point-timeout", "-1"), "argument --point-timeout: expected a finite number > 0, got '-1'"),
    ((*TUNE, "--point-timeout", "inf"), "argument --point-timeout: expected a finite number > 0, got 'inf'"),
    ((*TUNE, "--trials", "-5"), "argument --trials: expected an integer >= 0, got '-5'"),
    ((*TUNE, "--repeat", "0"), "argument --repeat: expected an integer >= 1, got '0'"),
    ((*TUNE, "--warmup", "-1"), "argument --warmup: expected an integer >= 0, got '-1'"),
    ((*TUNE, "--storage", "/tmp"), "argument --storage: /tmp is a folder, not a file"),
    ((*TUNE, "--storage", "sqlite:////etc/passwd/x.db"), "argument --storage: /etc/passwd/x.db: not a directory"),
    ((*TUNE, "--devices", ""), "argument --devices: expected comma-separated device names"),
    ((*TUNE, "--devices", "cuda:0,,cuda:1"), "argument --devices: expected comma-separated device names"),
    ((*TUNE, "--devices", "cuda:0, cuda:0"), "argument --devices: cuda:0 given twice in 'cuda:0, cuda:0'"),
    ((*TUNE, "--variants", ""), "argument --variants: expected comma-separated names, none empty, got ''"),
    ((*TUNE, "--variants", "good,,wrong"), "argument --variants: expected comma-separated names, none empty"),
    ((*TUNE, "--variants", "good, good"), "argument --variants: good given twice in 'good, good'"),
    (("resources", "toy_op", "--chip", "h200", "--check-budget", "--variants", ","),
     "argument --variants: expected comma-separated names, none empty, got ','"),
    ((*TUNE, "--compile-workers", "-1"), "argument --compile-workers: expected an integer >= 0, got '-1'"),
    ((*TUNE, "--study-seconds", "-1"), "argument --study-seconds: expected a finite number >= 0, got '-1'"),
    ((*TUNE, "--campaign-seconds", "nan"), "argument --campaign-seconds: expected a finite number >= 0, got 'nan'"),
    ((*TUNE, "--drop-below", "1.5"), "argument --drop-below: expected a number in [0, 1], got '1.5'"),
    ((*TUNE, "--heartbeat", "0"), "argument --heartbeat: expected an integer >= 1, got '0'"),
    ((*TUNE, "--date", "2024-13-01"), "argument --date: expected a date YYYY-MM-DD, got '2024-13-01'"),
    (("cases", "toy_op", "--sample", "100000000"),
     "argument --sample: expected an integer in [1, 10000] (cases one draw may check), got '100000000'"),
    (("cases", "toy_op", "--holdout", "nan"), "argument --holdout: expected a number in [0, 1), got 'nan'"),
    (("cases", "toy_op", "--measure", "1"), "argument --measure: expected a number in [0, 1), got '1'"),
    ((*REPLAY, "--fraction", "0"), "argument --fraction: expected a number in (0, 1], got '0'"),
    ((*REPLAY, "--fraction", "-1"), "argument --fraction: expected a number in (0, 1], got '-1'"),
    ((*REPLAY, "--within", "-0.5"), "argument --within: expected a finite number >= 0, got '-0.5'"),
    ((*REPLAY, "--seeds", "0"), "argument --seeds: expected an integer >= 1, got '0'"),
    (("bench", "toy_op", "--baseline", "x", "--rounds", "0"), "argument --rounds: expected an integer >= 1, got '0'"),
])
def test_settings_are_refused_naming_the_option(capsys, args, expected):
    code, err = _main(capsys, *args)
    assert code == 2 and expected in err and "Traceback" not in err


@pytest.fixture
def odd_paths(tmp_path):
    """A FIFO, a loop of links, a link to nothing, a file and a folder."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x\n")
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.mark.parametrize("args, expected", [
    ((*TUNE, "--records", "{dir}/folder"), "argument --records: {dir}/folder is a folder, not a file"),
    ((*TUNE, "--records", "{dir}/fifo"), "argument --records: {dir}/fifo is a FIFO, not a file"),
    ((*TUNE, "--records", "/dev/zero"), "argument --records: /dev/zero is a character device, not a file"),
    ((*TUNE, "--records", "{dir}/loop_a"), "argument --records: {dir}/loop_a: too many levels of symbolic links"),
    ((*TUNE, "--records", "{dir}/dangling"), "argument --records: {dir}/dangling is a link to nothing"),
    ((*TUNE, "--storage", "{dir}/fifo"), "argument --storage: {dir}/fifo is a FIFO, not a file"),
    (("records", "toy_op", "--chip", "interpreter", "--records", "/nonexistent.jsonl"),
     "--records: no such file: /nonexistent.jsonl"),
    (("records", "toy_op", "--chip", "interpreter", "--records", "{dir}/loop_a"), "too many levels of symbolic links"),
    (("cases", "toy_op", "--out", "{dir}/folder"), "argument --out: {dir}/folder is a folder, not a file"),
    (("cases", "toy_op", "--out", "{dir}/file/cases.yaml"), "argument --out: {dir}/file/cases.yaml: not a directory"),
    (("schema", "--out", "{dir}/folder"), "argument --out: {dir}/folder is a folder, not a file"),
    (("schema", "--out", "{dir}/fifo"), "argument --out: {dir}/fifo is a FIFO, not a file"),
    (("report", "toy_op", "--chip", "interpreter", "--out", "{dir}/file"), "argument --out: {dir}/file is a file, not a folder"),
    (("report", "toy_op", "--chip", "interpreter", "--storage", "{dir}/folder"),
     "argument --storage: {dir}/folder is a folder, not a file"),
    ((*REPLAY[:-2], "--records", "{dir}/nothing.jsonl"), "argument --records: no such file: {dir}/nothing.jsonl"),
    ((*REPORT, "--storage", "sqlite:///{dir}/nothing.db"), "argument --storage: no such file: {dir}/nothing.db"),
    ((*REPORT, "--storage", "sqlite://"), "argument --storage: expected an SQLite URL naming a database file"),
    (("records", "toy_op", "--chip", "interpreter", "--pull", "{dir}/file"), "argument --pull: expected a database URL"),
    (("bench", "toy_op", "--baseline", "x", "--merge", "{dir}/dangling"), "argument --merge: {dir}/dangling is a link"),
    (("bench", "toy_op", "--baseline", "x", "--json", "{dir}/folder"), "argument --json: {dir}/folder is a folder"),
])
def test_paths_are_checked_for_their_kind_before_they_are_opened(capsys, odd_paths, args, expected):
    code, err = _main(capsys, *(a.format(dir=odd_paths) for a in args))
    assert code == 2 and expected.format(dir=odd_paths) in err and "Traceback" not in err


def test_a_file_that_cannot_be_written_is_named_not_a_traceback(capsys):
    code, err = _main(capsys, "schema", "--out", "/proc/opgen-schema.json")  # /proc takes no new file, root or not
    assert code == 2 and "/proc/opgen-schema.json" in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["loop", "fifo", "folder"])
def test_a_records_file_that_is_no_file_is_refused_not_read_as_empty(tmp_path, kind):
    from opgen.errors import RecordError
    from opgen.storage.records import read

    path = tmp_path / "toy_op.jsonl"
    if kind == "loop":
        path.symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(RecordError, match="toy_op.jsonl"):
        read(path, op="toy_op", chip="interpreter")


URL = "postgresql://user:PASSWORD@127.0.0.1:1/db"


AT = URL.replace("PASSWORD", "PASS@WORD")  # a raw '@' in the password: the driver would print 'WORD@127.0.0.1'
QUERY = "postgresql://127.0.0.1:1/db?sslmode=disable&password=PASSWORD"


@pytest.mark.parametrize("args, shown", [
    ((*REPORT, "--storage", URL), "user:***@127.0.0.1"),  # opgen's own error
    ((*REPORT, URL), "user:***@127.0.0.1"),  # argparse's: unrecognized arguments
    (("records", "toy_op", "--chip", "interpreter", "--pull", URL.replace("postgresql", "mysql")), "user:***@127.0.0.1"),
    ((*REPORT, "--storage", QUERY), "password=***"),
    ((*REPORT, "--storage", AT), "argument --storage: postgresql://user:***@127.0.0.1:1/db: more than one '@'"),
    ((*TUNE, "--storage", AT), "argument --storage: postgresql://user:***@127.0.0.1:1/db: more than one '@'"),
    (("records", "toy_op", "--chip", "interpreter", "--pull", AT), "argument --pull: postgresql://user:***@127.0.0.1"),
])
def test_passwords_are_masked_in_every_message(capsys, args, shown):
    code, err = _main(capsys, *args)
    assert code == 2 and shown in err and "PASS" not in err and "WORD" not in err


@pytest.mark.parametrize("text", [URL, AT, QUERY, f"(got '{URL}')", f"{QUERY}&x=1 and {URL}"])
def test_masked_leaves_no_part_of_a_password(text):
    from opgen.options import masked

    assert "PASS" not in masked(text) and "WORD" not in masked(text) and "127.0.0.1" in masked(text)


# --- opgen explain and opgen bench: the calls the op refuses, the devices the host lacks --------
EXPLAIN = ("explain", "chunk_gla_fwd_o_gk", "--chip", "h200", "B=2", "H=4", "K=128", "V=128")


@pytest.mark.parametrize("words, code, expected", [
    (("T=1024", "chunk_size=48"), 1, "refused by the op's checks: ValueError: chunk_size must be one of 32, 64, got 48"),
    (("T=1024", "scale=nan"), 1, "ValueError: scale must be a finite float32 value (the kernels take it in float32), got nan"),
    (("T=1024", "scale=1e39"), 1, "scale must be a finite float32 value (the kernels take it in float32), got 1e+39"),
    (("T=1024", "dtype=int32"), 2, "dtype=int32: a call of chunk_gla_fwd_o_gk has a dtype among bfloat16, float16"),
    (("T=1024", "dtype=float32"), 2, "dtype=float32: a call of chunk_gla_fwd_o_gk has a dtype among bfloat16, float16"),
    (("T=" + "9" * 400,), 2, "T=an int of 400 digits: a tensor's size is an int in [0, 2**63 - 1]"),
    (("T=-1",), 2, "T=-1: a tensor's size is an int in [0, 2**63 - 1]"),
    (("T=1024", "B=3"), 2, "B given twice (B=2 and B=3)"),
    (("T=1024", "use_exp2=maybe"), 2, "use_exp2=maybe: expected a bool"),
])
def test_explain_refuses_the_calls_the_op_refuses(capsys, words, code, expected):
    from opgen.cli.main import main

    status = main(["--root", str(ROOT), *EXPLAIN, *words])
    out, err = capsys.readouterr()
    assert status == code and expected in (out if code == 1 else err) and "Traceback" not in err


@pytest.mark.parametrize("args, expected", [
    (("--backend", "cuda"), "no cuda device cuda:0 on this host (0 found"),
    (("--backend", "cuda", "--device", "cuda:7"), "no cuda device cuda:7 on this host"),
    (("--backend", "cuda", "--device", "gpu7"), "device 'gpu7' is not a torch device name"),
    (("--backend", "cuda", "--device", "cpu"), "device 'cpu' is not a cuda device"),
    (("--backend", "npu",), "backend npu needs torch_npu"),
])
def test_bench_on_a_device_this_host_lacks_says_so(capsys, args, expected):
    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("this host has a device: the refusals are for one without")
    from opgen.cli.main import main

    code = main(["--root", str(ROOT), "bench", "chunk_gla_fwd_o_gk", "--baseline", "fla", "--cases", "bench", *args])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err
