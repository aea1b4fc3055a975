"""Tests of opgen.run.interpreter: bf16 computed by value in the Triton CPU interpreter.

Kernels run in subprocesses: TRITON_INTERPRET must be set before ``@triton.jit`` runs, the patch
is global and irreversible, and an interpreted launch patches ``triton.language`` for the rest
of the process (triton-ascend 3.2), so test order must not matter.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from opgen.run.interpreter import InterpreterPatchError, bf16_bits_to_f32, f32_to_bf16_bits

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch, triton, triton.language as tl
    from opgen.run.interpreter import is_bf16_patched, patch_bf16

    if sys.argv[1] == "patched":
        patch_bf16()
        first = triton.runtime.interpreter.InterpreterBuilder.binary_op
        patch_bf16()  # idempotent: must not wrap twice
        assert triton.runtime.interpreter.InterpreterBuilder.binary_op is first

    @triton.jit
    def bf16_ops(a, b, c, d, o_dot, o_add, o_lt, o_sum, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        acc = tl.dot(tl.load(a + rm[:, None] * K + rk[None, :]), tl.load(b + rk[:, None] * N + rn[None, :]))
        mn = rm[:, None] * N + rn[None, :]
        x, y = tl.load(c + mn), tl.load(d + mn)
        tl.store(o_dot + mn, acc)
        tl.store(o_add + mn, x + y)
        tl.store(o_lt + mn, (x < y).to(tl.int32))
        tl.store(o_sum + rn, tl.sum(x, axis=0))

    torch.manual_seed(0)
    M = N = K = 16
    bf = torch.bfloat16
    a, b = torch.randn(M, K, dtype=bf), torch.randn(K, N, dtype=bf)
    c, d = torch.randn(M, N, dtype=bf), torch.randn(M, N, dtype=bf)
    o_dot, o_add = torch.empty(M, N), torch.empty(M, N, dtype=bf)
    o_lt, o_sum = torch.empty(M, N, dtype=torch.int32), torch.empty(N, dtype=bf)
    bf16_ops[(1,)](a, b, c, d, o_dot, o_add, o_lt, o_sum, M=M, N=N, K=K)

    def rel(out, ref):
        return float((out.double() - ref).abs().max() / ref.abs().max())

    print(json.dumps({
        "patched": is_bf16_patched(),
        "dot": rel(o_dot, a.double() @ b.double()),
        "add": rel(o_add, c.double() + d.double()),
        "lt_ok": bool((o_lt.bool() == (c < d)).all()),
        "sum": rel(o_sum, c.double().sum(0)),
    }))
''')


def _run(tmp_path: Path, mode: str) -> dict:
    script = tmp_path / "bf16_kernel.py"
    script.write_text(SCRIPT)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bf16_is_garbage_without_patch(tmp_path: Path) -> None:
    """Documents the interpreter bug: bf16 bit patterns are computed on as integers."""
    res = _run(tmp_path, "plain")
    assert res["patched"] is False
    assert res["dot"] > 1e3
    assert not res["add"] < 1e-1  # large or NaN
    assert res["lt_ok"] is False


def test_bf16_by_value_with_patch(tmp_path: Path) -> None:
    res = _run(tmp_path, "patched")
    assert res["patched"] is True
    assert res["dot"] < 1e-5  # exact bf16 products summed in fp32
    assert res["add"] < 2 ** -8  # one bf16 rounding
    assert res["lt_ok"] is True
    assert res["sum"] < 2 ** -7  # fp32 accumulation, one bf16 rounding


def test_round_to_nearest_even() -> None:
    values = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20, -2.5,
                       np.inf, -np.inf, 0.0, -0.0, 3.4e38], dtype=np.float32)
    bits = f32_to_bf16_bits(values)
    assert bits.dtype == np.uint16
    back = bf16_bits_to_f32(bits)
    expected = [1.0, 1.0, 1.0 + 2 ** -6, 1.0 + 2 ** -7, -2.5, np.inf, -np.inf, 0.0, -0.0, np.inf]
    np.testing.assert_array_equal(back, np.array(expected, dtype=np.float32))
    assert np.signbit(back[8])
    nan_bits = f32_to_bf16_bits(np.array([np.nan, -np.nan], dtype=np.float32))
    assert np.isnan(bf16_bits_to_f32(nan_bits)).all()


def test_missing_interpreter_attribute_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import opgen.run.interpreter as mod

    class FakeBuilder:
        def binary_op(self, lhs, rhs, op):  # pragma: no cover - never called
            raise AssertionError

    reduce_ops = type("ReduceOps", (), {"sum": lambda self, x: x, "min_max": lambda self, x: x})
    scan_ops = type("ScanOps", (), {"cumsum": lambda self, x: x, "cumprod": lambda self, x: x})
    fake = types.SimpleNamespace(InterpreterBuilder=FakeBuilder, TensorHandle=object, _get_np_dtype=None,
                                 ReduceOps=reduce_ops, ScanOps=scan_ops)
    monkeypatch.setattr(mod, "_interp", lambda: fake)
    with pytest.raises(InterpreterPatchError, match="InterpreterBuilder.create_dot"):
        mod.patch_bf16()
    assert not hasattr(FakeBuilder, "_opgen_bf16_by_value")
    assert FakeBuilder.binary_op.__name__ == "binary_op" and not hasattr(FakeBuilder.binary_op, "__wrapped__")
    del fake.ScanOps
    with pytest.raises(InterpreterPatchError, match="triton.runtime.interpreter.ScanOps"):
        mod.patch_bf16()


API_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk
    from opgen.references.chunk_gla_fwd_o_gk import golden, make_inputs

    args = make_inputs(B=1, T=40, H=2, K=32, V=32, chunk_size=32, dtype=torch.bfloat16)
    out = chunk_gla_fwd_o_gk(**args)
    gold = golden(**args)
    rel = float((out.double() - gold).norm() / gold.norm())
    print(json.dumps({"rel_l2": rel, "opgen_patch": "opgen.run.interpreter" in sys.modules}))
''')


def test_the_generated_api_computes_bf16_by_value_under_the_interpreter():
    """A user of ``generated.<op>`` under TRITON_INTERPRET=1 gets bf16 results as accurate as the
    tests' (the spec's bar 2.2e-3), from the generated package's own copy of the patch."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", API_SCRIPT], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rel_l2"] < 2.2e-3 and not got["opgen_patch"]


def test_the_generated_copy_of_the_patch_is_this_module():
    from opgen.run import interpreter

    copy = (REPO / "generated" / "_interpreter.py").read_text()
    assert copy.endswith(Path(interpreter.__file__).read_text()) and "from opgen" not in copy


def test_the_tuner_worker_computes_bf16_by_value_under_the_interpreter():
    """A tuning worker on the interpreter checks a bf16 point against the spec's bar and passes."""
    from opgen.spec.spec import load_spec
    from opgen.run.worker import Task, Worker

    spec = load_spec(REPO / "specs" / "chunk_gla_fwd_o_gk.yaml", REPO)
    point = {"BK": 32, "BV": 32, "DOT_PRECISION": "ieee", "A_PAIR": True, "EARLY_INTRA": False,
             "EVICT_H": False, "TRIL_LOAD": False, "occupancy": 1}
    case = {"B": 1, "T": 40, "H": 2, "K": 32, "V": 32, "chunk_size": 32, "dtype": "bfloat16"}
    task = Task(op=spec.op, rendering="npu", variant="post_general_persistent", point=tuple(point.items()),
                case=tuple(case.items()), backend="interpreter", device="cpu", programs=4,
                max_rel_l2=spec.accuracy.max_rel_l2["bfloat16"], timed=False)
    with Worker(spec, str(REPO), {"TRITON_INTERPRET": "1"}) as worker:
        result = worker.run(task, timeout=240)
    assert result.status == "ok", result.reason
