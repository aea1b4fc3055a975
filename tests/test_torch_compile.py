"""The generated ops are torch custom ops (opgen::<op>): torch.compile(fullgraph=True) traces a
model that calls them without a graph break, and its output equals the eager call's."""
import pytest
import torch

from opgen.references.chunk_gla_fwd_o_gk import make_inputs as gla_inputs
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs as mamba3_inputs


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_gla_in_a_compiled_module():
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk

    class Model(torch.nn.Module):
        def forward(self, q, v, g, A, h):
            return chunk_gla_fwd_o_gk(q * 1.0, v, g, A, h, scale=0.5, chunk_size=32).float() + 1.0

    x = gla_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=5)
    args = (x["q"], x["v"], x["g"], x["A"], x["h"])
    model = Model()
    assert torch.equal(torch.compile(model, fullgraph=True, backend="aot_eager")(*args), model(*args))
    assert hasattr(torch.ops.opgen, "chunk_gla_fwd_o_gk")


@pytest.mark.parametrize("has_z", [False, True], ids=["no_z", "z"])
def test_mamba3_with_optional_outputs_compiles(has_z):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = mamba3_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, has_z=has_z, seed=5)
    eager = mamba3_mimo_bwd_fwd(**x)
    compiled = torch.compile(lambda **kw: mamba3_mimo_bwd_fwd(**kw), fullgraph=True, backend="aot_eager")(**x)
    assert len(compiled) == 5 and (compiled[3] is None) == (not has_z) == (compiled[4] is None)
    for a, b in zip(eager, compiled):
        assert (a is None and b is None) or torch.equal(a, b)
