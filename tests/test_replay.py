"""`opgen replay`: the tuner's search rerun on a recorded exhaustive sweep."""
import itertools

from opgen.storage import records
from opgen.evidence.replay import load_sweep, replay, report

TOOLS = {"triton": "3.6.0", "torch": "2.11.0"}


def _sweep_file(tmp_path):
    rows = []
    for n, (a, b) in enumerate(itertools.product(range(10), range(6))):
        failed = (a, b) in {(0, 0), (9, 5)}
        rows.append(records.TrialRecord(
            op="toy_op", chip="h200", toolchain=TOOLS, kernel_hash="sha256:k", key=(0,), case={"N": 50},
            variant="good", point={"a": a, "b": b}, study="sweep", date="2026-11-30", trial=n,
            status="crash" if failed else "ok", reason="recorded" if failed else "",
            median_ms=None if failed else 1.0 + 0.05 * abs(a - 7) + 0.03 * abs(b - 2),
            times_ms=(), error={}, budget=None))
    path = tmp_path / "records" / "h200" / "toy_op.jsonl"
    records.append(path, rows)
    return path


def test_sweep_loads_every_point_and_failures(tmp_path):
    sweep = load_sweep(_sweep_file(tmp_path), "toy_op", "h200", "good")
    assert len(sweep.times) == 60 and sum(t is None for t in sweep.times.values()) == 2
    assert sweep.best == 1.0


def test_replay_respects_the_budget_and_is_deterministic(tmp_path):
    sweep = load_sweep(_sweep_file(tmp_path), "toy_op", "h200", "good")
    runs = replay(sweep, 18, range(4))
    assert all(r.measured == 18 for r in runs)
    assert all(r.best >= sweep.best for r in runs)
    assert [r.best for r in replay(sweep, 18, range(4))] == [r.best for r in runs]
    text = report(sweep, runs, 18, 0.03)
    assert "60 points, 2 failed, exhaustive best 1.0000 ms; budget 18 trials (30%)" in text
    assert "of the exhaustive best on" in text.splitlines()[-1]


def test_full_budget_finds_the_exhaustive_best(tmp_path):
    sweep = load_sweep(_sweep_file(tmp_path), "toy_op", "h200", "good")
    (run,) = replay(sweep, 60, range(1))
    assert run.measured == 60 and run.best == sweep.best
