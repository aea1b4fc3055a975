"""The freeze checks every winner against the spec as it is and reports what it skips: a point outside
its tunables' domains, of the wrong type or against a constraint, a median that is no time, and
a torn last records line; a blank last line is no record."""
import json
import shutil
from pathlib import Path

import pytest

from opgen.storage import records
from opgen.cli.main import main
from opgen.errors import RecordError
from opgen.spec.hardware import profile
from opgen.render.kernels import kernel_hashes
from opgen.spec.keys import key_of
from opgen.space.space import case_inputs, evaluate_params
from opgen.spec.spec import load_spec
from opgen.table.table import frozen_rows

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


CASE = {"N": 50, "dtype": "float32"}


@pytest.mark.parametrize("point, median, case, why", [
    ({"BLOCK": 24}, 0.5, CASE, "BLOCK 24 is not in its domain [16, 32, 64, 128]"),
    ({"BLOCK": "64"}, 0.5, CASE, "BLOCK '64' is not in its domain [16, 32, 64, 128]"),
    ({"BLOCK": True}, 0.5, CASE, "BLOCK True is not in its domain [16, 32, 64, 128]"),
    ({"BLOCK": 128}, 0.5, CASE, "its point violates the constraint BLOCK <= max(16, pow2(N))"),
    ({"BLOCK": 32}, -1.0, CASE, "its median -1 ms is not a time"),
    ({"BLOCK": 16}, 0.5, {**CASE, "N": 0}, "its case's N 0 is no size"),
    ({"BLOCK": 16}, 0.5, {**CASE, "ZZ": 1}, "its case names ['ZZ'], no input of toy_op"),
    ({"BLOCK": 16}, 0.5, {**CASE, "out_dtype": "bfloat16"},
     "its case's out_dtype 'bfloat16' is not among its choices"),
])
def test_a_winner_outside_the_specs_space_now_is_not_frozen_and_the_reason_is_said(toy, capsys, point, median, case,
                                                                                   why):
    root, spec, hashes = toy
    good = _winner(spec, hashes, N=3000, BLOCK=32)
    path = root / RECORDS
    path.parent.mkdir(parents=True)
    path.write_text(_line(good) + "\n" + _line(_winner(spec, hashes), point=point, median_ms=median, case=case) + "\n")
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


def _measure(spec, won, N, ms, key=None, toolchain=None, date="2026-12-01"):
    """A measure record of ``won``'s point on the case of ``N`` (stored under ``key``, else the
    key its case gives)."""
    case = {"N": N, "dtype": "float32"}
    return records.MeasureRecord(
        op="toy_op", chip="interpreter", toolchain=toolchain or won.toolchain, kernel_hash=won.kernel_hash,
        key=key or key_of(spec, evaluate_params(spec, case_inputs(spec, case))), case=case, variant=won.variant,
        point=dict(won.point), study=won.study, date=date, ms=ms, source=f"winner of {won.key!r}", run="r1")


def test_rows_timed_under_another_toolchain_than_the_latest_are_named(toy, capsys):
    """The table says which toolchains its measured rows were timed under, with counts; a row of
    another toolchain than the latest measurement's is named in the table, by the build and by
    `opgen records`, as one to measure again."""
    import dataclasses

    root, spec, hashes = toy
    path = root / RECORDS
    small, large = _winner(spec, hashes), _winner(spec, hashes, N=3000, BLOCK=32)
    records.append(path, [small, large, _measure(spec, large, 5000, 0.7)])
    text, err = _build(root, capsys)
    assert "Measured under triton 3.6.0: 2 tuned rows and 1 measured fills." in text
    assert "MIXED" not in text + err
    old = {"triton": "3.5.0", "torch": "2.10.0"}
    path.unlink()
    records.append(path, [dataclasses.replace(small, toolchain=old), large, _measure(spec, large, 5000, 0.7)])
    text, err = _build(root, capsys)
    latest = "triton 3.6.0 (the latest measurement's): 1 tuned rows and 1 measured fills"
    assert f"Measured under 2 toolchains: {latest}; torch 2.10.0, triton 3.5.0: 1 tuned rows." in " ".join(
        text.split())
    named = "MIXED TOOLCHAINS: 1 rows were timed under another toolchain than the latest (triton 3.6.0)"
    assert named in " ".join(text.split()) and "(0,) (torch 2.10.0, triton 3.5.0)." in " ".join(text.split())
    assert f"table_interpreter of toy_op: {named}" in err and "(0,) (torch 2.10.0, triton 3.5.0)" in err
    assert main(["--root", str(root), "build", "--check"]) == 0  # the same bytes again
    main(["--root", str(root), "records", "toy_op", "--chip", "interpreter"])
    out = capsys.readouterr().out
    assert f"Measured under 2 toolchains: {latest}" in out and named in out
    # the latest measurement is the latest date's, a later line of one date: the old toolchain's
    path.unlink()
    records.append(path, [small, dataclasses.replace(large, toolchain=old, date="2026-12-01")])
    table = frozen_rows(spec, CHIP, path, hashes)
    assert table.toolchains.counts == (("torch 2.10.0, triton 3.5.0", (1, 0)), ("triton 3.6.0", (1, 0)))
    assert table.toolchains.other == (((0,), "triton 3.6.0"),)


def test_rows_whose_case_moved_to_another_bucket_are_frozen_where_it_falls_now_and_named(toy, capsys):
    """A record measured for a key the spec no longer gives its case (an edge moved) stands for
    the bucket its case falls in now, and the table, its row and `opgen records` say so."""
    root, spec, hashes = toy
    path = root / RECORDS
    small, large = _winner(spec, hashes), _winner(spec, hashes, N=3000, BLOCK=32)
    records.append(path, [small, large, _measure(spec, small, 5000, 0.7)])
    text, _ = _build(root, capsys)
    assert "Re-keyed" not in text and "measured for key" not in text
    spec_file = root / "specs" / "toy_op.yaml"
    spec_file.write_text(spec_file.read_text().replace("buckets: [64, 4096]", "buckets: [32, 2048, 4096]"))
    moved = load_spec(spec_file, root)  # N=50 in bucket 1 now, N=3000 in 2, N=5000 in 3
    table = frozen_rows(moved, CHIP, path, hashes)
    assert [(r.key, r.source) for r in table.rows if r.source is None or r.measured] == [((1,), None), ((2,), None),
                                                                                            ((3,), (1,))]
    assert table.moved == (((1,), (0,), "tuned row"), ((2,), (1,), "tuned row"), ((3,), (2,), "measured fill"))
    text, _ = _build(root, capsys)
    flat = " ".join(text.split())
    assert ("Re-keyed: 2 of the 2 tuned rows and 1 of the 1 measured fills were measured for another key than the "
            "spec's dispatch key gives their case now") in flat
    assert "# N in (32, 2048], median 0.5000 ms, tuned 2026-11-30, measured for key (0,)\n    (1,): " in text
    assert main(["--root", str(root), "build", "--check"]) == 0
    main(["--root", str(root), "records", "toy_op", "--chip", "interpreter"])
    out = capsys.readouterr().out
    for line in ("tuned row (1,): measured for (0,)", "tuned row (2,): measured for (1,)",
                 "measured fill (3,): measured for (2,)"):
        assert line in out
