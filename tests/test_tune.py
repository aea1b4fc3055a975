"""The tuner on the CPU interpreter, end to end, with a toy op whose variants misbehave on purpose:
a crashing, a hanging and a wrong-result configuration are each recorded with their status while
the campaign completes; a killed campaign resumes without losing or re-measuring anything; the
frozen table is deterministic; a record whose kernel changed is reported stale, not frozen."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).resolve().parent / "toy_project"
RECORDS = Path("records/interpreter/toy_op.jsonl")
BUCKET_TEXT = {0: "N <= 64", 1: "N in (64, 4096]", 2: "N > 4096"}  # the toy key's buckets, as printed


def _project(tmp: Path) -> Path:
    shutil.copytree(TOY, tmp, dirs_exist_ok=True)
    _opgen(tmp, "build")
    return tmp


def _opgen(root: Path, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # the tuner sets it for the interpreter chip itself
    result = subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(root), *args],
                            cwd=root, env=env, capture_output=True, text=True, timeout=300, **kw)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def _tune(root: Path, *extra: str) -> subprocess.CompletedProcess:
    return _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "smoke", "--warmup", "1",
                  "--repeat", "2", "--no-progress", "--date", "2026-11-30", *extra)


def _records(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / RECORDS).read_text().splitlines()]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = _project(tmp_path_factory.mktemp("toy"))
    out = _tune(root, "--point-timeout", "4")
    return root, out


SEARCH = ("--exhaustive-below", "0", "--trials", "2", "--point-timeout", "30")  # two trials of optuna's
GOOD = ("--variants", "good", *SEARCH)  # the correct variant alone
# every correct point ties (then the smaller estimate, then the name wins): the same winner
# whatever the interpreter's timings
TIED = ("--tie-margin", "100")


@pytest.fixture(scope="module")
def tuned_good(tmp_path_factory):
    """The toy project after a campaign of ``GOOD`` on the smoke cases; each test that goes on
    from there takes a copy of it (``_copy``)."""
    root = _project(tmp_path_factory.mktemp("good"))
    _tune(root, *GOOD, *TIED)
    return root


def _copy(root: Path, tmp: Path) -> Path:
    shutil.copytree(root, tmp / "copy")
    return tmp / "copy"


def test_faulty_configs_are_recorded_and_the_campaign_completes(tuned):
    root, out = tuned
    trials = [r for r in _records(root) if r["kind"] == "trial"]
    status = {}
    for r in trials:
        status.setdefault(r["variant"], set()).add(r["status"])
    assert status == {"good": {"ok"}, "crash": {"crash"}, "hang": {"timeout"}, "wrong": {"wrong_result"}}
    # every feasible point of every variant was measured: BLOCK 16, 32, 64 (128 > pow2(N) is cut)
    for variant in status:
        assert sorted(r["point"]["BLOCK"] for r in trials if r["variant"] == variant) == [16, 32, 64]
    reasons = {r["variant"]: r["reason"] for r in trials}
    assert "worker process died" in reasons["crash"]
    assert "no result after 4 s" in reasons["hang"]
    assert "rel_l2=5.000e-01" in reasons["wrong"]
    winners = [r for r in _records(root) if r["kind"] == "winner"]
    assert len(winners) == 1 and winners[0]["variant"] == "good" and winners[0]["key"] == [0]
    assert {r["flush"] for r in _records(root)} == {"read"}  # the protocol each time was taken under
    assert "good" in out.stdout


def test_frozen_table_is_deterministic_and_stale_records_are_reported(tuned, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(tuned[0], root)
    _opgen(root, "build")
    table = root / "generated" / "toy_op" / "table_interpreter.py"
    first = table.read_text()
    name = re.search(r'\(0,\): "(good/[0-9a-f]{6})"', first).group(1)  # named by its tunables' digest
    assert f'"{name}": ("good", {{' in first and "1 tuned rows" in first
    _opgen(root, "build")
    assert table.read_text() == first
    assert _opgen(root, "build", "--check").returncode == 0
    template = root / "templates" / "toy_op" / "kernel.py.j2"
    template.write_text(template.read_text().replace("* 2.0, mask=mask)", "* 2.0 + 0.0, mask=mask)"))
    assert _opgen(root, "build", "--check", check=False).returncode == 1
    _opgen(root, "build")
    stale = table.read_text()
    assert "0 tuned rows" in stale and "1 stale records not frozen" in stale
    assert "# stale, not frozen: good at (0,)" in stale and "(0,): (" not in stale


def test_dry_run_counts_what_the_budget_and_constraints_cut(tmp_path):
    root = _project(tmp_path)
    out = _opgen(root, "tune", "toy_op", "--chip", "ascend910b3", "--cases", "smoke", "--dry-run").stdout
    lines = out.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("bucket ")))
    assert lines[first] == f"bucket {BUCKET_TEXT[0]}"  # the values the bucket stands for
    row = next(line for line in lines[first:] if line.split()[:1] == ["good"])
    # 4 BLOCK x 2 multibuffer; BLOCK=128 > pow2(50) cut by the constraint twice; all fit the UB
    assert row.split()[1:7] == ["8", "0", "2", "0", "6", "1"]  # ... feasible on all of the bucket's 1 case
    assert out.rstrip().endswith("feasible: the points that fit every case of the bucket (the ones searched)")
    assert "BLOCK <= max(16, pow2(N)) x2" in row


def test_case_keeps_the_named_cases_of_the_set_and_names_an_unknown_one(tmp_path):
    root = _project(tmp_path)
    both = _opgen(root, "tune", "toy_op", "--chip", "ascend910b3", "--cases", "two", "--dry-run").stdout
    one = _opgen(root, "tune", "toy_op", "--chip", "ascend910b3", "--cases", "two", "--case", "N3000-fp32",
                 "--dry-run").stdout
    assert both.count("\nbucket ") == 2 and one.count("\nbucket ") == 1
    assert f"bucket {BUCKET_TEXT[0]}" in both and f"bucket {BUCKET_TEXT[0]}" not in one
    bad = _opgen(root, "tune", "toy_op", "--chip", "ascend910b3", "--cases", "two", "--case", "N51-fp32",
                 "--dry-run", check=False)
    assert bad.returncode != 0 and "--case N51-fp32: no such case in case set 'two'" in bad.stderr
    assert "N3000-fp32, N50-fp32" in bad.stderr


def test_resume_after_kill_loses_nothing_and_measures_nothing_twice(tmp_path):
    root = _project(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    args = [sys.executable, "-m", "opgen.cli", "--root", str(root), "tune", "toy_op", "--chip",
            "interpreter", "--cases", "smoke", "--variants", "good,hang", "--warmup", "1", "--repeat", "2",
            "--no-progress", "--date", "2026-11-30"]
    proc = subprocess.Popen([*args, "--point-timeout", "120"], cwd=root, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = root / RECORDS
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the good study is done once its 3 trials are recorded
        if path.exists() and len(path.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # now inside the hanging variant's first point
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _records(root)
    assert [r["variant"] for r in before] == ["good"] * 3
    _tune(root, "--variants", "good,hang", "--point-timeout", "3")
    after = _records(root)
    assert after[:3] == before  # nothing lost
    good = [r for r in after if r["kind"] == "trial" and r["variant"] == "good"]
    assert len(good) == 3  # nothing measured twice
    hang = [r for r in after if r["kind"] == "trial" and r["variant"] == "hang"]
    assert sorted(r["point"]["BLOCK"] for r in hang) == [16, 32, 64] and {r["status"] for r in hang} == {"timeout"}
    assert [r["variant"] for r in after if r["kind"] == "winner"] == ["good"]


def test_a_longer_point_timeout_measures_the_timed_out_points_again(tmp_path):
    """A timeout depends on the limit it ran under: a rerun under the same limit measures nothing,
    one under a longer limit measures the timed-out points again (and only once)."""
    root = _project(tmp_path)
    _tune(root, "--variants", "hang", "--point-timeout", "1")
    first = _records(root)
    assert len(first) == 3 and {r["reason"] for r in first} == {"no result after 1 s"}
    _tune(root, "--variants", "hang", "--point-timeout", "1")
    assert _records(root) == first
    _tune(root, "--variants", "hang", "--point-timeout", "1.5")
    again = _records(root)[3:]
    assert sorted(r["point"]["BLOCK"] for r in again) == [16, 32, 64]
    assert {r["reason"] for r in again} == {"no result after 1.5 s"}
    _tune(root, "--variants", "hang", "--point-timeout", "1.5")
    assert len(_records(root)) == 6


def test_timed_out_under_reads_the_attribute_or_the_reason():
    from opgen.tune.tune import timed_out_under

    assert timed_out_under({"status": ["ok"], "reason": [""]}) == float("inf")
    assert timed_out_under({"status": ["ok", "timeout"], "reason": ["", "no result after 20 s"]}) == 20.0
    assert timed_out_under({"status": ["timeout"], "reason": ["no result after 20 s"], "point_timeout": 60}) == 60.0
    assert timed_out_under({"status": ["timeout"], "reason": ["killed"]}) == float("inf")


def test_parallel_compile_workers_record_the_same_statuses(tmp_path):
    """The campaign of ``tuned`` with two compile workers, less the hanging variant: a pool worker
    is the tuner's one Worker class, whose timeout ``tuned`` meets for real, and a timeout among
    the compile workers is retried alone (test_a_timeout_among_parallel_compiles_is_retried_...)."""
    root = _project(tmp_path)
    _tune(root, "--point-timeout", "4", "--compile-workers", "2", "--variants", "good,crash,wrong")
    trials = [r for r in _records(root) if r["kind"] == "trial"]
    status = {}
    for r in trials:
        status.setdefault(r["variant"], set()).add(r["status"])
    assert status == {"good": {"ok"}, "crash": {"crash"}, "wrong": {"wrong_result"}}
    assert all(r["median_ms"] is not None for r in trials if r["status"] == "ok")
    assert len(trials) == 9 and [r["variant"] for r in _records(root) if r["kind"] == "winner"] == ["good"]


def test_cross_check_measures_each_bucket_against_its_leave_one_out_fill(tmp_path):
    root = _project(tmp_path)
    out = _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "two", "--variants", "good",
                 "--warmup", "1", "--repeat", "2", "--no-progress", "--point-timeout", "30",
                 "--cross-check", "--cross-margin", "0.5").stdout
    winners = [r for r in _records(root) if r["kind"] == "winner"]
    assert sorted(r["key"] for r in winners) == [[0], [1]]
    table = out[out.index("fill from"):].splitlines()
    # each bucket by the shapes it stands for, then its own time, the fill's and where it is from
    assert table[1] == BUCKET_TEXT[0] + ":" and "from (1,)" in table[2]
    assert table[3] == BUCKET_TEXT[1] + ":" and "from (0,)" in table[4]
    assert table[5].startswith(("ok: worst leave-one-out loss", "FLAGGED: worst leave-one-out loss"))
    assert "(margin 50%)" in table[5] and any(BUCKET_TEXT[k] in table[5] for k in (0, 1))
    # the end-of-campaign summary names each bucket the same way, its winner on the next line
    lines = out.splitlines()
    assert lines[lines.index(BUCKET_TEXT[1] + ":") + 1].split()[0] == "good"
    # the checks are records, and the build states them in the table: a loss over the margin flags it
    checks = [r for r in _records(root) if r["kind"] == "cross_check"]
    assert sorted(c["key"] for c in checks) == [[0], [1]] and {c["margin"] for c in checks} == {0.5}
    assert {c["fill_from"] for c in checks} == {"from (0,)", "from (1,)"}
    _opgen(root, "build")
    generated = root / "generated" / "toy_op" / "table_interpreter.py"
    assert "Cross-check: 2 of 2 tuned rows checked against their leave-one-out fill; worst loss" in " ".join(generated.read_text().split())
    result = _opgen(root, "records", "toy_op", "--chip", "interpreter", check=False)
    # the fill gate's verdict rests on interpreter timings: exit 1 exactly when it names a lost bucket
    assert result.returncode == (1 if "\nERROR: " in result.stdout else 0), result.stderr[-3000:]
    report = result.stdout.splitlines()
    trials = [r for r in _records(root) if r["kind"] == "trial"]
    for key in (0, 1):
        row = report[report.index(BUCKET_TEXT[key]) + 1]
        ok = sum(1 for r in trials if r["key"] == [key] and r["status"] == "ok")
        assert " good " in row and row.endswith(f"  {ok} ok") and "%" in row
    gate = next(i for i, line in enumerate(report) if line.startswith("Fill rule: "))  # the fill gate's lines close it
    assert report[gate - 2].startswith("Cross-check: 2 of 2 tuned rows checked")
    assert report[gate - 1].startswith("Measured under ") and report[gate - 1].endswith(": 2 tuned rows.")
    lines = (root / RECORDS).read_text().splitlines()
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec["kind"] == "cross_check" and rec["key"] == [1]:
            lines[i] = json.dumps({**rec, "fill_ms": rec["own_ms"] * 3})
    (root / RECORDS).write_text("\n".join(lines) + "\n")
    _opgen(root, "build")
    assert "worst loss 200.0% at (1,) (margin 50%): FLAGGED." in " ".join(generated.read_text().split())  # docstring lines wrap


def test_stored_points_compete_when_a_campaign_is_narrower_or_out_of_time(tuned_good, tmp_path):
    """Searching one variant again must not displace a better variant searched before (the other
    variants' studies of the bucket compete with what they hold: here the only correct one), a
    campaign out of time measures nothing new but still chooses from every study's stored points,
    and without the journal the frozen winner is measured again and kept."""
    root = _copy(tuned_good, tmp_path)  # good searched, with TIED
    args = (*SEARCH, *TIED)
    _tune(root, "--variants", "wrong", *args)
    trials = [r for r in _records(root) if r["kind"] == "trial"]
    assert {r["variant"] for r in trials} == {"good", "wrong"}
    assert all(r["status"] == "wrong_result" for r in trials if r["variant"] == "wrong")
    _tune(root, "--variants", "good", *args, "--campaign-seconds", "0")
    assert len([r for r in _records(root) if r["kind"] == "trial"]) == len(trials)  # nothing searched
    winners = [r for r in _records(root) if r["kind"] == "winner"]
    assert [w["variant"] for w in winners] == ["good"] * 3
    assert winners[2]["point"] == winners[0]["point"] and winners[2]["study"] == winners[0]["study"]
    # a fresh checkout has the records but no journal: the standing winner is measured again
    (root / ".tune" / "interpreter-toy_op.journal").unlink()
    _tune(root, "--variants", "wrong", *args, "--campaign-seconds", "0")
    winners = [r for r in _records(root) if r["kind"] == "winner"]
    assert len(winners) == 4 and winners[3]["point"] == winners[0]["point"]
    assert list(winners[3]["remeasured_ms"]) == [f"good:BLOCK={winners[0]['point']['BLOCK']}"]
    recheck = [r for r in _records(root) if r["kind"] == "trial"][-1]  # recorded, outside the search
    assert (recheck["trial"], recheck["study"], recheck["status"]) == (-1, winners[0]["study"], "ok")


def test_an_unknown_variant_is_an_error_that_names_it(capsys):
    from opgen.cli import main as cli

    argv = ["--root", str(ROOT), "tune", "chunk_gla_fwd_o_gk", "--chip", "h200", "--cases", "bench_fla",
            "--variants", "fold_general_tiled,fold_genral_tiled", "--dry-run"]
    assert cli.main(argv) != 0
    err = capsys.readouterr().err
    assert "no variant fold_genral_tiled on h200" in err and "known: fold_general_tiled," in err


def test_an_edited_kernel_starts_a_new_study_and_the_cross_check_skips_stale_winners(tmp_path):
    """Timings and wrong results of the old kernel say nothing about the new one: its study is
    measured afresh. The other bucket's winner is stale now: the build would not freeze it, so
    the cross-check does not fill from it either (it measures the spec's default instead)."""
    root = _project(tmp_path)
    args = ("--variants", "good", "--exhaustive-below", "0", "--trials", "2", "--point-timeout", "30")
    _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "two", "--warmup", "1", "--repeat", "2",
           "--no-progress", *args)
    template = next((root / "templates").glob("toy_op/*.j2"))
    template.write_text(template.read_text() + "# edited\n")
    _opgen(root, "build")
    out = _tune(root, *args, "--cross-check").stdout
    table = out[out.index("fill from"):].splitlines()
    assert table[1] == BUCKET_TEXT[0] + ":" and "from (1,)" not in table[2]
    _opgen(root, "build")
    table_text = (root / "generated" / "toy_op" / "table_interpreter.py").read_text()
    assert "stale" in table_text and "Cross-check: 1 of 1 tuned rows checked" in table_text
    winners = [r for r in _records(root) if r["kind"] == "winner" and r["key"] == [0]]
    assert len(winners) == 2 and winners[0]["study"] != winners[1]["study"]
    assert winners[0]["study"].split("|kernel=")[0] == winners[1]["study"].split("|kernel=")[0]
    assert winners[1]["kernel_hash"] != winners[0]["kernel_hash"]
    assert winners[1]["study"].endswith("|kernel=" + winners[1]["kernel_hash"])
    trials = [r for r in _records(root) if r["kind"] == "trial"]
    assert len([r for r in trials if r["study"] == winners[1]["study"]]) == 2


def test_a_changed_domain_starts_a_new_study_instead_of_failing(tuned_good, tmp_path):
    """optuna cannot resume a study whose categorical choices changed (TPE refuses the new space):
    the study's identity carries a digest of its domains, so the edited spec tunes afresh."""
    root = _copy(tuned_good, tmp_path)
    spec = root / "specs" / "toy_op.yaml"
    spec.write_text(spec.read_text().replace("npu: [16, 32, 64, 128]", "npu: [16, 32, 128]"))
    _opgen(root, "build")
    _tune(root, *GOOD)
    winners = [r for r in _records(root) if r["kind"] == "winner"]
    assert len(winners) == 2 and winners[0]["study"] != winners[1]["study"]
    assert winners[0]["study"].split("|space=")[0] == winners[1]["study"].split("|space=")[0]
    trials = [r for r in _records(root) if r["kind"] == "trial"]
    assert {r["point"]["BLOCK"] for r in trials if r["study"] == winners[1]["study"]} <= {16, 32}


def test_other_cases_of_a_bucket_start_a_new_study(tuned_good, tmp_path):
    """A study's objective is its geomean over the bucket's cases: resuming it on other cases would
    rank points measured on different inputs against each other."""
    root = _copy(tuned_good, tmp_path)  # tuned on the smoke cases
    spec = root / "specs" / "toy_op.yaml"
    spec.write_text(spec.read_text().replace("  two:\n", "  smoke_wider:\n    - {N: 50, dtype: float32}\n"
                                             "    - {N: 40, dtype: float32}\n  two:\n"))
    _opgen(root, "build")
    _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "smoke_wider", "--warmup", "1",
           "--repeat", "2", "--no-progress", "--date", "2026-11-30", *GOOD)
    winners = [r for r in _records(root) if r["kind"] == "winner"]
    assert [w["key"] for w in winners] == [[0], [0]]
    assert winners[0]["kernel_hash"] == winners[1]["kernel_hash"]  # the same kernel: only the cases differ
    assert winners[0]["study"].split("|cases=")[0] == winners[1]["study"].split("|cases=")[0]
    assert winners[0]["study"] != winners[1]["study"]
    studies = {w["study"]: [r for r in _records(root) if r["kind"] == "trial" and r["study"] == w["study"]]
               for w in winners}
    assert all(len(trials) >= 1 for trials in studies.values())  # the second study measured afresh


def test_an_earlier_winner_seeds_the_study_after_a_tunable_is_added_and_the_edges_move(tuned_good, tmp_path):
    """Adding a tunable changes every point, and a new edge moves the tuned case to another key:
    the earlier winner, looked up by the case it was tuned on and completed with the new tunable's
    default, is still measured first, beside the spec's default."""
    root = _copy(tuned_good, tmp_path)
    first = [r for r in _records(root) if r["kind"] == "winner"][0]
    won = first["point"]["BLOCK"]
    default = 32 if won == 16 else 16
    spec = root / "specs" / "toy_op.yaml"
    text = spec.read_text()
    text = text.replace("  multibuffer: {role: launch,", "  EXTRA: {role: constexpr, domain: {npu: [1, 2, 3]}}\n"
                                                          "  multibuffer: {role: launch,")
    text = text.replace('npu: {MODE: "\'good\'", BLOCK: "16",', 'npu: {MODE: "\'good\'", BLOCK: "16", EXTRA: "2",')
    text = text.replace('interpreter: {MODE: "\'good\'", BLOCK: "16"}',
                        f'interpreter: {{MODE: "\'good\'", BLOCK: "{default}", EXTRA: "2"}}')
    text = text.replace("buckets: [64, 4096]", "buckets: [2, 64, 4096]")
    assert text.count("EXTRA") == 3 and "[2, 64, 4096]" in text
    spec.write_text(text)
    from opgen.tune.campaign import earlier_winners
    from opgen.storage.records import read
    from opgen.spec.spec import load_spec

    earlier = earlier_winners(load_spec(spec, root), read(root / RECORDS, op="toy_op", chip="interpreter").records)
    assert list(earlier) == [(1,)] and [p.config["BLOCK"] for p in earlier[(1,)]] == [won]
    _opgen(root, "build")
    _tune(root, *GOOD)
    second = [r for r in _records(root) if r["kind"] == "winner"][1]
    assert second["key"] == [1] != first["key"]
    trials = [r["point"] for r in _records(root) if r["kind"] == "trial" and r["study"] == second["study"]]
    assert sorted((t["BLOCK"], t["EXTRA"]) for t in trials) == sorted([(default, 2), (won, 2)])


def test_a_bucket_tuned_first_starts_from_its_neighbours_winner(tuned_good, tmp_path):
    """A bucket without winners of its own is seeded with the row the table fills it with from
    the nearest tuned bucket, beside the spec's default."""
    root = _copy(tuned_good, tmp_path)
    won = [r for r in _records(root) if r["kind"] == "winner"][0]["point"]["BLOCK"]
    default = 32 if won == 16 else 16
    spec = root / "specs" / "toy_op.yaml"
    spec.write_text(spec.read_text().replace('interpreter: {MODE: "\'good\'", BLOCK: "16"}',
                                             f'interpreter: {{MODE: "\'good\'", BLOCK: "{default}"}}'))
    _opgen(root, "build")
    from opgen.tune.campaign import open_campaign
    from opgen.spec.hardware import profile
    from opgen.spec.spec import load_spec
    from opgen.tune.tune import Settings

    toy, chip = load_spec(spec, root), profile("interpreter")
    _, earlier, standing = open_campaign(root, toy, chip, None, str(tmp_path / "j.journal"), Settings(),
                                         root / RECORDS, "2026-11-30", progress=False)
    assert {k: [p.config["BLOCK"] for p in ps] for k, ps in earlier.items()} == {(0,): [won], (1,): [won], (2,): [won]}
    assert {k: (p.variant, p.config) for k, p in standing.items()} == {(0,): ("good", {"BLOCK": won})}
    _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "two", "--warmup", "1", "--repeat", "2",
           "--no-progress", *GOOD)
    new = [r for r in _records(root) if r["kind"] == "winner" and r["key"] == [1]][0]
    trials = [r["point"]["BLOCK"] for r in _records(root) if r["kind"] == "trial" and r["study"] == new["study"]]
    assert sorted(trials) == sorted([default, won])


def test_a_timeout_among_parallel_compiles_is_retried_alone_other_failures_are_final():
    """The compile workers share the host and the device: a point that timed out or ran out of
    device memory among them is measured again alone (after an out-of-memory, with the pool's
    workers stopped, so their cases no longer fill the device); a crash or a wrong result there is
    final (not measured twice)."""
    from opgen.tune import tune
    from opgen.space.space import Point
    from opgen.run.worker import Result

    parallel = {"slow": "timeout", "hang": "timeout", "crash": "crash", "fine": "ok", "big": "crash",
                "huge": "crash"}
    alone = {"slow": "ok", "hang": "timeout", "fine": "ok", "big": "ok", "huge": "crash"}
    oom = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    serial_calls = []
    closed = []

    class Pool:
        def start(self):  # the real workers start their process from the compiling thread
            pass

        def close(self):  # frees the device memory of the cases it keeps
            closed.append(list(serial_calls))

        def run(self, task, timeout):
            name, timed = task
            assert not timed and timeout == 7.0
            reason = {"timeout": "no result after 7 s", "crash": oom if name in ("big", "huge") else "Boom"}
            return Result(parallel[name], reason=reason.get(parallel[name], ""))

    class Alone:
        def run(self, task, timeout):
            name, timed = task
            serial_calls.append(name)
            status = alone[name]
            return Result(status, median_ms=1.0 if status == "ok" else None, reason=oom if status == "crash" else "")

    campaign = tune.Campaign.__new__(tune.Campaign)
    campaign.pool, campaign.worker = [Pool(), Pool()], Alone()
    campaign.settings = tune.Settings(point_timeout=7.0, compile_workers=2)
    campaign._task = lambda point, case, timed=True, protocol=None: (point.variant, timed)
    points = [Point(name, (("BLOCK", 16),)) for name in parallel]
    bucket = tune.Bucket(key=(0,), cases=({"n": 1},), params=({},))
    measured = {m.point.variant: m for m in campaign.measure_batch(points, bucket)}
    assert serial_calls == ["slow", "hang", "fine", "big", "huge"]
    assert measured["slow"].ok and measured["fine"].ok
    assert [r.status for r in measured["hang"].results] == ["timeout"]
    assert [r.status for r in measured["crash"].results] == ["crash"]
    # out of device memory among the workers: measured again alone; alone too, a crash
    assert measured["big"].ok and [r.status for r in measured["huge"].results] == ["crash"]
    assert closed == [[], []]  # both pool workers stopped before any point ran alone


def test_a_tight_campaign_shares_its_time_over_the_studies_left():
    """Each study gets at most an equal share of what the campaign has left, so the last buckets
    are not starved; time a study leaves unused flows to the later ones."""
    from types import SimpleNamespace

    from opgen.tune import tune

    settings = tune.Settings(study_seconds=100.0)
    assert settings.study_budget(1000.0, 4) == 100.0
    assert settings.study_budget(90.0, 3) == 30.0
    assert settings.study_budget(-5.0, 2) == 0.0
    campaign = tune.Campaign.__new__(tune.Campaign)
    campaign.settings, campaign.progress, campaign.pool = settings, False, []
    campaign.spec, campaign.profile = SimpleNamespace(op="toy_op"), SimpleNamespace(name="interpreter")
    campaign.worker = SimpleNamespace(close=lambda kill=False: None)
    campaign.choose = lambda bucket, by_variant, held=None, default=None: None
    given = []
    campaign.run_study = lambda plan, enqueue, seconds: given.append((plan.variant.name, seconds)) or []
    plans = [SimpleNamespace(bucket=SimpleNamespace(key=(k,), params=({},)), variant=SimpleNamespace(name=v),
                             default=None, points=() if v == "empty" else (1,))
             for k in range(3) for v in ("a", "b", "empty")]
    campaign.deadline = time.monotonic() + 60.0
    campaign.run(plans)
    # six studies with points (an empty one counts for none), each returning at once:
    # 60 s over 6, then over 5, 4, 3, 2 and 1
    assert len(given) == 9
    assert [round(t) for v, t in given if v != "empty"] == [10, 12, 15, 20, 30, 60]


def test_the_standing_winner_competes_again_when_no_study_of_the_run_holds_it():
    """A campaign cut short, or started without the journal, must not replace a bucket's frozen
    winner with a slower point only because that winner's study did not run: the standing winner
    is measured again (check included, recorded as trial -1 of its variant's study) and joins the
    side-by-side, unless a study already holds it."""
    from types import SimpleNamespace

    from opgen.tune import tune
    from opgen.space.space import Point
    from opgen.run.worker import Result

    def pt(variant: str, block: int) -> Point:
        return Point(variant, (("BLOCK", block),))

    def measured(p: Point, ms: float = 1.0) -> tune.Measured:
        return tune.Measured(p, [Result("ok", median_ms=ms)])

    def study(plan, enqueue, seconds):
        holds = plan.bucket.key == (0,) and plan.variant.name == "fast"
        return [measured(pt(plan.variant.name, 16 if holds else 32), 5.0)]

    campaign = tune.Campaign.__new__(tune.Campaign)
    campaign.settings, campaign.progress, campaign.pool = tune.Settings(), False, []
    campaign.spec, campaign.profile = SimpleNamespace(op="toy_op"), SimpleNamespace(name="interpreter")
    campaign.worker = SimpleNamespace(close=lambda kill=False: None)
    campaign.deadline = time.monotonic() + 60.0
    campaign.run_study = study
    campaign.study_name = lambda plan: f"study of {plan.variant.name} on {plan.bucket.key}"
    again, chosen, emitted = [], {}, []
    campaign.measure_batch = lambda points_, bucket: again.append((bucket.key, points_)) or [measured(points_[0], 2.0)]
    campaign._emit_trial = lambda name, number, plan, m: emitted.append((name, number, m.point))
    campaign.choose = lambda bucket, by_variant, held=None, default=None: chosen.setdefault(bucket.key, by_variant) and None
    plans = [SimpleNamespace(bucket=SimpleNamespace(key=(k,), params=({},)), variant=SimpleNamespace(name=v),
                             default=None, points=(1,)) for k in range(3) for v in ("fast", "slow")]
    standing = {(0,): pt("fast", 16), (1,): pt("fast", 16)}
    campaign.run(plans, standing=standing)
    assert again == [((1,), [pt("fast", 16)])]  # bucket 0's study held it; bucket 2 has none
    assert list(chosen) == [(2,), (0,), (1,)]  # the bucket without a frozen winner first
    assert emitted == [("study of fast on (1,)", -1, pt("fast", 16))]
    assert [m.point for m in chosen[(1,)]["fast"]] == [pt("fast", 32), pt("fast", 16)]
    assert [m.point for m in chosen[(1,)]["slow"]] == [pt("slow", 32)]
    assert sorted(chosen[(2,)]) == ["fast", "slow"]

def test_the_default_point_runs_first_and_competes_when_its_study_had_no_time():
    """A bucket's winner must never be slower than the spec's default choice it replaces in the
    table: the study that holds the default runs first in its bucket, and a campaign out of time
    before it measures the default alone (trial -1 of its study) and hands it to the side-by-side."""
    from types import SimpleNamespace

    from opgen.tune import tune
    from opgen.space.space import Point
    from opgen.run.worker import Result

    default = Point("dflt", (("BLOCK", 16),))

    def measured(p: Point, ms: float) -> tune.Measured:
        return tune.Measured(p, [Result("ok", median_ms=ms)])

    campaign = tune.Campaign.__new__(tune.Campaign)
    campaign.settings, campaign.progress, campaign.pool = tune.Settings(), False, []
    campaign.spec, campaign.profile = SimpleNamespace(op="toy_op"), SimpleNamespace(name="interpreter")
    campaign.worker = SimpleNamespace(close=lambda kill=False: None)
    campaign.study_name = lambda plan: f"study of {plan.variant.name}"
    campaign.stored = lambda plan: []
    ran, again, emitted, chosen = [], [], [], []
    campaign.run_study = lambda plan, enqueue, seconds: (ran.append((plan.variant.name, list(enqueue))) or [
        measured(p, 2.0) for p in enqueue] + [measured(Point(plan.variant.name, (("BLOCK", 32),)), 3.0)])
    campaign.measure_batch = lambda points_, bucket: again.append(points_) or [measured(points_[0], 1.0)]
    campaign._emit_trial = lambda name, number, plan, m: emitted.append((name, number, m.point))
    campaign.choose = lambda bucket, by_variant, held=None, default=None: chosen.append((by_variant, default))
    bucket = SimpleNamespace(key=(0,), params=({},))
    plans = [SimpleNamespace(bucket=bucket, variant=SimpleNamespace(name=v), default=default if v == "dflt" else None,
                             points=(1,)) for v in ("searched", "dflt")]
    campaign.deadline = time.monotonic() + 60.0
    campaign.run(plans)
    assert ran == [("dflt", [default]), ("searched", [])]  # the default's study first, the default enqueued
    assert again == [] and chosen[-1][1] == default  # its study held it: not measured again
    ran.clear()
    campaign.deadline = time.monotonic() - 1.0  # out of time: no study runs
    campaign.run(plans)
    assert ran == [] and again == [[default]]
    assert emitted == [("study of dflt", -1, default)]
    by_variant, passed = chosen[-1]
    assert passed == default and [m.point for m in by_variant["dflt"]] == [default] and by_variant["searched"] == []


def test_cross_check_all_measures_every_other_winner_on_each_bucket(tmp_path):
    """With three winners (made distinct here, as a real campaign's would be), each bucket's own
    winner is re-measured beside both others: one record per point, the table's verdict taken
    from the one the fill rule picks."""
    root = _project(tmp_path)
    args = ("tune", "toy_op", "--chip", "interpreter", "--cases", "three", "--variants", "good", "--warmup", "1",
            "--repeat", "2", "--no-progress", "--point-timeout", "30", "--exhaustive-below", "0")
    _opgen(root, *args, "--trials", "1")
    lines = (root / RECORDS).read_text().splitlines()
    blocks = {0: 16, 1: 32, 2: 64}
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec["kind"] == "winner":
            lines[i] = json.dumps({**rec, "point": {**rec["point"], "BLOCK": blocks[rec["key"][0]]}})
    (root / RECORDS).write_text("\n".join(lines) + "\n")
    out = _opgen(root, *args, "--trials", "0", "--cross-check-all", "--cross-margin", "0.5").stdout
    assert "freeze them" not in out  # no search, so no (empty) summary of winners
    checks = [r for r in _records(root) if r["kind"] == "cross_check"]
    for key, own in blocks.items():
        mine = [c for c in checks if c["key"] == [key]]
        assert all(c["point"]["BLOCK"] == own for c in mine)
        assert sorted(c["fill_point"]["BLOCK"] for c in mine) == sorted(b for b in blocks.values() if b != own)
    # the leave-one-out fill of bucket 2 is bucket 1's winner; bucket 0's is measured beside it too
    assert {c["fill_from"] for c in checks if c["key"] == [2]} == {"from (1,)", "winner of (0,)"}
    table = out[out.index("fastest other winner there"):].splitlines()
    assert table[1:7:2] == [BUCKET_TEXT[k] + ":" for k in (0, 1, 2)]
    assert table[7].endswith("own winners beaten by another bucket's winner by more than the margin "
                             "(their searches missed it)") and table[7].split()[2] == "3"
    _opgen(root, "build")
    text = (root / "generated" / "toy_op" / "table_interpreter.py").read_text()
    assert "Cross-check: 3 of 3 tuned rows checked" in text


def test_choose_re_measures_the_held_point_beside_the_best_few(monkeypatch):
    """The standing winner joins the side-by-side even when it is not among the best few of its
    study's stored times, so the winner record always names it (and the build then lets the new
    winner replace it); a held point that failed this run does not compete."""
    from types import SimpleNamespace

    from opgen.tune import tune
    from opgen.space.space import Point
    from opgen.run.worker import Result

    pts = [Point("a", (("BLOCK", b),)) for b in (16, 32, 64, 128)]
    seen = []
    campaign = tune.Campaign.__new__(tune.Campaign)
    campaign.settings = tune.Settings(top_k=3)
    campaign.spec = SimpleNamespace()
    campaign.side_by_side = lambda points_, bucket: (seen.append(list(points_))
                                                     or {p: 1.0 + i for i, p in enumerate(points_)})
    campaign._budget = lambda *args: None
    bucket = tune.Bucket(key=(0,), cases=({"n": 1},), params=({},))
    measured = {"a": [tune.Measured(p, [Result("ok", median_ms=1.0 + i)]) for i, p in enumerate(pts)]}
    monkeypatch.setattr("opgen.tune.side_by_side.find_variant", lambda spec, name: None)
    winner = campaign.choose(bucket, measured, held=pts[3])
    assert seen[-1] == pts and "a:BLOCK=128" in winner["remeasured_ms"]
    measured["a"][3] = tune.Measured(pts[3], [Result("wrong_result", "rel_l2=1")])
    campaign.choose(bucket, measured, held=pts[3])
    assert seen[-1] == pts[:3]
    # the spec's default point joins the same way: a tuned row has always met the default it replaces
    default = Point("b", (("BLOCK", 256),))
    measured["b"] = [tune.Measured(Point("b", (("BLOCK", 8),)), [Result("ok", median_ms=0.5)]),
                     tune.Measured(Point("b", (("BLOCK", 4),)), [Result("ok", median_ms=0.6)]),
                     tune.Measured(Point("b", (("BLOCK", 2),)), [Result("ok", median_ms=0.7)]),
                     tune.Measured(default, [Result("ok", median_ms=0.9)])]
    campaign.choose(bucket, measured, default=default)
    assert default in seen[-1] and len(seen[-1]) == 7
