"""More malformed inputs, each refused by name: command line settings checked before any work,
passwords masked in paths, spec values and conditions the build would have taken, records a parser
cannot read, template filters that would build without bound."""
from pathlib import Path

import pytest
import yaml

from opgen.errors import RecordError, RenderError, SpecError
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).resolve().parent / "toy_project"
GLA = ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml"
URL = "postgresql://user:PASSWORD@127.0.0.1:1/db"


def _template(body: str) -> Path:
    import tempfile

    folder = Path(tempfile.mkdtemp())
    (folder / "t.py.j2").write_text(body)
    return folder


def _main(capsys, *args: str, root: Path = TOY) -> tuple[int, str]:
    """``opgen --root <root> args`` in this process: its exit status and what it printed on stderr."""
    from opgen.cli.main import main

    try:
        code = main(["--root", str(root), *args])
    except SystemExit as exc:  # argparse refuses an option with status 2
        code = exc.code
    return code, capsys.readouterr().err


TUNE = ("tune", "toy_op", "--chip", "interpreter", "--cases", "smoke", "--dry-run")
RESOURCES = ("resources", "chunk_gla_fwd_o_gk", "--chip", "h200")


@pytest.mark.parametrize("args, expected", [
    ((*RESOURCES, "--jobs", "0"), "argument --jobs: expected an integer >= 1, got '0'"),
    ((*RESOURCES, "--jobs", "-3"), "argument --jobs: expected an integer >= 1, got '-3'"),
    ((*RESOURCES, "--compile-timeout", "-1"), "argument --compile-timeout: expected a finite number >= 0, got '-1'"),
    ((*RESOURCES, "--compile-timeout", "nan"), "argument --compile-timeout: expected a finite number >= 0, got 'nan'"),
    ((*RESOURCES, "--check-budget", "--sample", "0"), "argument --sample: expected an integer >= 1, got '0'"),
    ((*RESOURCES, "--spill-free", "-1"), "argument --spill-free: expected an integer >= 1, got '-1'"),
    ((*RESOURCES, "--cache", "/dev/null"), "argument --cache: /dev/null is a character device, not a folder"),
    ((*RESOURCES, "--python", "/nonexistent/python"), "argument --python: no such file: /nonexistent/python"),
    ((*RESOURCES, "--check-budget", "--variants", "zz"), "chunk_gla_fwd_o_gk has no variant zz on h200"),
    (("explain", "chunk_gla_fwd_o_gk", "--chip", "h200", "--compile", "--python", "/nonexistent", "B=1"),
     "argument --python: no such file: /nonexistent"),
    ((*TUNE, "--device", "bogus!"), "argument --device: expected a device name (cuda:0, npu:1, cpu), got 'bogus!'"),
    ((*TUNE, "--device", "cuda:-1"), "argument --device: expected a device name"),
    (("tune", "chunk_gla_fwd_o_gk", "--chip", "h200", "--dry-run", "--device", "npu:0"),
     "--device npu:0: chip h200 is tuned on cuda devices"),
    ((*TUNE, "--devices", "cuda:0,what?"), "argument --devices: expected comma-separated device names"),
    ((*TUNE, "--remeasure"), "--remeasure goes with --measure-fill"),
    ((*TUNE, "--shard", "2/2"), "--shard K/N needs 0 <= K < N, got '2/2'"),
    (("host-time", "--device", "cuda:0"), "device 'cuda:0' is not a cpu device (the interpreter runs on CPU tensors)"),
    (("bench", "toy_op", "--baseline", "x", "--device", "gpu 0"), "argument --device: expected a device name"),
])
def test_settings_are_refused_before_any_work(capsys, args, expected):
    code, err = _main(capsys, *args, root=TOY if "toy_op" in args else ROOT)
    assert code == 2 and expected in err and "Traceback" not in err


@pytest.mark.parametrize("args", [
    ("--root", URL, "build", "--check"),  # the path collapses '//': postgresql:/user:PASSWORD@...
    ("--root", f"/tmp/{URL}", "records", "toy_op", "--chip", "interpreter"),
])
def test_a_password_in_a_path_is_masked(capsys, args):
    from opgen.cli.main import main

    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "PASSWORD" not in err and "user:***@127.0.0.1" in err


# --- spec values the build took silently --------------------------------------------------------
def _spec(tmp_path: Path, change) -> Path:
    data = yaml.safe_load((TOY / "specs" / "toy_op.yaml").read_text())
    change(data)
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "toy_op.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["cases"].update(smoke=[]), "cases.smoke: expected at least one case"),
    (lambda d: d["cases"]["smoke"][0].update(N=[]), "cases.smoke.0.N: expected a value or a list of at least one"),
    (lambda d: d["cases"]["smoke"][0].update(out_dtype="float16", N=[50, 60]), None),  # a choice: taken
    (lambda d: d["cases"]["smoke"][0].update(out_dtype="float64"), "cases.smoke.0.out_dtype: expected a dtype value"),
    (lambda d: (d["signature"]["scalars"]["out_dtype"].update(choices=["float32"]),
                d["cases"]["smoke"][0].update(out_dtype="float16")),
     "cases.smoke.0.out_dtype: expected one of choices ['float32']; got 'float16'"),
    (lambda d: d["dispatch"]["key"]["N"].update(buckets=[]), "dispatch.key.N.buckets: expected at least one edge"),
    (lambda d: d["dispatch"]["key"]["N"].update(buckets=[64, 10 ** 40]),
     "dispatch.key.N.buckets.1: expected an int in [-2**63, 2**63 - 1]"),
    (lambda d: d["api"].update(launch_args=["x", "x", "y", "y_plus"]), "api.launch_args: expected each argument once"),
])
def test_spec_values_no_build_should_take_are_named(tmp_path, change, expected):
    path = _spec(tmp_path, change)
    if expected is None:
        load_spec(path, tmp_path)
        return
    with pytest.raises(SpecError) as info:
        load_spec(path, tmp_path)
    assert expected in str(info.value)


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["cases"]["bench_fla"][0].update(chunk_size=48), "cases.bench_fla.0.chunk_size: expected one of choices [32, 64]"),
    (lambda d: d["sampling"].update(count=10 ** 12), "sampling.count"),
    (lambda d: d["sampling"].update(measure_extra=10 ** 9), "sampling.measure_extra"),
    (lambda d: d["accuracy"]["max_rel_l2"].update(bfloat16=-1), "accuracy.max_rel_l2.bfloat16"),
    (lambda d: d["accuracy"]["max_rel_l2"].update(bfloat16=float("nan")), "accuracy.max_rel_l2.bfloat16"),
])
def test_real_spec_values_out_of_range_are_named(tmp_path, change, expected):
    data = yaml.safe_load(GLA.read_text())
    change(data)
    data.pop("sampling") if "sampling" not in expected else None  # no drawn file beside the copy
    path = tmp_path / "chunk_gla_fwd_o_gk.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(path, tmp_path)
    assert expected in str(info.value)


@pytest.mark.parametrize("old, new, expected", [
    ('  - "BLOCK <= max(16, pow2(N))"\n', "  - \"'yes'\"\n", "constraints.0 gives 'yes' with good at the"),
    ('  - "BLOCK <= max(16, pow2(N))"\n', '  - "BLOCK"\n', "constraints.0 gives 16 with good"),
    ('hang: {doc: "never returns"}', 'hang: {doc: "x", when: "N"}', "variants.axes.MODE.hang.when gives 50, not a boolean"),
])
def test_a_condition_that_gives_no_boolean_is_named(tmp_path, old, new, expected):
    from opgen.errors import BuildError
    from opgen.space.case_checks import check_cases

    spec = tmp_path / "specs" / "toy_op.yaml"
    spec.parent.mkdir()
    spec.write_text((TOY / "specs" / "toy_op.yaml").read_text().replace(old, new))
    with pytest.raises(BuildError) as info:
        check_cases(load_spec(spec, TOY))
    assert "case smoke[0]" in str(info.value) and expected in str(info.value)


# --- records the reader could not parse ------------------------------------------------------
@pytest.mark.parametrize("line, expected", [
    ("[" * 100000 + "]" * 100000, "toy_op.jsonl:1: not a JSON line (maximum recursion depth exceeded"),
    ('{"median_ms": 1' + "0" * 400 + "}", "toy_op.jsonl:1: foreign record"),
])
def test_records_lines_past_the_parser_are_named(tmp_path, line, expected):
    from opgen.storage.records import read

    path = tmp_path / "toy_op.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(RecordError) as info:
        read(path, op="toy_op", chip="interpreter")
    assert expected in str(info.value)


def test_a_median_too_large_for_a_float_is_no_finite_number():
    from opgen.spec.expr import is_finite_number

    assert not is_finite_number(10 ** 400) and is_finite_number(10 ** 300) and not is_finite_number(True)


# --- template filters and methods with a size argument (their refusals: test_bad_input.py) -----
def test_template_filters_within_their_bounds_render():
    from opgen.render.render import environment, render

    body = ("x = 1  # {{ 'abc' | replace('b', 'x') }} {{ '%5d' | format(3) }} {{ 'ab'.replace('a', 'c') }} "
            "{{ '{}'.format(10 ** 8) }} {{ [1, 2] | join(',') }} {{ 'a b' | wordwrap(3) }}\n")
    assert render(environment([_template(body)]), "t.py.j2", {}) == "x = 1  # axc     3 cb 100000000 1,2 a b\n"
