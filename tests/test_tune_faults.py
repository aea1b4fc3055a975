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

from opgen.campaign import open_storage
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
