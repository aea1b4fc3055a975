"""opgen report: the markdown page and its PNGs of an op on a chip, written from the repository's
committed files alone; each figure checked against a value computed here from its source file."""
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from opgen.cli import main as cli
from opgen.spec.hardware import profile
from opgen.evidence.review_data import Study, studies_from_storage
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
OPS = ("chunk_gla_fwd_o_gk", "mamba3_mimo_bwd_fwd")
SECTIONS = ("## Speed against", "## Error against the float64 golden", "## Budget headroom of the frozen choices",
            "## Tuning history", "## Tests")


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Both ops' pages, written once: op -> (folder, markdown)."""
    out = {}
    for op in OPS:
        folder = tmp_path_factory.mktemp(op)
        assert cli.main(["--root", str(ROOT), "report", op, "--chip", "h200", "--out", str(folder)]) == 0
        out[op] = folder, (folder / f"{op}-h200.md").read_text(encoding="utf-8")
    return out


def _runs(op: str) -> list[dict]:
    return yaml.safe_load((ROOT / "benchmarks" / "runs.yaml").read_text())["h200"][op]["bench"]


@pytest.mark.parametrize("op", OPS)
def test_report_writes_the_page_and_its_pngs_from_the_repos_files(pages, op):
    folder, page = pages[op]
    for section in SECTIONS:
        assert section in page, section
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert images and sorted(images) == sorted(p.name for p in folder.glob("*.png"))
    for name in images:
        data = (folder / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000, name
    assert "Hardware: chip profile `h200`" in page and "NVIDIA H200" in page


@pytest.mark.parametrize("op", OPS)
def test_speed_and_error_figures_are_those_of_the_bench_json(pages, op):
    _, page = pages[op]
    for run in _runs(op):
        results = [r for f in run["json"] for r in json.loads((ROOT / "benchmarks" / f).read_text())["results"]]
        speed = [r["base_ms"] / r["ours_ms"] for r in results]
        geomean = math.exp(sum(map(math.log, speed)) / len(speed))
        no_worse = sum(r["ours_err"] <= r["base_err"] for r in results)
        generated = json.loads((ROOT / "benchmarks" / run["json"][0]).read_text())["generated"]
        assert (f"| {geomean:.3f}x | {min(speed):.3f}x "
                f"({min(results, key=lambda r: r['base_ms'] / r['ours_ms'])['case']}) | "
                f"{sum(s >= 1.2 for s in speed)}/{len(speed)} |") in page
        assert f"ours no worse on {no_worse}/{len(results)} cases" in page
        assert f"generated code {generated} (`generated/{op}/` of commit {run['commit']})" in page
        assert f"Reproduce (on a checkout of commit {run['commit']}): `{' '.join(run['command'].split())}`" in page
    if op == "chunk_gla_fwd_o_gk":  # the committed table's own summary line, for the bench_fla run
        text = (ROOT / "benchmarks" / "h200_chunk_gla_fwd_o_gk_vs_fla.txt").read_text()
        found = re.search(r"geomean speedup ([\d.]+x), min ([\d.]+x) \((\S+)\), >=1\.2x on (\d+/\d+)", text)
        assert found, "the table has no summary line"
        assert f"| {found[1]} | {found[2]} ({found[3]}) | {found[4]} |" in page


@pytest.mark.parametrize("op", OPS)
def test_headroom_shows_every_tuned_row_of_the_frozen_table(pages, op):
    _, page = pages[op]
    path = ROOT / "generated" / op / "table_h200.py"  # the module alone, not its package (it imports triton)
    table = importlib.util.module_from_spec(importlib.util.spec_from_file_location("table_h200", path))
    table.__loader__.exec_module(table)
    rows = re.findall(r"^\| (\S+) [^|]*\| (tuned|filled|default) \| [^|]+ \| (\d+) \| [^|]+ \| (\d+) \|", page, re.M)
    assert sum(row == "tuned" for _, row, _, _ in rows) == len(table.TUNED)
    assert rows and all(int(limit) == table.BUDGET and int(used) <= table.BUDGET for _, _, used, limit in rows)
    if not table.TUNED:  # every benchmark case runs the spec's default: shown once per bucket
        assert "holds no tuned row" in page and {row for _, row, _, _ in rows} == {"default"}


@pytest.mark.parametrize("op", OPS)
def test_history_and_tests_count_what_the_files_hold(pages, op):
    _, page = pages[op]
    trials = [json.loads(line) for line in (ROOT / "records" / "h200" / f"{op}.jsonl").read_text().splitlines()
              if line.strip()]
    searched = [t for t in trials if t["kind"] == "trial" and t["trial"] >= 0]
    assert f"{len(searched)} trials ({sum(t['status'] == 'ok' for t in searched)} with a time)" in page
    assert "No optuna storage is committed" in page
    numerics = ROOT / "tests" / "numerics" / f"test_{op}.py"
    assert f"| `tests/numerics/test_{op}.py` | {numerics.read_text().count(chr(10) + 'def test_')} |" in page
    assert "| `tests/test_report_page.py` |" in page  # this file names both ops


def test_report_refuses_an_unknown_op_or_chip_or_a_chip_without_data(tmp_path, capsys):
    base = ["--root", str(ROOT), "report"]
    assert cli.main([*base, "no_such_op", "--chip", "h200", "--out", str(tmp_path)]) == 2
    assert "'no_such_op' is not an op" in capsys.readouterr().err
    assert cli.main([*base, "chunk_gla_fwd_o_gk", "--chip", "h900", "--out", str(tmp_path)]) == 2
    assert "unknown chip 'h900'" in capsys.readouterr().err
    assert cli.main([*base, "chunk_gla_fwd_o_gk", "--chip", "ascend910b3", "--out", str(tmp_path)]) == 2
    assert "nothing to report for chunk_gla_fwd_o_gk on ascend910b3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse's refusal, before any work
        cli.main([*base, "chunk_gla_fwd_o_gk", "--chip", "h200", "--storage", str(tmp_path / "none.journal"),
                  "--out", str(tmp_path)])
    assert refused.value.code == 2 and "argument --storage: no such file" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_history_from_an_optuna_storage_follows_trial_numbers(tmp_path):
    import optuna

    from opgen.tune.campaign import open_storage

    spec = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
    journal = str(tmp_path / "h200-gla.journal")
    storage = open_storage(journal)
    name = "chunk_gla_fwd_o_gk|fold_general_tiled|bfloat16,64,False,False,3,3,1|h200|triton=3.6.0|kernel=sha256:0"
    study = optuna.create_study(study_name=name, storage=storage, direction="minimize")
    for value in (0.3, None, 0.2, 0.25):
        trial = study.ask()
        study.tell(trial, value, state=optuna.trial.TrialState.FAIL if value is None else None)
    optuna.create_study(study_name="other_op|v|k|h200|t", storage=storage)
    found = studies_from_storage(spec, profile("h200"), journal, {"fold_general_tiled": "sha256:1"})
    assert [(s.variant, s.medians, s.best_so_far, s.current) for s in found] == [
        ("fold_general_tiled", (0.3, None, 0.2, 0.25), [0.3, 0.3, 0.2, 0.2], False)]
    assert Study("s", "v", "b", True, (None, 2.0, 1.0)).best_so_far == [None, 2.0, 1.0]


def test_bench_runs_refuse_an_index_that_does_not_match_its_json(tmp_path):
    """runs.yaml names a run's baseline and case set; a JSON saying otherwise, or an entry without
    its files, is an error naming the file."""
    from opgen.errors import OpgenError
    from opgen.evidence.review_data import bench_runs

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    logs = tmp_path / "benchmarks" / "logs"
    logs.mkdir(parents=True)
    shard = json.loads((ROOT / "benchmarks" / "runs" / "h200_mamba3_vs_tilelang_official_d3667de.json").read_text())
    (logs / "run.json").write_text(json.dumps(dict(shard, baseline="other")))
    index = {"h200": {spec.op: {"bench": [{"baseline": "tilelang", "cases": "official", "json": ["logs/run.json"]}]}}}
    (tmp_path / "benchmarks" / "runs.yaml").write_text(yaml.safe_dump(index))
    with pytest.raises(OpgenError, match="run.json: baseline 'other'"):
        bench_runs(tmp_path, spec, profile("h200"))
    index["h200"][spec.op]["bench"][0]["baseline"] = "fla"
    (tmp_path / "benchmarks" / "runs.yaml").write_text(yaml.safe_dump(index))
    with pytest.raises(OpgenError, match="baseline 'fla' and case set 'official' must be among the spec's"):
        bench_runs(tmp_path, spec, profile("h200"))
    index["h200"][spec.op]["bench"][0]["baseline"] = "tilelang"
    index["h200"][spec.op]["bench"][0].pop("json")
    (tmp_path / "benchmarks" / "runs.yaml").write_text(yaml.safe_dump(index))
    with pytest.raises(OpgenError, match=r"bench\[0\]: missing json"):
        bench_runs(tmp_path, spec, profile("h200"))
    (logs / "run.json").write_text(json.dumps(dict(shard, results=shard["results"][:3])))
    index["h200"][spec.op]["bench"][0]["json"] = ["logs/run.json"]
    (tmp_path / "benchmarks" / "runs.yaml").write_text(yaml.safe_dump(index))
    with pytest.raises(OpgenError, match="returned no result for"):
        bench_runs(tmp_path, spec, profile("h200"))


def test_bench_runs_join_the_cases_an_entrys_where_keeps(tmp_path):
    """An entry with ``where`` joins a JSON holding only the cases its formula passes, and its page
    names the formula; a JSON written under another formula is refused."""
    from opgen.errors import OpgenError
    from opgen.evidence.review_data import bench_runs

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    logs = tmp_path / "benchmarks" / "logs"
    logs.mkdir(parents=True)
    shard = json.loads((ROOT / "benchmarks" / "runs" / "h200_mamba3_vs_tilelang_official_d3667de.json").read_text())
    kept = [r for r, row in zip(shard["results"], spec.expand_cases("official")) if row["R"] == 4]
    assert 0 < len(kept) < len(shard["results"])
    (logs / "run.json").write_text(json.dumps(dict(shard, results=kept, where="R == 4")))
    entry = {"baseline": "tilelang", "cases": "official", "where": "R == 4", "json": ["logs/run.json"]}
    (tmp_path / "benchmarks" / "runs.yaml").write_text(yaml.safe_dump({"h200": {spec.op: {"bench": [entry]}}}))
    (run,) = bench_runs(tmp_path, spec, profile("h200"))
    assert [r.case for r in run.results] == [r["case"] for r in kept]
    assert run.case_set == "official where R == 4"
    entry["where"] = "R >= 4"
    (tmp_path / "benchmarks" / "runs.yaml").write_text(yaml.safe_dump({"h200": {spec.op: {"bench": [entry]}}}))
    with pytest.raises(OpgenError, match="run.json: where 'R == 4'"):
        bench_runs(tmp_path, spec, profile("h200"))
