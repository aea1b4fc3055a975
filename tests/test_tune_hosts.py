"""Hosts sharing one tuning campaign through a real PostgreSQL server: processes standing for
hosts (each on the interpreter chip, the toy op) split the buckets between them, one killed with
SIGKILL mid-trial has its trial failed by its heartbeat and measured again by another, a server
restart stops them cleanly, and the records exported from the database freeze the table a single
process freezes. Two processes on one journal or SQLite file are refused, or (shares of one split)
work side by side."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import fresh_database

ROOT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).resolve().parent / "toy_project"
RECORDS = Path("records/interpreter/toy_op.jsonl")
TABLE = Path("generated/toy_op/table_interpreter.py")
# the campaign: two buckets (N=50: BLOCK 16..64; N=3000: BLOCK 16..128), a good and a wrong variant
TUNE = ["tune", "toy_op", "--chip", "interpreter", "--cases", "two", "--variants", "good,wrong", "--warmup", "1",
        "--repeat", "2", "--no-progress", "--date", "2026-11-30", "--point-timeout", "60",
        "--tie-margin", "100"]  # every correct point ties: the winner is the same whatever the timings
SPACE = Counter({(key, variant, block): 1 for variant in ("good", "wrong")
                 for key, blocks in ((0, (16, 32, 64)), (1, (16, 32, 64, 128))) for block in blocks})
GOOD = Counter({point: n for point, n in SPACE.items() if point[1] == "good"})  # --variants good
STATUS = {"good": "ok", "wrong": "wrong_result"}


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # the tuner sets it for the interpreter chip itself
    return env


def _project(tmp: Path) -> Path:
    shutil.copytree(TOY, tmp, dirs_exist_ok=True)
    subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(tmp), "build"], cwd=tmp, env=_env(),
                   check=True, capture_output=True, timeout=120)
    return tmp


def _start(root: Path, name: str, *args: str) -> subprocess.Popen:
    """An ``opgen`` process (a host) leading its own process group; its output goes to
    ``<root>/<name>.log``."""
    log = open(root / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "opgen.cli", "--root", str(root), *args], cwd=root, env=_env(),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, text=True)


def _output(root: Path, name: str) -> str:
    return (root / f"{name}.log").read_text()


def _host(proc: subprocess.Popen) -> str:
    """How the trials a process measures name it (``opgen.storage.db.worker_id``)."""
    return f"{socket.gethostname()}:{proc.pid}"


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _db_records(url: str) -> list:
    from opgen.storage.db_records import RecordTable

    table = RecordTable(url)
    try:
        return table.read("toy_op", "interpreter")
    finally:
        table.close()


def _measured(records: list) -> Counter:
    """How often each point of the space was measured, counted from the trial records."""
    return Counter((r.key[0], r.variant, r.point["BLOCK"]) for r in records if r.KIND == "trial")


def _table(root: Path) -> str:
    """The frozen table without what differs between two measurements of the same winners: its
    medians, the fill rule's leave-one-out paragraph (timed ratios) and the records' hash."""
    subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(root), "build"], cwd=root, env=_env(),
                   check=True, capture_output=True, timeout=120)
    text = (root / TABLE).read_text()
    text = re.sub(r"median [0-9.]+ ms", "median _ ms", text)
    text = re.sub(r"Fill rule: .*?\n(?=Cross-check:|Key:)", "Fill rule: _\n", text, flags=re.S)
    return re.sub(r"(# records .*sha256:)[0-9a-f]+", r"\1_", text)


def _kill_mid_trial(url: str, procs: list[subprocess.Popen]) -> tuple[subprocess.Popen, str, int]:
    """SIGKILL one of ``procs`` while it measures a trial: one seen running in the storage is
    stopped (SIGSTOP) and killed if its trial is still unmeasured and unrecorded, else let go on.

    Returns:
        The killed process, the study and the number of its trial.
    """
    from optuna.trial import TrialState

    from opgen.storage.db_records import RecordTable
    from opgen.storage.storage import open_storage

    storage, table = open_storage(url), RecordTable(url)
    hosts = {_host(p): p for p in procs}
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            for study in storage.get_all_studies():
                for trial in storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                    proc = hosts.get(trial.user_attrs.get("worker"))
                    if proc is None or "measured" in trial.user_attrs:
                        continue
                    os.killpg(proc.pid, signal.SIGSTOP)
                    now = storage.get_trial(trial._trial_id)
                    if (now.state == TrialState.RUNNING and "measured" not in now.user_attrs
                            and not table.trial("toy_op", "interpreter", study.study_name, trial.number)):
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        return proc, study.study_name, trial.number
                    os.killpg(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
    finally:
        table.close()
    pytest.fail("no process was seen measuring a trial")


_OPEN = ("import sys, time; from pathlib import Path; import optuna; from opgen.storage.storage import open_storage\n"
         "while not Path(sys.argv[2]).exists(): time.sleep(0.01)\n"
         "optuna.create_study(study_name='s', storage=open_storage(sys.argv[1]), load_if_exists=True)")


def test_processes_opening_a_fresh_database_together_create_its_schema_and_study_once(tmp_path, postgres_url):
    """Optuna creating its schema twice (CREATE TYPE studydirection) failed hosts started together."""
    import optuna

    from opgen.storage.storage import open_storage

    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN, postgres_url, str(go)], env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(4)]
    go.touch()  # all at once, each with optuna imported
    for proc in procs:
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, out[-3000:]
    assert optuna.study.get_all_study_names(open_storage(postgres_url)) == ["s"]


def test_three_hosts_one_killed_mid_trial_measure_every_point_once(tmp_path, postgres_url):
    from optuna.trial import TrialState

    from opgen.storage.records import read
    from opgen.storage.storage import open_storage

    root = _project(tmp_path / "hosts")
    hosts = [_start(root, f"host{i}", *TUNE, "--storage", postgres_url, "--heartbeat", "1") for i in range(3)]
    try:
        victim, study_name, number = _kill_mid_trial(postgres_url, hosts)
        rest = [p for p in hosts if p is not victim]
        for i, proc in enumerate(hosts):
            if proc is not victim:
                assert proc.wait(timeout=300) == 0, _output(root, f"host{i}")[-3000:]
    finally:
        _stop_all(hosts)
    records = _db_records(postgres_url)
    # every point measured exactly once; the killed attempt left no record
    assert _measured(records) == SPACE
    trials = [r for r in records if r.KIND == "trial"]
    assert all(r.status == STATUS[r.variant] for r in trials)
    assert not any(r.study == study_name and r.trial == number for r in trials)
    # its heartbeat failed it, and another process measured its retry
    storage = open_storage(postgres_url)
    study = next(s for s in storage.get_all_studies() if s.study_name == study_name)
    by_number = {t.number: t for t in storage.get_all_trials(study._study_id)}
    assert by_number[number].state == TrialState.FAIL and "measured" not in by_number[number].user_attrs
    retry = [t for t in by_number.values() if t.system_attrs.get("failed_trial") == number]
    assert len(retry) == 1 and retry[0].user_attrs.get("measured")
    assert retry[0].user_attrs["worker"] in {_host(p) for p in rest}
    assert any(r.study == study_name and r.trial == retry[0].number for r in trials)
    assert any("stopped before finishing it; resuming its studies" in _output(root, f"host{i}")
               for i, p in enumerate(hosts) if p is not victim)
    # one winner per bucket; the hosts' exports left the file holding the database's records in order
    assert sorted(r.key for r in records if r.KIND == "winner") == [(0,), (1,)]
    assert [r.line() for r in read(root / RECORDS, op="toy_op", chip="interpreter").records] == \
        [r.line() for r in records]
    pulled = tmp_path / "pulled" / RECORDS
    for _ in range(2):  # any host, any number of times: nothing added twice
        result = subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(root), "records", "toy_op",
                                 "--chip", "interpreter", "--records", str(pulled), "--pull", postgres_url],
                                cwd=root, env=_env(), capture_output=True, text=True, timeout=120)
        # the fill gate's verdict rests on interpreter timings: exit 1 exactly when it names a lost bucket
        assert result.returncode == (1 if "\nERROR: " in result.stdout else 0), result.stderr[-3000:]
    assert [r.line() for r in read(pulled, op="toy_op", chip="interpreter").records] == [r.line() for r in records]
    # the table one process freezes from an exhaustive search of the same space
    alone = _project(tmp_path / "alone")
    result = subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(alone), *TUNE], cwd=alone,
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _measured(read(alone / RECORDS, op="toy_op", chip="interpreter").records) == SPACE
    assert _table(root) == _table(alone)


def test_a_server_restart_mid_campaign_stops_the_hosts_cleanly_and_loses_no_record(tmp_path, own_postgres):
    """The hosts either ride out the restart or stop with a message saying to run the command
    again (never a traceback); what they recorded stays, and the run that resumes them measures
    each point left exactly once and decides each bucket once."""
    from opgen.storage.storage import open_storage

    url = fresh_database(own_postgres.url)
    open_storage(url)  # its tables, for the records to be read while the hosts start
    root = _project(tmp_path)
    args = [*TUNE, "--variants", "good", "--storage", url, "--heartbeat", "1"]
    hosts = [_start(root, f"host{i}", *args) for i in range(2)]
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and sum(_measured(_db_records(url)).values()) < 3:
            time.sleep(0.1)
        assert all(p.poll() is None for p in hosts)  # mid-campaign
        before = [r.line() for r in _db_records(url)]
        own_postgres.restart()
        for i, proc in enumerate(hosts):
            proc.wait(timeout=300)
            out = _output(root, f"host{i}")
            assert "Traceback" not in out
            stopped = proc.returncode == 2 and "run the same command again" in out
            assert proc.returncode == 0 or stopped, out[-3000:]
    finally:
        _stop_all(hosts)
    kept = [r.line() for r in _db_records(url)]
    assert kept[:len(before)] == before
    again = subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(root), *args], cwd=root, env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    final = _db_records(url)
    assert [r.line() for r in final][:len(kept)] == kept
    assert _measured(final) == GOOD
    # at most one winner a bucket from the hosts (a bucket may have finished before the restart);
    # the run started after decides each bucket at most once (a new campaign: finished buckets
    # compete again), and every bucket no host decided; a bucket whose host recorded its winner
    # and stopped before saying so (the restart came between) is not decided again
    hosts_winners = [r.key for r in final[:len(kept)] if r.KIND == "winner"]
    assert len(hosts_winners) == len(set(hosts_winners)), hosts_winners
    again_winners = [r.key for r in final[len(kept):] if r.KIND == "winner"]
    assert len(again_winners) == len(set(again_winners)), again_winners
    assert {(0,), (1,)} - set(hosts_winners) <= set(again_winners) <= {(0,), (1,)}


def test_a_bucket_whose_holder_died_after_recording_its_winner_is_not_decided_again(postgres_url):
    """A host that dies between its bucket's winner and saying it finished: the host that takes
    the bucket over does not choose (and record) a second winner; one that died before it resumes."""
    from types import SimpleNamespace

    from opgen.tune import tune
    from opgen.storage.claims import Claims
    from opgen.storage.db_records import RecordTable
    from opgen.storage.records import WinnerRecord
    from opgen.spec.spec import load_spec
    from opgen.storage.storage import open_storage

    open_storage(postgres_url)  # the tables
    table = RecordTable(postgres_url)
    for bucket in ("decided", "undecided"):
        holder = Claims(postgres_url)
        assert holder.take(bucket)
        holder.mark(bucket, "running")
        table.append([WinnerRecord(op="toy_op", chip="interpreter", toolchain={}, kernel_hash="k", key=(0,),
                                   case={"N": 50}, variant="good", point={"BLOCK": 16}, study=f"{bucket} study",
                                   date="2026-11-30", median_ms=1.0, remeasured_ms={}, margin=None, error={},
                                   budget=None)])
        holder.close()  # dies before marking the bucket done
    table.close()
    campaign = tune.Campaign.__new__(tune.Campaign)
    campaign.spec, campaign.claims = load_spec(TOY / "specs" / "toy_op.yaml", TOY), Claims(postgres_url)
    group = [SimpleNamespace(bucket=SimpleNamespace(key=(0,)))]
    for bucket, study, taken in (("decided", "decided study", False), ("undecided", "another study", True)):
        campaign.claim_name = lambda group_: bucket
        campaign.study_name = lambda plan: study
        assert campaign._claim(group, wait=True) is taken
        assert campaign.claims.left(bucket) == ("stopped" if taken else "finished")


def test_a_winner_is_written_only_while_its_bucket_claim_holds(postgres_url):
    """The records table writes a claim holder's winner while the claim holds, and refuses it
    (writing nothing) once the claim is gone with its connection, as a server restart takes it: the
    host that takes the bucket over then records the only winner."""
    from opgen.storage.claims import Claims
    from opgen.storage.db_records import RecordTable
    from opgen.errors import StorageError
    from opgen.storage.records import WinnerRecord
    from opgen.storage.storage import open_storage

    open_storage(postgres_url)  # the tables
    table = RecordTable(postgres_url)
    bucket = chip = f"guarded {time.monotonic_ns()}"

    def winner(study):
        return WinnerRecord(op="toy_op", chip=chip, toolchain={}, kernel_hash="k", key=(0,), case={"N": 50},
                            variant="good", point={"BLOCK": 16}, study=study, date="2026-11-30", median_ms=1.0,
                            remeasured_ms={}, margin=None, error={}, budget=None)

    first = Claims(postgres_url)
    assert first.take(bucket)
    holder = first.holder(bucket)
    table.append([winner("held")], holder=holder)
    first.close()  # the claim goes with the connection
    with pytest.raises(StorageError, match="claim on the bucket was lost"):
        table.append([winner("lost")], holder=holder)
    second = Claims(postgres_url)
    assert second.take(bucket)
    table.append([winner("taken over")], holder=second.holder(bucket))
    second.close()
    assert [r.study for r in table.read("toy_op", chip)] == ["held", "taken over"]
    table.close()


def test_pulling_from_a_database_without_records_of_the_op_says_so(tmp_path, postgres_url, capsys):
    """`opgen records --pull` from a database no campaign has opened, or one holding only other
    ops' or chips' records, says it holds none of this op on this chip (naming what it holds) and
    exits 2, appending nothing; never that a campaign stopped."""
    from opgen.cli.main import main
    from opgen.storage.db_records import RecordTable
    from opgen.storage.records import WinnerRecord
    from opgen.storage.storage import open_storage

    pulled = tmp_path / RECORDS
    args = ["--root", str(TOY), "records", "toy_op", "--chip", "interpreter", "--records", str(pulled),
            "--pull", postgres_url]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds no records of toy_op on interpreter; no campaign has recorded any there: nothing to pull" in err
    assert "campaign stopped" not in err and not pulled.exists()
    open_storage(postgres_url)  # the tables, as a campaign of another chip leaves them
    table = RecordTable(postgres_url)
    table.append([WinnerRecord(op="toy_op", chip="h200", toolchain={}, kernel_hash="k", key=(0,), case={"N": 50},
                               variant="good", point={"BLOCK": 16}, study="s", date="2026-11-30", median_ms=1.0,
                               remeasured_ms={}, margin=None, error={}, budget=None)])
    table.close()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds no records of toy_op on interpreter; it holds records of toy_op on h200 (1): nothing" in err
    assert not pulled.exists()


def test_pulling_from_a_server_that_does_not_answer_says_nothing_was_read(tmp_path, capsys):
    """`opgen records --pull` from a server that does not answer names the URL (password masked)
    and the driver's reason, says nothing was read and exits 2; no campaign ran, so none stopped."""
    from opgen.cli.main import main

    pulled = tmp_path / RECORDS
    url = "postgresql://user:SECRET@127.0.0.1:1/db?connect_timeout=5"
    assert main(["--root", str(TOY), "records", "toy_op", "--chip", "interpreter", "--records", str(pulled),
                 "--pull", url]) == 2
    err = capsys.readouterr().err
    assert "the records table of postgresql://user:***@127.0.0.1:1/db" in err
    assert "nothing was read (check that the server is up" in err
    assert "campaign" not in err and "SECRET" not in err and not pulled.exists()


# --- a journal or SQLite file: one campaign at a time, or the shares of one split -------------
_HOLD = ("import sys; from pathlib import Path; from opgen.storage.storage import hold_campaign_lock; "
         "hold_campaign_lock(Path(sys.argv[1]), eval(sys.argv[2])); print('held', flush=True); sys.stdin.read()")


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_second_campaign_on_a_journal_or_sqlite_file_is_refused_naming_its_holder(tmp_path, kind):
    root = _project(tmp_path)
    path = root / ".tune" / ("toy.journal" if kind == "journal" else "toy.db")
    storage = str(path) if kind == "journal" else f"sqlite:///{path}"
    refusals = {  # the holder's share -> what a campaign with --shard (or none) is told
        "None": {None: "is in use by another opgen tune (pid {pid} on", "0/2": "is in use by another opgen tune"},
        "(0, 2)": {"0/2": "share 0/2 of", "1/3": "is in use by shares of another split (pid {pid} on"},
    }
    for held, cases in refusals.items():
        holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), held], env=_env(), text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert holder.stdout.readline().strip() == "held"
            for shard, message in cases.items():
                extra = ["--shard", shard] if shard else []
                result = subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(root), *TUNE,
                                         "--storage", storage, *extra], cwd=root, env=_env(), capture_output=True,
                                        text=True, timeout=120)
                assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
                assert message.format(pid=holder.pid) in result.stderr
                assert "opgen tune: error: tuning storage:" in result.stderr
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
    assert not (root / RECORDS).exists()  # nothing was measured


def test_the_shares_of_one_split_tune_side_by_side_on_a_fresh_sqlite_file(tmp_path):
    """Two shares opening one SQLite file that does not exist yet: the schema is created once,
    each share tunes its buckets, and every point is measured once."""
    root = _project(tmp_path)
    storage = f"sqlite:///{root / '.tune' / 'toy.db'}"
    (root / ".tune").mkdir()
    shares = [_start(root, f"share{k}", *TUNE, "--variants", "good", "--storage", storage, "--shard", f"{k}/2")
              for k in range(2)]
    try:
        for k, proc in enumerate(shares):
            assert proc.wait(timeout=300) == 0, _output(root, f"share{k}")[-3000:]
    finally:
        _stop_all(shares)
    from opgen.storage.records import read

    records = read(root / RECORDS, op="toy_op", chip="interpreter").records
    assert _measured(records) == GOOD
    assert sorted(r.key for r in records if r.KIND == "winner") == [(0,), (1,)]


def test_messages_show_a_storage_url_without_its_password():
    from opgen.storage.storage import is_postgres, shown

    assert "secret" not in shown("postgresql://tuner:secret@db.example/opgen")
    assert shown("postgresql://tuner:secret@db.example/opgen").startswith("postgresql://tuner:***@db.example")
    assert shown(".tune/h200-op.journal") == ".tune/h200-op.journal"
    assert is_postgres("postgresql+psycopg://db/x") and is_postgres("postgresql://db/x")
    assert not is_postgres("sqlite:///x.db") and not is_postgres("x.journal")
