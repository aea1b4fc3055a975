"""The tuner under faults from outside: a torn journal, a killed worker, a killed tuner. Nothing
measured is lost, nothing is left running, and a kill from outside is not the point's fault."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opgen.tune.campaign import open_storage
from opgen.errors import OpgenError

ROOT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).resolve().parent / "toy_project"
RECORDS = Path("records/interpreter/toy_op.jsonl")


def _study(path: Path, trials: int):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=open_storage(str(path)), load_if_exists=True)
    for _ in range(trials):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        study.tell(trial, trial.params["x"])
    return study


def test_a_torn_last_journal_line_is_cut_and_the_journal_stays_usable(tmp_path, capsys):
    path = tmp_path / "j.journal"
    _study(path, 3)
    size = path.stat().st_size
    os.truncate(path, size - 30)
    study = _study(path, 2)  # the resume: the torn op is cut, the trial it told is left running
    assert "cut its torn last line" in capsys.readouterr().err
    assert len(study.trials) == 5
    again = _study(path, 1)  # and every later open reads it
    assert len(again.trials) == 6 and sum(t.value is not None for t in again.trials) == 5


def test_a_journal_line_without_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "j.journal"
    _study(path, 2)
    os.truncate(path, path.stat().st_size - 1)
    assert len(_study(path, 1).trials) == 3
    assert all(t.value is not None for t in _study(path, 0).trials)


def test_a_malformed_journal_line_inside_is_refused_naming_the_file_and_what_to_do(tmp_path):
    path = tmp_path / "j.journal"
    _study(path, 2)
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:20]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(OpgenError, match=rf"{path}:2: not a journal line.*move it aside"):
        open_storage(str(path))


# --- a measured trial is recorded before the study stores it ----------------------------------
def _points(n=4):
    from opgen.space.space import Point

    return tuple(Point("v", (("x", i),)) for i in range(n))


def _search(path, measured, recorded, tell=None, trials=4):
    """One run of the search loop on a journal: ``measured`` lists the points measured,
    ``recorded`` the trial records; ``tell`` wraps the study's tell."""
    from opgen.tune.search import Measured, search
    from opgen.tune.settings import Settings
    from opgen.run.worker import Result
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=open_storage(str(path)), load_if_exists=True)
    if tell is not None:
        study.tell = tell(study.tell)

    def measure(points):
        measured.extend(p.config["x"] for p in points)
        return [Measured(p, [Result("ok", "", 1.0 + p.config["x"])]) for p in points]

    search(study, _points(), (), Settings(trials=trials), time.monotonic() + 60, measure,
           lambda number, m: recorded.append(m.point.config["x"]))
    return study


@pytest.mark.parametrize("when", ["after", "before"])
def test_a_run_ending_at_a_tell_loses_no_measured_trial_and_measures_none_twice(tmp_path, when):
    """The run ends right after (or right before) the study stores its third measured trial:
    the records hold every measured trial, and the resume measures only the rest."""
    path, measured, recorded = tmp_path / "j.journal", [], []

    def tell(orig):
        told = []

        def wrapped(trial, *args, **kwargs):
            if kwargs.get("state") is None and len(told) == 2 and when == "before":
                raise SystemExit(1)
            out = orig(trial, *args, **kwargs)
            told.append(trial)
            if len(told) == 3:
                raise SystemExit(1)
            return out
        return wrapped

    with pytest.raises(SystemExit):
        _search(path, measured, recorded, tell)
    assert recorded == measured and len(measured) == 3
    study = _search(path, measured, recorded)
    assert sorted(measured) == [0, 1, 2, 3] and recorded == measured  # nothing measured twice
    values = sorted(t.value for t in study.trials if t.value is not None)
    assert values == pytest.approx([1.0, 2.0, 3.0, 4.0])  # the trial cut off before its tell, told from what it measured


def test_a_trial_recorded_by_a_run_that_died_before_marking_it_is_not_measured_again(tmp_path):
    """A shared campaign's records live in its database: a trial they hold counts as measured even
    when its run died between the record and the study's own mark."""
    import optuna

    from opgen.tune.search import Measured, search
    from opgen.tune.settings import Settings
    from opgen.run.worker import Result

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path, measured, recorded = tmp_path / "j.journal", [], {}

    def record(number, m):
        recorded[number] = m.results
        if len(recorded) == 2:
            raise SystemExit(1)  # the run dies right after its second record

    def run(on_trial):
        study = optuna.create_study(study_name="s", storage=open_storage(str(path)), load_if_exists=True)
        search(study, _points(), (), Settings(trials=4), time.monotonic() + 60,
               lambda points: [measured.append(p.config["x"])
                               or Measured(p, [Result("ok", "", 1.0 + p.config["x"])]) for p in points],
               on_trial, lambda number: recorded.get(number, []))

    with pytest.raises(SystemExit):
        run(record)
    assert len(measured) == 2
    run(lambda number, m: recorded.setdefault(number, m.results))
    assert sorted(measured) == [0, 1, 2, 3]  # the second point, recorded, was not measured again
    assert len(recorded) == 4


# --- a worker killed from outside ------------------------------------------------------------
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from opgen.build import freeze
    from opgen.spec.spec import load_spec

    root = tmp_path_factory.mktemp("toy")
    shutil.copytree(TOY, root, dirs_exist_ok=True)
    freeze.write(root, freeze.build_all(root))
    return root, load_spec(root / "specs" / "toy_op.yaml", root)


def _task(variant):
    from opgen.run.worker import Task

    return Task(op="toy_op", rendering="npu", variant=variant, point=(("BLOCK", 16),),
                case=(("N", 50), ("dtype", "float32")), backend="interpreter", device="cpu", programs=4)


def _run_and_kill(worker, task, signum, after=None):
    """Run ``task``; ``after`` seconds in, send ``signum`` to the worker process from outside."""
    import threading

    worker.start()
    pid = worker._proc.pid
    if after is not None:
        threading.Timer(after, os.kill, (pid, signum)).start()
    return worker.run(task, timeout=30)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_killed_from_outside_is_not_the_points_crash(toy, signum):
    from opgen.run.worker import Worker

    root, spec = toy
    with Worker(spec, str(root), {"TRITON_INTERPRET": "1"}) as worker:
        killed = _run_and_kill(worker, _task("hang"), signum, after=1.0)
        assert killed.status == "killed" and signal.Signals(signum).name in killed.reason
        assert "from outside" in killed.reason
        crash = worker.run(_task("crash"), timeout=30)  # os.abort(): SIGABRT, its own fault
        assert crash.status == "crash" and "exit code -6" in crash.reason
        assert worker.run(_task("good"), timeout=30).status == "ok"


def test_a_killed_point_is_measured_again_on_resume(tmp_path):
    from opgen.tune.search import Measured
    from opgen.run.worker import Result

    path, measured, recorded = tmp_path / "j.journal", [], []
    killed = {1}
    from opgen.tune import search as search_mod

    def once_killed(points):
        out = []
        for p in points:
            x = p.config["x"]
            measured.append(x)
            out.append(Measured(p, [Result("killed", "worker process killed by SIGKILL")] if x in killed
                                else [Result("ok", "", 1.0 + x)]))
            killed.discard(x)
        return out

    import optuna

    study = optuna.create_study(study_name="s", storage=open_storage(str(path)))
    settings = search_mod.Settings(trials=4)
    search_mod.search(study, _points(), (), settings, time.monotonic() + 60, once_killed, lambda *a: None)
    assert sorted(measured) == [0, 1, 2, 3]
    measured.clear()
    found = search_mod.search(study, _points(), (), settings, time.monotonic() + 60, once_killed,
                              lambda *a: None)
    assert measured == [1] and all(m.ok for m in found) and len(found) == 4
    measured.clear()
    search_mod.search(study, _points(), (), settings, time.monotonic() + 60, once_killed, lambda *a: None)
    assert measured == []


# --- a killed tuner takes its workers with it -------------------------------------------------
def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_the_tuner(toy, signum):
    root, _ = toy
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    tuner = subprocess.Popen(
        [sys.executable, "-m", "opgen.cli", "--root", str(root), "tune", "toy_op", "--chip", "interpreter",
         "--cases", "smoke", "--variants", "hang", "--point-timeout", "60", "--no-progress",
         "--storage", str(root / f".tune/{signum}.journal"), "--records", str(root / f"{signum}.jsonl")],
        cwd=root, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_children(tuner.pid)) < 2:  # resource tracker, worker
            time.sleep(0.2)
        children = _children(tuner.pid)
        assert len(children) == 2
        while time.monotonic() < deadline and not any("libtriton" in _maps(p) for p in children):
            time.sleep(0.2)  # the worker imported triton: it is ready
        time.sleep(1.0)  # inside the hanging point
        os.kill(tuner.pid, signum)  # the tuner alone, not its group
        tuner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in children):
            time.sleep(0.2)
        assert not any(_alive(p) for p in children)
    finally:
        if tuner.poll() is None:
            os.killpg(tuner.pid, signal.SIGKILL)


def test_device_shards_and_their_workers_die_with_the_tuner(toy):
    """--devices: a shard process per device, each with its workers; SIGKILL of the tuner alone
    leaves none of them running."""
    root, _ = toy
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    tuner = subprocess.Popen(
        [sys.executable, "-m", "opgen.cli", "--root", str(root), "tune", "toy_op", "--chip", "interpreter",
         "--cases", "two", "--variants", "hang", "--point-timeout", "60", "--no-progress",
         "--devices", "cuda:0,cuda:1", "--storage", str(root / ".tune/shards.journal"),
         "--records", str(root / "shards.jsonl")],
        cwd=root, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and sum(len(_children(s)) for s in _children(tuner.pid)) < 4:
            time.sleep(0.2)  # two shards, each with its resource tracker and its worker
        shards = _children(tuner.pid)
        everyone = shards + [c for s in shards for c in _children(s)]
        assert len(shards) == 2 and len(everyone) >= 6
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in everyone):
            time.sleep(0.2)
        assert not any(_alive(p) for p in everyone)
    finally:
        if tuner.poll() is None:
            os.killpg(tuner.pid, signal.SIGKILL)
