"""Runs a kernel module whose tiles are tensor descriptors (GRID tma, tma_persistent) under an
interpreter that knows them: Triton >= 3.4's, in the venv scripts/descriptor_interpreter.sh makes
(.venv-descriptors, or the Python that OPGEN_TEST_DESCRIPTOR_PYTHON names). The test's Triton,
triton-ascend 3.2, has no tensor descriptors in its interpreter.

As a script: ``python descriptor_interpreter.py JOB`` loads the torch-saved dict JOB (module name,
launch arguments), launches, and saves the arguments back with the output filled in.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python() -> str:
    """The interpreter's Python; a missing one fails the test that needs it, saying how to make it."""
    path = os.environ.get("OPGEN_TEST_DESCRIPTOR_PYTHON") or str(ROOT / ".venv-descriptors" / "bin" / "python")
    if not Path(path).exists():
        raise RuntimeError(f"{path} does not exist: run scripts/descriptor_interpreter.sh (the kernels of the "
                           "tma grids need an interpreter with tensor descriptors, Triton >= 3.4)")
    return path


def launch(module: str, **kwargs):
    """``module.launch(**kwargs)`` in the descriptor interpreter; returns ``kwargs["o"]`` as it wrote it."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.pt"
        torch.save({"module": module, "kwargs": kwargs}, job)
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
        done = subprocess.run([python(), __file__, str(job)], env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{module} in {python()}:\n{done.stderr[-3000:]}")
        return torch.load(job)["kwargs"]["o"]


def _main(job: str) -> None:
    import torch

    data = torch.load(job)
    importlib.import_module(data["module"]).launch(**data["kwargs"])
    torch.save(data, job)


if __name__ == "__main__":
    _main(sys.argv[1])
