"""Work split over devices: shard parsing and assignment, bucket shares of a campaign, and
``opgen tune --devices`` end to end on the interpreter (devices pinned to the CPU)."""
import json
import sys
from pathlib import Path

import pytest

from opgen.cli import main as cli
from opgen.tune import shard, tune
from opgen.errors import UsageError
from opgen.spec.hardware import profile
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_tune import RECORDS, _project  # noqa: E402


@pytest.mark.parametrize("text", ["1", "2/2", "-1/2", "a/b", "1/0", "0/2/3", ""])
def test_bad_shards_are_refused(text):
    with pytest.raises(UsageError, match="--shard"):
        shard.parse_shard(text)


def test_assign_balances_heaviest_first_and_is_deterministic():
    weights = [5, 1, 1, 3, 2, 2]
    split = shard.assign(weights, 2)
    assert split == shard.assign(weights, 2)
    loads = [sum(w for w, s in zip(weights, split) if s == k) for k in range(2)]
    assert sorted(loads) == [7, 7]
    assert shard.assign(weights, 1) == [0] * 6
    assert sorted(shard.assign([1, 1, 1], 3)) == [0, 1, 2]


def test_pin_shows_one_device_as_device_zero():
    assert shard.pin("cuda:3") == ({"CUDA_VISIBLE_DEVICES": "3"}, "cuda:0")
    assert shard.pin("npu:1") == ({"ASCEND_RT_VISIBLE_DEVICES": "1"}, "npu:0")
    for bad in ("cpu", "cuda", "cuda:x", "tpu:0"):
        with pytest.raises(UsageError, match="cuda:N or npu:N"):
            shard.pin(bad)
    with pytest.raises(UsageError, match="twice"):
        shard.run_shards([{}, {}], ["cuda:0", "cuda:0"])


def test_shard_processes_get_their_options_by_value(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path)
    monkeypatch.setattr(shard, "pin", lambda device: ({}, "cpu"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    options = {"command": "build", "root": str(root), "check": True}
    assert shard.run_shards([options, {**options, "check": False}], ["cuda:0", "cuda:1"]) == [0, 0]
    out = capsys.readouterr().out
    assert "[cuda:0] generated/ is up to date" in out and "[cuda:1] opgen build: " in out


def test_bucket_shares_partition_the_campaign():
    spec = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
    plans = tune.plan(spec, profile("h200"), spec.expand_cases("bench"), ["fold_general_tiled", "fold_h1_tiled"])
    shares = [tune.shard_plans(plans, k, 3, cap=8) for k in range(3)]
    keys = [{p.bucket.key for p in share} for share in shares]
    assert all(keys) and not (keys[0] & keys[1]) and not (keys[1] & keys[2]) and not (keys[0] & keys[2])
    assert sorted(id(p) for share in shares for p in share) == sorted(id(p) for p in plans)


def test_tune_on_devices_gives_each_shard_its_buckets(tmp_path, monkeypatch, capsys):
    root = _project(tmp_path)
    monkeypatch.setattr(shard, "pin", lambda device: ({}, "cpu"))  # no GPUs here: both run on the CPU
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.chdir(root)
    code = cli.main(["--root", str(root), "tune", "toy_op", "--chip", "interpreter", "--cases", "two",
                     "--variants", "good", "--warmup", "1", "--repeat", "2", "--no-progress", "--trials", "3",
                     "--point-timeout", "30", "--devices", "cuda:0,cuda:1", "--cross-check", "--cross-margin", "0.5",
                     "--tie-margin", "100"])  # every correct point ties: both buckets win with one point
    out = capsys.readouterr().out
    assert code == 0, out
    records = [json.loads(line) for line in (root / RECORDS).read_text().splitlines()]
    assert sorted(r["key"] for r in records if r["kind"] == "winner") == [[0], [1]]
    # each shard's summary: a bucket by the shapes it stands for, its winner on the next line
    lines = out.splitlines()
    rows = [(line.split()[0], line.split(" ", 1)[1]) for line, after in zip(lines, lines[1:])
            if line.endswith(":") and after.split()[1:2] == ["good"]]
    assert sorted(rows) == [("[cuda:0]", "N <= 64:"), ("[cuda:1]", "N in (64, 4096]:")], out  # a bucket each
    assert "[cuda:0] ok: worst leave-one-out loss" in out  # the cross-check, after both shards
    with pytest.raises(SystemExit):
        cli.main(["tune", "toy_op", "--chip", "interpreter", "--devices"])
    assert cli.main(["--root", str(root), "tune", "toy_op", "--chip", "interpreter", "--cases", "two",
                     "--devices", "cuda:0", "--shard", "0/2"]) == 2
    assert "leave out --device and --shard" in capsys.readouterr().err


def test_bench_on_devices_merges_the_shards_in_case_order(tmp_path, monkeypatch, capsys):
    from opgen.evidence.compare import CaseResult, case_id

    spec = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
    ids = [case_id(row) for row in spec.expand_cases("bench_fla")]
    calls = []

    def fake_run_shards(options, devices):  # what each shard would write with --json
        calls.append(([{k: o[k] for k in ("command", "op", "baseline", "cases", "devices", "output")}
                        for o in options], devices))
        for i, path in enumerate(o["json"] for o in options):
            mine = [c for c, s in zip(ids, shard.assign([1.0] * len(ids), len(devices))) if s == i]
            results = [CaseResult(c, 1.0, 1.5, 0.5, 1e-3, 2e-3, 0.1, 20.0, 40.0, 60.0).__dict__ for c in reversed(mine)]
            Path(path).write_text(_shard_json(results))
        return [0] * len(devices)

    monkeypatch.setattr(shard, "run_shards", fake_run_shards)
    out_file = tmp_path / "table.txt"
    argv = ["--root", str(ROOT), "bench", "chunk_gla_fwd_o_gk", "--baseline", "fla", "--cases", "bench_fla",
            "--devices", "cuda:0,cuda:1", "--output", str(out_file)]
    assert cli.main(argv) == 0
    shard_options = {"command": "bench", "op": "chunk_gla_fwd_o_gk", "baseline": "fla", "cases": "bench_fla",
                     "devices": None, "output": None}
    assert calls == [([shard_options, shard_options], ["cuda:0", "cuda:1"])]
    provenance, *table = out_file.read_text().splitlines()
    assert provenance.startswith("# chunk_gla_fwd_o_gk: generated/chunk_gla_fwd_o_gk sha256:")
    assert provenance.endswith('measured on {"device": "NVIDIA H200", "triton": "3.6.0"}')
    assert [line.split()[0] for line in table[1:-1]] == ids
    assert table[-1].startswith("geomean speedup 1.500x") and f"error no worse than fla on {len(ids)}/{len(ids)}" in table[-1]
    assert capsys.readouterr().out.strip().endswith(table[-1])


def test_bench_merge_joins_shards_run_apart_and_refuses_gaps_and_repeats(tmp_path, capsys):
    from opgen.evidence.compare import CaseResult, case_id

    spec = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
    ids = [case_id(row) for row in spec.expand_cases("bench_fla")]
    split = shard.assign([1.0] * len(ids), 2)
    files = []
    for k in range(2):  # what `--shard K/2 --json F` writes, one run each
        mine = [c for c, s in zip(ids, split) if s == k]
        files.append(tmp_path / f"s{k}.json")
        files[-1].write_text(_shard_json([CaseResult(c, 1.0, 2.0 + k, 0.5, 1e-3, 2e-3, 0.1, 20.0, 40.0, 60.0).__dict__
                                          for c in reversed(mine)]))
    base = ["--root", str(ROOT), "bench", "chunk_gla_fwd_o_gk", "--baseline", "fla", "--cases", "bench_fla"]
    assert cli.main([*base, "--merge", *map(str, files)]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in table[1:-1]] == ids
    speedups = {line.split()[0]: line.split()[3] for line in table[1:-1]}
    assert {speedups[c] for c, s in zip(ids, split) if s == 1} == {"3.000x"}
    assert cli.main([*base, "--merge", str(files[0])]) != 0
    assert "returned no result for" in capsys.readouterr().err
    assert cli.main([*base, "--merge", str(files[0]), str(files[0]), str(files[1])]) != 0
    assert "appears twice" in capsys.readouterr().err


def test_bench_merge_refuses_shards_of_other_generated_code_or_toolchains(tmp_path, capsys):
    """Shards joined into one table must have measured this tree's generated code on one toolchain."""
    from opgen.evidence.compare import CaseResult, case_id

    spec = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
    ids = [case_id(row) for row in spec.expand_cases("bench_fla")]
    split = shard.assign([1.0] * len(ids), 2)
    results = [[CaseResult(c, 1.0, 2.0, 0.5, 1e-3, 2e-3, 0.1, 20.0, 40.0, 60.0).__dict__
                for c, s in zip(ids, split) if s == k] for k in range(2)]
    base = ["--root", str(ROOT), "bench", "chunk_gla_fwd_o_gk", "--baseline", "fla", "--cases", "bench_fla",
            "--merge"]
    cases = {"old": (_shard_json(results[1], generated="sha256:0123456789abcdef"), "measured generated code"),
             "other gpu": (_shard_json(results[1], device="NVIDIA H100"), "different toolchains"),
             "no provenance": (json.dumps(results[1]), "does not say which generated code")}
    first = tmp_path / "s0.json"
    first.write_text(_shard_json(results[0]))
    for name, (text, message) in cases.items():
        second = tmp_path / f"{name}.json"
        second.write_text(text)
        assert cli.main([*base, str(first), str(second)]) != 0, name
        assert message in capsys.readouterr().err, name
    second = tmp_path / "s1.json"
    second.write_text(_shard_json(results[1]))
    assert cli.main([*base, str(first), str(second)]) == 0


def _shard_json(results: list[dict], generated: str | None = None, device: str = "NVIDIA H200") -> str:
    """What `opgen bench --shard K/N --json F` writes on this tree."""
    from opgen.evidence.compare import generated_hash

    generated = generated or generated_hash(ROOT, "chunk_gla_fwd_o_gk")
    return json.dumps(dict(op="chunk_gla_fwd_o_gk", generated=generated,
                           toolchain={"triton": "3.6.0", "device": device}, results=results))


def test_bench_table_reports_the_writing_flush_beside_the_reading_one():
    """Cases measured under both flushes get a summary line of the write-flush protocol too."""
    from opgen.evidence.compare import CaseResult, table

    both = CaseResult("B1-a", 1.0, 2.0, 0.5, 1e-3, 2e-3, 0.1, 20.0, 40.0, 60.0, 1.25, 2.0)
    read_only = CaseResult("B1-b", 1.0, 1.0, 0.5, 1e-3, 2e-3, 0.1, 20.0, 40.0, 60.0)
    lines = table([both, read_only], "fla").splitlines()
    assert lines[-2].startswith("geomean speedup 1.414x")
    assert lines[-1] == ("write-flush timing (the flush zero-fills), 1 cases: geomean speedup "
                         "1.600x, fraction of the memory floor ours 0.400, fla 0.250")
    assert table([read_only], "fla").splitlines()[-1].startswith("geomean speedup 1.000x")
