"""``opgen bench``'s agreement with the baseline: per output rel. L2, the table's ``agree`` column
and summary line, and its JSON round trip through shards (older shards read as no agreement); its
``--where`` filter; a case that raises, named while the others still run."""
import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from opgen.cli import main as cli
from opgen.evidence.compare import CaseResult, agreement, case_id, generated_hash, table, worst_agreement
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["states", "qk_dot", "dmimo_o", "dmimo_z", "dz"]


def _result(case, agree=None, speedup=2.0):
    return CaseResult(case, 1.0, speedup, 0.5, 1e-3, 2e-3, 0.1, 20.0, 40.0, 60.0, 1.0, 2.0,
                      **({} if agree is None else {"agree": agree}))


def test_agreement_is_rel_l2_of_ours_against_the_baseline_per_output_both_return():
    base = (torch.ones(4), torch.ones(2, 2), torch.full((3,), 2.0), None, None)
    ours = (torch.ones(4), torch.ones(2, 2) * 1.5, torch.full((3,), 2.0), torch.ones(3), None)
    agree = agreement(NAMES, ours, base)
    assert list(agree) == ["states", "qk_dot", "dmimo_o"]  # dmimo_z: the baseline gave none
    assert agree["states"] == 0.0 and math.isclose(agree["qk_dot"], 0.5) and agree["dmimo_o"] == 0.0
    assert agreement(["o"], torch.ones(2), torch.zeros(2)) == {}  # one output: the error column says it
    assert agreement(NAMES[:2], {"states": torch.ones(1), "qk_dot": torch.ones(1)},
                     (torch.ones(1), torch.zeros(1))) == {"states": 0.0, "qk_dot": math.inf}


def test_the_agree_column_names_the_output_that_agrees_least():
    assert worst_agreement({"states": 3.1e-3, "dmimo_o": 4.123e-3, "qk_dot": 1e-3}) == "dmimo_o 4.12e-03"
    assert worst_agreement({"states": 1.0, "dz": math.nan}) == "dz nan"
    assert worst_agreement({}) == "-"


def test_table_adds_the_column_and_a_summary_line_only_for_several_outputs():
    plain = table([_result("B1-a"), _result("B1-b")], "fla").splitlines()
    assert "agree" not in plain[0] and not plain[-1].startswith("agreement")
    assert len(plain[0].split()) == len(table([_result("B1-a")], "fla").splitlines()[0].split())
    rows = [_result("B1-a", {"states": 3e-3, "qk_dot": 5e-3, "dmimo_o": 1e-3}),
            _result("B1-b", {"states": 4e-3, "qk_dot": 2e-3, "dmimo_o": math.nan}),
            _result("B1-c")]  # an older shard's case: no agreement recorded
    lines = table(rows, "tilelang").splitlines()
    plain = table([_result("B1-a"), _result("B1-b")], "tilelang").splitlines()
    assert lines[0] == plain[0] + f" {'agree':>16}"
    assert lines[1].endswith(" qk_dot 5.00e-03") and lines[2].endswith(" dmimo_o nan")
    assert lines[3].endswith(f" {'-':>16}")
    assert lines[1][:len(plain[1])] == plain[1]  # the other columns unchanged
    assert lines[4].startswith("geomean speedup 2.000x")
    assert lines[-1] == ("agreement with tilelang (rel. L2 of ours against it), worst case per output: "
                         "states 4.00e-03 (B1-b), qk_dot 5.00e-03 (B1-a), dmimo_o nan (B1-b)")


def test_case_results_round_trip_through_json_and_old_shards_read_as_no_agreement():
    r = _result("B1-a", {"states": 3e-3, "dz": math.inf})
    back = CaseResult(**json.loads(json.dumps(dataclasses.asdict(r))))
    assert back == r and back.agree == {"states": 3e-3, "dz": math.inf}
    old = dataclasses.asdict(_result("B1-b"))
    del old["agree"]
    assert CaseResult(**json.loads(json.dumps(old))).agree == {}


def test_merged_shards_carry_the_agreement_into_the_table(tmp_path, capsys):
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    ids = [case_id(row) for row in spec.expand_cases("official_z")]
    agree = {name: 1e-3 * (i + 1) for i, name in enumerate(NAMES)}
    shards = [[dataclasses.asdict(_result(c, agree)) for c in ids[:6]],
              [{k: v for k, v in dataclasses.asdict(_result(c)).items() if k != "agree"} for c in ids[6:]]]
    files = []
    for k, results in enumerate(shards):
        files.append(tmp_path / f"s{k}.json")
        files[-1].write_text(json.dumps(dict(op=spec.op, generated=generated_hash(ROOT, spec.op),
                                             toolchain={"device": "NVIDIA H200"}, results=results)))
    assert cli.main(["--root", str(ROOT), "bench", spec.op, "--baseline", "tilelang", "--cases", "official_z",
                     "--merge", *map(str, files)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[-1] == "agree"
    assert [line.split()[0] for line in lines[1:12]] == ids
    assert all(line.endswith("dz 5.00e-03") for line in lines[1:7])
    assert all(line.endswith(" -") for line in lines[7:12])
    assert lines[-1].startswith("agreement with tilelang") and f"dz 5.00e-03 ({ids[0]})" in lines[-1]


def test_bench_on_devices_writes_the_merged_json_with_the_agreement(tmp_path, monkeypatch, capsys):
    from opgen.tune import shard

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    ids = [case_id(row) for row in spec.expand_cases("official")]
    calls = []

    def fake_run_shards(options, devices):  # what each shard would write with --json
        calls.append(options)
        for i, path in enumerate(o["json"] for o in options):
            mine = [c for c, s in zip(ids, shard.assign([1.0] * len(ids), len(devices))) if s == i]
            results = [dataclasses.asdict(_result(c, {"states": 1e-3 * (i + 1)})) for c in mine]
            Path(path).write_text(json.dumps(dict(op=spec.op, generated=generated_hash(ROOT, spec.op),
                                                  toolchain={"device": "NVIDIA H200"}, results=results)))
        return [0] * len(devices)

    monkeypatch.setattr(shard, "run_shards", fake_run_shards)
    merged = tmp_path / "merged.json"
    assert cli.main(["--root", str(ROOT), "bench", spec.op, "--baseline", "tilelang", "--cases", "official",
                     "--devices", "cuda:0,cuda:1", "--json", str(merged)]) == 0
    assert len({o["json"] for o in calls[0]}) == 2 and str(merged) not in {o["json"] for o in calls[0]}
    written = json.loads(merged.read_text())
    assert [r["case"] for r in written["results"]] == ids
    assert {r["agree"]["states"] for r in written["results"]} == {1e-3, 2e-3}
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("agreement with tilelang")


def test_run_case_measures_each_outputs_agreement_with_the_baseline(monkeypatch):
    """run_case on the CPU with stand-ins: 'ours' is the fp32 reference, the baseline the same with
    dmimo_o scaled by 1.01, so every output agrees exactly but dmimo_o (rel. L2 0.01 / 1.01)."""
    import types

    from opgen.run import bench
    from opgen.evidence import compare
    from opgen.backends.interpreter import InterpreterBackend
    from opgen.references.mamba3_mimo_bwd_fwd import reference_fp32

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)

    def ours(output_dtype, **args):
        return tuple(reference_fp32(**args).values())

    def base(**args):
        states, qk_dot, dmimo_o, dmimo_z, dz = ours(**args)
        return states, qk_dot, dmimo_o * 1.01, dmimo_z, dz

    monkeypatch.setitem(sys.modules, f"generated.{spec.op}", types.SimpleNamespace(**{spec.op: ours}))
    row = dict(B=1, S=16, H=2, G=1, N=4, P=4, R=2, chunk_size=8, d_given=True, mimo_z_given=True,
               z_given=True, dtype="bfloat16")
    r = compare.run_case(spec, row, InterpreterBackend(), base, math.nan, 0, 1, bench.Protocol(warmup=1, repeat=1))
    assert list(r.agree) == ["states", "qk_dot", "dmimo_o", "dmimo_z", "dz"]
    assert math.isclose(r.agree["dmimo_o"], 0.01 / 1.01, rel_tol=1e-4)
    assert all(v == 0.0 for name, v in r.agree.items() if name != "dmimo_o")
    assert worst_agreement(r.agree) == f"dmimo_o {0.01 / 1.01:.2e}"


def test_bench_where_keeps_the_cases_its_formula_passes(tmp_path, capsys):
    """--where filters the case set by a formula of each case's fields, before any shard or merge;
    a formula no case passes, or one naming no field, is refused."""
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    rows = spec.expand_cases("official")
    ids = [case_id(row) for row in rows if row["chunk_size"] >= 16 and row["N"] != 256]
    assert 0 < len(ids) < len(rows)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(dict(op=spec.op, generated=generated_hash(ROOT, spec.op), toolchain={"device": "NVIDIA H200"},
                                    results=[dataclasses.asdict(_result(c)) for c in ids])))
    base = ["--root", str(ROOT), "bench", spec.op, "--baseline", "tilelang", "--cases", "official"]
    assert cli.main([*base, "--where", "chunk_size >= 16 and N != 256", "--merge", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines[1:1 + len(ids)]] == ids
    assert lines[1 + len(ids)].startswith("geomean speedup")
    assert cli.main([*base, "--where", "chunk_size > 64", "--merge", str(path)]) != 0
    assert "none of the 11 cases of 'official' passes" in capsys.readouterr().err
    assert cli.main([*base, "--where", "rank == 4", "--merge", str(path)]) != 0
    assert "rank" in capsys.readouterr().err


def test_a_case_that_raises_is_named_and_the_others_still_make_the_table(tmp_path, monkeypatch, capsys):
    """run_case names the contender that raised on a case's first call and what it raised; over
    devices, a shard that failed a case writes it beside its results: the table holds the others,
    the exit status is 1, the merged JSON lists the failure, and merging that file again refuses
    to make a table without the case, naming what it raised."""
    import types

    from opgen.run import bench
    from opgen.evidence import compare
    from opgen.tune import shard
    from opgen.backends.interpreter import InterpreterBackend

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)

    def ours(**args):
        raise ValueError("at 23:4:\n    tl.static_assert(K <= BK)\n    ^")

    monkeypatch.setitem(sys.modules, f"generated.{spec.op}", types.SimpleNamespace(**{spec.op: ours}))
    row = dict(B=1, S=16, H=2, G=1, N=4, P=4, R=2, chunk_size=8, dtype="bfloat16")
    with pytest.raises(compare.CaseFailed, match=r"^ours: ValueError: at 23:4: \.\.\. tl\.static_assert\(K <= BK\)$"):
        compare.run_case(spec, row, InterpreterBackend(), ours, math.nan, 0, 1, bench.Protocol(warmup=1, repeat=1))
    monkeypatch.undo()

    ids = [case_id(row) for row in spec.expand_cases("official")]
    lost = ids[3]

    def fake_run_shards(options, devices):
        codes = []
        for i, path in enumerate(o["json"] for o in options):
            mine = [c for c, s in zip(ids, shard.assign([1.0] * len(ids), len(devices))) if s == i]
            failed = [{"case": c, "error": "ours: CompileTimeAssertionFailure: K <= BK"} for c in mine if c == lost]
            Path(path).write_text(json.dumps(dict(
                op=spec.op, generated=generated_hash(ROOT, spec.op), toolchain={"device": "NVIDIA H200"},
                results=[dataclasses.asdict(_result(c)) for c in mine if c != lost], failed=failed)))
            codes.append(1 if failed else 0)
        return codes

    monkeypatch.setattr(shard, "run_shards", fake_run_shards)
    merged = tmp_path / "merged.json"
    assert cli.main(["--root", str(ROOT), "bench", spec.op, "--baseline", "tilelang", "--cases", "official",
                     "--devices", "cuda:0,cuda:1", "--json", str(merged)]) == 1
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()[1:len(ids)]] == [c for c in ids if c != lost]
    assert f"{lost} failed: ours: CompileTimeAssertionFailure: K <= BK" in err and "1 of 11 cases failed" in err
    written = json.loads(merged.read_text())
    assert written["failed"] == [{"case": lost, "error": "ours: CompileTimeAssertionFailure: K <= BK"}]
    assert cli.main(["--root", str(ROOT), "bench", spec.op, "--baseline", "tilelang", "--cases", "official",
                     "--merge", str(merged)]) != 0
    assert f"bench cases failed: {lost}: ours: CompileTimeAssertionFailure: K <= BK" in capsys.readouterr().err


def test_a_contender_that_raises_while_timed_is_named(monkeypatch):
    """A contender whose first call ran but a timed call raised (a fault that shows under load):
    run_case names the side, says it was timed and what it raised, as at a first call."""
    import types

    import torch

    from opgen.run import bench
    from opgen.evidence import compare
    from opgen.backends.interpreter import InterpreterBackend

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    calls = []

    def flaky(**args):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return (torch.zeros(3),)

    monkeypatch.setitem(sys.modules, f"generated.{spec.op}", types.SimpleNamespace(**{spec.op: flaky}))
    monkeypatch.setattr("opgen.run.accuracy.rel_l2", lambda a, b: 0.0)
    monkeypatch.setattr(compare, "agreement", lambda names, ours, base: {})
    row = dict(B=1, S=16, H=2, G=1, N=4, P=4, R=2, chunk_size=8, dtype="bfloat16")
    with pytest.raises(compare.CaseFailed, match=r"^ours, timed: RuntimeError: CUDA error: an illegal memory"):
        compare.run_case(spec, row, InterpreterBackend(), lambda **args: (torch.zeros(3),), math.nan,
                         0, 1, bench.Protocol(warmup=1, repeat=1))
    assert len(calls) == 2


def test_the_floor_summary_names_the_worst_case_and_sets_the_launch_bound_ones_apart():
    """Beside the geomean over every case, the summary names the worst fraction of the memory
    floor and, where some cases' floor is under 20 us (launch-bound calls), the geomean and worst
    over the others; an op without a traffic formula (NaN floors) gets neither."""
    from opgen.evidence.compare import LAUNCH_BOUND_MS

    tiny = dataclasses.replace(_result("B1-tiny"), floor_ms=0.0001, ours_ms=0.0064, base_ms=0.01)
    big = [dataclasses.replace(_result(f"B8-{i}"), floor_ms=f, ours_ms=0.1, base_ms=0.125)
           for i, f in enumerate((0.08, 0.07))]
    assert tiny.floor_ms < LAUNCH_BOUND_MS <= min(r.floor_ms for r in big)
    line = table([tiny, *big], "fla").splitlines()[4]
    assert (f"(min 0.016 (B1-tiny); over the 2 of 3 cases whose floor is at least 20 us (the others are "
            f"launch-bound): geomean ours {math.sqrt(0.8 * 0.7):.3f}, fla {math.sqrt(0.64 * 0.56):.3f}, "
            f"min 0.700 (B8-1)); error no worse") in line
    assert "memory floor 0.748 (min 0.700 (B8-1)); error" in table(big, "fla").splitlines()[3]
    assert "every case's floor is under 20 us (launch-bound)" in table([tiny], "fla").splitlines()[2]
    nan = dataclasses.replace(_result("B1-n"), floor_ms=math.nan)
    assert "memory floor nan; error" in table([nan], "fla").splitlines()[2]


def test_compile_only_calls_each_side_once_and_computes_no_golden(monkeypatch):
    """compile_case, what the compiling processes before a timed run call: each side once on the
    case's inputs, no golden (prepare_case is never reached), a side that raises named."""
    import types

    from opgen.backends.interpreter import InterpreterBackend
    from opgen.evidence import compare

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    calls = []

    def ours(**args):
        calls.append(("ours", tuple(args["q"].shape)))

    def base(**args):
        calls.append(("baseline", tuple(args["q"].shape)))

    def no_golden(*args, **kwargs):
        raise AssertionError("compile_case computed a golden")

    monkeypatch.setitem(sys.modules, f"generated.{spec.op}", types.SimpleNamespace(**{spec.op: ours}))
    monkeypatch.setattr(compare, "prepare_case", no_golden)
    row = dict(B=1, S=16, H=2, G=1, N=4, P=4, R=2, chunk_size=8, d_given=True, dtype="bfloat16")
    firsts = compare.compile_case(spec, row, InterpreterBackend(), base, 0)
    assert calls == [("ours", (1, 16, 2, 1, 4)), ("baseline", (1, 16, 2, 1, 4))] and min(firsts) >= 0

    def broken(**args):
        raise RuntimeError("no kernel for this shape")

    with pytest.raises(compare.CaseFailed, match="baseline: RuntimeError: no kernel for this shape"):
        compare.compile_case(spec, row, InterpreterBackend(), broken, 0)


def test_compile_only_takes_no_timing_outputs(tmp_path, capsys):
    code = cli.main(["--root", str(ROOT), "bench", "mamba3_mimo_bwd_fwd", "--baseline", "tilelang_static", "--cases", "official", "--compile-only",
                     "--json", str(tmp_path / "x.json")])
    assert code == 2 and "--compile-only times nothing" in capsys.readouterr().err
