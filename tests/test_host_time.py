"""``opgen host-time``: the host work of a generated op's call up to its kernels' launch, on CPU
tensors under the interpreter with Triton's launch a no-op (no timing is asserted: the figures
depend on the host)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _host_time(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # the command sets it itself for CPU tensors
    return subprocess.run([sys.executable, "-m", "opgen.cli", "host-time", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_command_times_the_call_path_with_the_launch_a_no_op(tmp_path):
    out = tmp_path / "host.json"
    result = _host_time("chunk_gla_fwd_o_gk", "--rounds", "2", "--calls", "3", "--json", str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("host work per call up to the kernels' launch (launch: a no-op")
    assert lines[1].split() == ["op", "case", "launches", "seen", "us", "x", "add_", "unseen", "us", "x",
                                "add_", "add_", "us"]
    assert lines[2].split()[:3] == ["chunk_gla_fwd_o_gk", "B1-T64-H2-K32-V32-C32-bf16", "1"]
    data = json.loads(out.read_text())
    assert data["launch"] == "none" and data["cases"] == "host" and (data["rounds"], data["calls"]) == (2, 3)
    assert data["host"]["device"] == "cpu" and {"cpu", "cpus", "torch", "triton"} <= set(data["host"])
    (row,) = data["results"]
    assert row["op"] == "chunk_gla_fwd_o_gk" and row["case"] == "B1-T64-H2-K32-V32-C32-bf16"
    assert row["launches"] == 1  # the call reached the launch, which the counter took in its place
    for key in ("seen_us", "unseen_us", "add_us", "seen_ratio", "unseen_ratio"):
        assert math.isfinite(row[key]) and row[key] > 0


def test_every_op_has_a_host_case_set_and_its_launches_are_counted(tmp_path):
    out = tmp_path / "host.json"
    result = _host_time("--rounds", "1", "--calls", "1", "--json", str(out))
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["results"]
    ops = {p.stem for p in (ROOT / "specs").glob("*.yaml")}
    assert {r["op"] for r in rows} == ops and all(r["launches"] >= 1 for r in rows)
    assert "skipped" not in result.stderr


def test_the_real_launch_needs_a_device():
    result = _host_time("chunk_gla_fwd_o_gk", "--launch", "real")
    assert result.returncode == 2 and "--launch real needs a device" in result.stderr


def test_a_case_set_no_op_has_is_refused_before_any_timing():
    named = _host_time("chunk_gla_fwd_o_gk", "--cases", "nosuch")
    every = _host_time("--cases", "nosuch")
    assert named.returncode == 2 and "cases.nosuch: expected one of" in named.stderr
    assert every.returncode == 2 and "no op has a case set 'nosuch'" in every.stderr
    assert "host work per call" not in named.stdout + every.stdout and "Traceback" not in named.stderr + every.stderr
