"""Tests of opgen.evidence.frontend: the Ascend front end (TTIR -> Linalg) run on a CPU."""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from opgen.evidence.frontend import FrontendArgumentError, FrontendResult, ascend_frontend

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@triton.jit
def gla_toy(q, g, h, o, T, scale, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
            BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    """GLA-output-like toy: o = (q * scale * exp(g)) @ h over K tiles, masked store."""
    i_v, i_t = tl.program_id(0), tl.program_id(1)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q, (T, K), (K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_g = tl.make_block_ptr(g, (T, K), (K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_h = tl.make_block_ptr(h, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1)).to(tl.float32)
        b_g = tl.load(p_g, boundary_check=(0, 1))
        b_h = tl.load(p_h, boundary_check=(0, 1))
        b_o += tl.dot(b_q * scale * tl.exp(b_g), b_h, input_precision=PRECISION)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_v * BV + tl.arange(0, BV)
    mask = (rows[:, None] < T) & (cols[None, :] < V)
    tl.store(o + rows[:, None] * V + cols[None, :], b_o.to(o.dtype.element_ty), mask=mask)


@triton.jit
def where_between_pointers(a, b, o, N, BLOCK: tl.constexpr):
    """Selects between two pointer tensors: triton-adapter-opt asserts on this."""
    offs = tl.arange(0, BLOCK)
    ptrs = tl.where(offs < N // 2, a + offs, b + offs)
    tl.store(o + offs, tl.load(ptrs, mask=offs < N), mask=offs < N)


def gla_args(dtype: torch.dtype, precision: str = "ieee", T: int = 100) -> dict:
    K = V = 64
    return dict(q=torch.randn(T, K, dtype=dtype), g=torch.randn(T, K), h=torch.randn(K, V),
                o=torch.empty(T, V, dtype=dtype), T=T, scale=0.125, K=K, V=V, BT=64, BK=32, BV=64,
                PRECISION=precision)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gla_toy_accepted(dtype: torch.dtype) -> None:
    result = ascend_frontend(gla_toy, gla_args(dtype))
    assert isinstance(result, FrontendResult)
    assert (result.accepted, result.stage, result.message) == (True, "ok", "")
    assert result.linalg_text_size > 1000
    assert "linalg.matmul" in result.ops and "math.exp" in result.ops
    assert list(result.ops) == sorted(set(result.ops))


def test_tf32_rejected_by_front_end() -> None:
    result = ascend_frontend(gla_toy, gla_args(torch.float32, precision="tf32"))
    assert (result.accepted, result.stage, result.linalg_text_size, result.ops) == (False, "frontend", 0, ())
    assert "tf32" in result.message and "hf32" in result.message


def test_hf32_accepted() -> None:
    assert ascend_frontend(gla_toy, gla_args(torch.float32, precision="hf32")).accepted


def test_adapter_assertion_is_reported_and_process_survives() -> None:
    pid = os.getpid()
    x = torch.randn(64)
    result = ascend_frontend(where_between_pointers, dict(a=x, b=x, o=x, N=64, BLOCK=64))
    assert (result.accepted, result.stage) == (False, "adapter")
    assert "triton-adapter-opt" in result.message and "Assertion" in result.message
    assert os.getpid() == pid
    assert ascend_frontend(gla_toy, gla_args(torch.float16)).accepted  # still usable afterwards


def _twice_py(x):
    return x * 2.0


def _interp_kernel_py(x, y, o, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(o + offs, _twice(tl.load(x + offs, mask=mask)) + tl.load(y + offs, mask=mask), mask=mask)


_twice = None  # bound to a jit'd _twice_py by the test below


def test_interpreted_function_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Decorate with TRITON_INTERPRET=1, as a module imported under the interpreter would be; the
    # kernel calls a helper that is an InterpretedFunction too (helpers must be module globals).
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(globals(), "_twice", triton.jit(_twice_py))
    kernel = triton.jit(_interp_kernel_py)
    assert type(kernel).__name__ == type(_twice).__name__ == "InterpretedFunction"
    x, y, o = torch.randn(16), torch.randn(16), torch.empty(16)
    # Launching under the interpreter patches triton.language in place (triton-ascend 3.2 never
    # restores it); the check must undo that rather than report a bogus rejection.
    kernel[(1,)](x, y, o, 16, BLOCK=16)
    torch.testing.assert_close(o, 2 * x + y)
    result = ascend_frontend(kernel, dict(x=x, y=y, o=o, N=16, BLOCK=16))
    assert (result.accepted, result.stage) == (True, "ok"), result.message
    assert {"arith.mulf", "arith.addf"} <= set(result.ops)
    assert ascend_frontend(gla_toy, gla_args(torch.bfloat16)).accepted
    kernel[(1,)](x, y, o, 16, BLOCK=16)  # the interpreter still works after the restore
    torch.testing.assert_close(o, 2 * x + y)
    assert ascend_frontend(kernel, dict(x=x, y=y, o=o, N=16, BLOCK=16)).accepted


def test_no_cache_written(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    assert ascend_frontend(gla_toy, gla_args(torch.float16)).accepted
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments() -> None:
    args = gla_args(torch.float16)
    del args["scale"]
    with pytest.raises(FrontendArgumentError, match="scale"):
        ascend_frontend(gla_toy, args)
    with pytest.raises(FrontendArgumentError, match="bogus"):
        ascend_frontend(gla_toy, {**gla_args(torch.float16), "bogus": 1})
    with pytest.raises(FrontendArgumentError, match="not_an_option"):
        ascend_frontend(gla_toy, gla_args(torch.float16), options={"not_an_option": True})


def test_adapter_death_by_signal_is_retried_once_and_a_rejection_never():
    import subprocess

    from opgen.evidence.frontend import run_adapter

    def stage_from(outcomes):
        calls = []

        def stage(ttir, metadata):
            calls.append(ttir)
            rc = outcomes[len(calls) - 1]
            if rc:
                raise subprocess.CalledProcessError(rc, "triton-adapter-opt", stderr=b"boom")
            return "linalg"
        return stage, calls

    stage, calls = stage_from([-11, 0])
    assert run_adapter(stage, "ttir", {}) == ("linalg", None) and len(calls) == 2
    stage, calls = stage_from([-11, -11])
    out, why = run_adapter(stage, "ttir", {})
    assert out is None and why.startswith("triton-adapter-opt was killed by signal 11") and len(calls) == 2
    stage, calls = stage_from([1, 0])
    out, why = run_adapter(stage, "ttir", {})
    assert out is None and why.startswith("triton-adapter-opt exited with 1") and "boom" in why and len(calls) == 1
