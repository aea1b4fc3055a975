"""mamba3_mimo_bwd_fwd refuses invalid calls with errors that name the problem."""
import pytest
import torch

from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs


@pytest.fixture()
def x():
    return make_inputs(1, 16, 4, 2, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, seed=0)


@pytest.mark.parametrize("change, exc, pattern", [
    (lambda x: {"z": None}, ValueError, r"mimo_z and z must be given together .* got mimo_z True and z False"),
    (lambda x: {"mimo_z": None}, ValueError, r"mimo_z and z must be given together"),
    (lambda x: {"chunk_size": 12}, ValueError, r"chunk_size must be one of 8, 16, 32, 64, got 12"),
    (lambda x: {"rotary_dim_divisor": 3}, ValueError, r"rotary_dim_divisor must be one of 2, 4, got 3"),
    (lambda x: {"output_dtype": torch.int64}, ValueError, r"output_dtype must be one of float32, bfloat16, float16"),
    (lambda x: {"k": x["k"].float()}, TypeError, r"q, k, v and dout must share one dtype"),
    (lambda x: {"v": x["v"][:, :, :3].contiguous()}, ValueError, r"v\.shape\[2\] must be H = 4"),
    (lambda x: {"segsum": x["segsum"][:, :, :1].contiguous()}, ValueError, r"segsum\.shape\[2\] must be NC = 2"),
    (lambda x: {"d": torch.randn(3)}, ValueError, r"d\.shape\[0\] must be H = 4"),
    (lambda x: {"q_bias": x["q_bias"].bfloat16()}, TypeError, r"q_bias\.dtype must be one of float32"),
    (lambda x: {"v": x["v"][..., :6].contiguous(), "dout": x["dout"][..., :6].contiguous(),
                "z": x["z"][..., :6].contiguous(), "mimo_v": x["mimo_v"][..., :6].contiguous(),
                "mimo_o": x["mimo_o"][..., :6].contiguous(), "mimo_z": x["mimo_z"][..., :6].contiguous()},
     ValueError, r"N, P and chunk_size must be powers of two .* got N=8 P=6"),
])
def test_invalid_calls(x, change, exc, pattern):
    with pytest.raises(exc, match="^mamba3_mimo_bwd_fwd: " + pattern):
        mamba3_mimo_bwd_fwd(**{**x, **change(x)})


def test_odd_n_and_bad_groups():
    odd = make_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, seed=0)
    odd = {**odd, "q": odd["q"][..., :7].contiguous(), "k": odd["k"][..., :7].contiguous(),
           "q_bias": odd["q_bias"][..., :7].contiguous(), "k_bias": odd["k_bias"][..., :7].contiguous(),
           "angles": odd["angles"][..., :1].contiguous()}
    with pytest.raises(ValueError, match="N must be even"):
        mamba3_mimo_bwd_fwd(**odd)
    groups = make_inputs(1, 16, 3, 3, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, seed=0)
    groups = {**groups, "q": groups["q"][:, :, :, :2].contiguous(), "k": groups["k"][:, :, :, :2].contiguous()}
    with pytest.raises(ValueError, match=r"H \(3\) must be a multiple of G \(2\)"):
        mamba3_mimo_bwd_fwd(**groups)


def test_stage0_baseline_runs_the_forced_variant(x):
    from pathlib import Path

    from opgen.evidence.compare import variant_baseline
    from opgen.spec.hardware import profile
    from opgen.references.mamba3_mimo_bwd_fwd import golden
    from opgen.spec.spec import load_spec

    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "specs" / "mamba3_mimo_bwd_fwd.yaml", root)
    base = variant_baseline(spec, profile("interpreter"), {"ALGO": "stage0", "PRE": "separate"})
    states, qk_dot, dmimo_o, dmimo_z, dz = base(**x)
    gold = golden(**x)
    for name, out in (("states", states), ("qk_dot", qk_dot), ("dmimo_o", dmimo_o), ("dz", dz)):
        torch.testing.assert_close(out.double(), gold[name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["q_bias", "segsum", "d"])
def test_sparse_tensors_copied_when_strided_are_refused_by_name(x, name):
    with torch.no_grad():
        mamba3_mimo_bwd_fwd(**{**x, name: x[name].transpose(0, -1).contiguous().transpose(0, -1)})  # seen
        with pytest.raises(TypeError, match=f"^mamba3_mimo_bwd_fwd: {name} must be a dense tensor"):
            mamba3_mimo_bwd_fwd(**{**x, name: x[name].to_sparse()})
