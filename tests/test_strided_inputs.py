"""Strided inputs (a slice of a fused projection, a transposed view) give exactly the outputs of
their contiguous copies, for both ops under the interpreter; the caller's tensors are not changed."""
import pytest
import torch

from opgen.references.chunk_gla_fwd_o_gk import make_inputs as gla_inputs
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs as mamba3_inputs


def _sliced(x):
    """x's values as the first part of a wider tensor's last dim (as q out of a fused qkv)."""
    wide = torch.cat([x, torch.full_like(x, 7.0)], dim=-1)
    view = wide[..., :x.shape[-1]]
    assert not view.is_contiguous()
    return view


def _transposed(x):
    """x's values as a transposed view of its dims 1 and 2."""
    view = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert not view.is_contiguous() and torch.equal(view, x)
    return view


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for u, v in zip(a, b):
        assert (u is None and v is None) or torch.equal(u, v)


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("make", [_sliced, _transposed], ids=["split", "transpose"])
def test_gla_takes_strided_q_v_g(make):
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk

    x = gla_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=5)
    strided = {**x, "q": make(x["q"]), "v": make(x["v"]), "g": make(x["g"])}
    before = strided["q"].clone()
    _same(chunk_gla_fwd_o_gk(**strided), chunk_gla_fwd_o_gk(**x))
    assert torch.equal(strided["q"], before) and not strided["q"].is_contiguous()


@pytest.mark.parametrize("make", [_sliced, _transposed], ids=["split", "transpose"])
def test_mamba3_takes_strided_q_k_v(make):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = mamba3_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, has_z=True, seed=5)
    strided = {**x, "q": make(x["q"]), "k": make(x["k"]), "v": make(x["v"]), "z": make(x["z"])}
    _same(mamba3_mimo_bwd_fwd(**strided), mamba3_mimo_bwd_fwd(**x))


def test_the_strided_baseline_calls_each_op_with_strided_views_made_once(monkeypatch):
    """``opgen bench <op> --baseline strided`` times this call beside the contiguous one."""
    import generated.mamba3_mimo_bwd_fwd as module
    from opgen.baselines import strided
    from opgen.spec import load_spec
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for op in ("chunk_gla_fwd_o_gk", "mamba3_mimo_bwd_fwd"):
        assert load_spec(root / "specs" / f"{op}.yaml", root).baselines["strided"] == f"opgen.baselines.strided:{op}"
    x = mamba3_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, has_z=True, seed=6)
    seen = []
    real = module.mamba3_mimo_bwd_fwd

    def spy(**args):
        seen.append(args)
        return real(**args)
    monkeypatch.setattr(module, "mamba3_mimo_bwd_fwd", spy)
    base = strided.strided_call("mamba3_mimo_bwd_fwd")
    first, second = base(**x), base(**x)
    _same(first, real(**x))
    _same(second, first)
    for name in ("q", "k", "v", "dout", "z", "angles", "dt", "segsum"):
        assert not seen[0][name].is_contiguous() and torch.equal(seen[0][name], x[name]), name
        assert seen[1][name] is seen[0][name], name  # made once, reused by every timed call
    for name in ("q_bias", "mimo_v", "d"):  # per-head parameters pass as they are
        assert seen[0][name] is x[name], name
