"""The freeze checks every winner against the spec as it is and reports what it skips: a point outside
its tunables' domains, of the wrong type or against a constraint, a median that is no time, and
a torn last records line; a blank last line is no record."""
import json
import shutil
from pathlib import Path

import pytest

from opgen import records
from opgen.cli import main
from opgen.errors import RecordError
from opgen.hardware import profile
from opgen.kernels import kernel_hashes
from opgen.keys import key_of
from opgen.space import case_inputs, evaluate_params
from opgen.spec import load_spec
from opgen.table import frozen_rows

TOY = Path(__file__).resolve().parent / "toy_project"
CHIP = profile("interpreter")
TABLE = Path("generated/toy_op/table_interpreter.py")
RECORDS = Path("records/interpreter/toy_op.jsonl")


@pytest.fixture()
def toy(tmp_path):
    shutil.copytree(TOY, tmp_path, dirs_exist_ok=True)
    spec = load_spec(tmp_path / "specs" / "toy_op.yaml", tmp_path)
    return tmp_path, spec, kernel_hashes(tmp_path, spec, CHIP.rendering)


def _winner(spec, hashes, N=50, median=0.5, **point):
    case = {"N": N, "dtype": "float32"}
    return records.WinnerRecord(
        op="toy_op", chip="interpreter", toolchain={"triton": "3.6.0"}, kernel_hash=hashes["good"],
        key=key_of(spec, evaluate_params(spec, case_inputs(spec, case))), case=case, variant="good",
        point={"BLOCK": 16, **point}, study="s", date="2026-11-30", median_ms=median,
        remeasured_ms={}, margin=None, error={}, budget=None)


def _line(rec, **changes):
    return json.dumps({**rec.to_json(), **changes}, sort_keys=True, separators=(",", ":"))


def _build(root, capsys):
    """The table ``opgen build`` writes (without its header's records hash) and what it printed on stderr."""
    assert main(["--root", str(root), "build"]) == 0
    text = "".join(line for line in (root / TABLE).read_text().splitlines(True) if not line.startswith("# records"))
    return text, capsys.readouterr().err


@pytest.mark.parametrize("point, median, why", [
    ({"BLOCK": 24}, 0.5, "BLOCK 24 is not in its domain [16, 32, 64, 128]"),
    ({"BLOCK": "64"}, 0.5, "BLOCK '64' is not in its domain [16, 32, 64, 128]"),
    ({"BLOCK": True}, 0.5, "BLOCK True is not in its domain [16, 32, 64, 128]"),
    ({"BLOCK": 128}, 0.5, "its point violates the constraint BLOCK <= max(16, pow2(N))"),
    ({"BLOCK": 32}, -1.0, "its median -1 ms is not a time"),
])
def test_a_winner_outside_the_specs_space_now_is_not_frozen_and_the_reason_is_said(toy, capsys, point, median, why):
    root, spec, hashes = toy
    good = _winner(spec, hashes, N=3000, BLOCK=32)
    path = root / RECORDS
    path.parent.mkdir(parents=True)
    path.write_text(_line(good) + "\n" + _line(_winner(spec, hashes), point=point, median_ms=median) + "\n")
    table = frozen_rows(spec, CHIP, path, hashes, fill=False)
    assert [r.key for r in table.rows] == [good.key]
    assert [s.reason for s in table.stale] == [why]
    text, _ = _build(root, capsys)
    assert f"stale, not frozen: good at (0,): {why}" in text and "1 tuned rows" in text
    assert main(["--root", str(root), "records", "toy_op", "--chip", "interpreter"]) == 0
    assert f"({why})" in capsys.readouterr().out


def test_a_later_good_winner_replaces_one_that_no_longer_holds(toy):
    root, spec, hashes = toy
    path = root / RECORDS
    path.parent.mkdir(parents=True)
    path.write_text(_line(_winner(spec, hashes), point={"BLOCK": 24}) + "\n"
                    + _line(_winner(spec, hashes, BLOCK=32)) + "\n")
    table = frozen_rows(spec, CHIP, path, hashes, fill=False)
    assert [r.point for r in table.rows] == [{"BLOCK": 32}] and table.stale == ()


def test_a_non_finite_median_is_refused_naming_the_line(toy):
    root, spec, hashes = toy
    path = root / RECORDS
    path.parent.mkdir(parents=True)
    path.write_text(_line(_winner(spec, hashes)).replace('"median_ms":0.5', '"median_ms":NaN') + "\n")
    with pytest.raises(RecordError, match=r"toy_op.jsonl:1: .*median_ms: expected a finite number"):
        frozen_rows(spec, CHIP, path, hashes)


def test_a_torn_last_line_is_reported_by_the_build(toy, capsys):
    root, spec, hashes = toy
    path = root / RECORDS
    path.parent.mkdir(parents=True)
    lines = [_line(_winner(spec, hashes)), _line(_winner(spec, hashes, N=3000, BLOCK=32))]
    path.write_text("\n".join(lines) + "\n")
    whole, err = _build(root, capsys)
    assert "2 tuned rows" in whole and "torn" not in whole + err
    path.write_text(lines[0] + "\n" + lines[1][:-30])
    text, err = _build(root, capsys)
    assert "1 tuned rows" in text and "its torn last line skipped" in text
    assert f"{path}: its last line is torn" in err and "opgen tune" in err
    assert main(["--root", str(root), "build", "--check"]) == 0  # the same table again


def test_blank_last_lines_are_no_records(toy, capsys):
    root, spec, hashes = toy
    path = root / RECORDS
    path.parent.mkdir(parents=True)
    lines = [_line(_winner(spec, hashes)), _line(_winner(spec, hashes, N=3000, BLOCK=32))]
    path.write_text("\n".join(lines) + "\n")
    whole, _ = _build(root, capsys)
    for tail in ("\n", "\n\n", "\n  \n"):
        path.write_text("\n".join(lines) + "\n" + tail)
        got = records.read(path, op="toy_op", chip="interpreter")
        assert len(got.records) == 2 and got.torn == 0
        assert _build(root, capsys) == (whole, "")
    records.append(path, [_winner(spec, hashes, BLOCK=32)])
    assert len(records.read(path, op="toy_op", chip="interpreter").records) == 3
