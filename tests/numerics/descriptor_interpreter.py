"""Runs a kernel module whose tiles are tensor descriptors (GRID tma, tma_persistent) under an
interpreter that knows them: Triton >= 3.4's, in the venv scripts/descriptor_interpreter.sh makes
(.venv-descriptors, or the Python that OPGEN_TEST_DESCRIPTOR_PYTHON names). The test's Triton,
triton-ascend 3.2, has no tensor descriptors in its interpreter.

As a script: ``python descriptor_interpreter.py JOB`` loads the torch-saved dict JOB (module name,
launch arguments), launches, and saves the arguments back with the output filled in;
``python descriptor_interpreter.py --serve`` does so for each JOB path read from stdin, one a line,
answering each on stdout. A test process keeps one such server (torch and Triton imported once, not
once a launch).
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python() -> str:
    """The interpreter's Python; a missing one fails the test that needs it, saying how to make it."""
    path = os.environ.get("OPGEN_TEST_DESCRIPTOR_PYTHON") or str(ROOT / ".venv-descriptors" / "bin" / "python")
    if not Path(path).exists():
        raise RuntimeError(f"{path} does not exist: run scripts/descriptor_interpreter.sh (the kernels of the "
                           "tma grids need an interpreter with tensor descriptors, Triton >= 3.4)")
    return path


_REPLY = "descriptor_interpreter:"  # the server's answer lines start so (a kernel's prints do not)
_server: subprocess.Popen | None = None
_server_log: Path | None = None


def _serving() -> subprocess.Popen:
    """The test process's server, started on first use (and again if it died)."""
    global _server, _server_log
    if _server is None or _server.poll() is not None:
        _server_log = Path(tempfile.mkstemp(prefix="descriptor-interpreter-", suffix=".log")[1])
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
        _server = subprocess.Popen([python(), __file__, "--serve"], env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=_server_log.open("w"), text=True)
        atexit.register(_server.kill)
    return _server


def launch(module: str, **kwargs):
    """``module.launch(**kwargs)`` in the descriptor interpreter; returns ``kwargs["o"]`` as it wrote it."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.pt"
        torch.save({"module": module, "kwargs": kwargs}, job)
        server = _serving()
        server.stdin.write(f"{job}\n")
        server.stdin.flush()
        for line in server.stdout:
            if line.startswith(_REPLY):
                reply = json.loads(line[len(_REPLY):])
                if reply:
                    raise RuntimeError(f"{module} in {python()}:\n{reply[-3000:]}")
                return torch.load(job)["kwargs"]["o"]
        raise RuntimeError(f"{module} in {python()}: the server died:\n{_server_log.read_text()[-3000:]}")


def _main(job: str) -> None:
    import torch

    data = torch.load(job)
    importlib.import_module(data["module"]).launch(**data["kwargs"])
    torch.save(data, job)


def _serve() -> None:
    for line in sys.stdin:
        try:
            _main(line.strip())
            reply = ""
        except Exception:  # the test that sent it fails, naming it; the server serves on
            reply = traceback.format_exc()
        sys.stdout.write(f"{_REPLY}{json.dumps(reply)}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve() if sys.argv[1] == "--serve" else _main(sys.argv[1])
