"""mamba3_mimo_bwd_bwd refuses invalid calls with errors that name the argument."""
import pytest
import torch

from generated.mamba3_mimo_bwd_bwd import mamba3_mimo_bwd_bwd
from opgen.references.mamba3_mimo_bwd_bwd import make_inputs


@pytest.fixture(scope="module")
def x():
    return make_inputs(1, 16, 4, 2, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, seed=0)


@pytest.mark.parametrize("change, exc, pattern", [
    (lambda x: {"z": None}, ValueError, r"mimo_z and z must be given together .* got mimo_z True and z False"),
    (lambda x: {"chunk_size": 12}, ValueError, r"chunk_size must be one of 8, 16, 32, 64, got 12"),
    (lambda x: {"rotary_dim_divisor": 3}, ValueError, r"rotary_dim_divisor must be one of 2, 4, got 3"),
    (lambda x: {"output_dtype": torch.int64}, ValueError, r"output_dtype must be one of float32, bfloat16, float16"),
    (lambda x: {"dout": x["dout"].half()}, TypeError, r"q, k, v and dout must share one dtype"),
    (lambda x: {"states": x["states"][:, :, :1].contiguous()}, ValueError, r"states\.shape\[2\] must be NC = 2"),
    (lambda x: {"states": x["states"][..., :4].contiguous()}, ValueError, r"states\.shape\[4\] must be P = 8"),
    (lambda x: {"qk_dot": x["qk_dot"][..., :1].contiguous()}, ValueError, r"qk_dot\.shape\[4\] must be R = 2"),
    (lambda x: {"qk_dot": x["qk_dot"].double()}, TypeError, r"qk_dot\.dtype must be one of float32, bfloat16, float16"),
    (lambda x: {"segsum": x["segsum"][:, :, :1].contiguous()}, ValueError, r"segsum\.shape\[2\] must be NC = 2"),
    (lambda x: {"d": torch.randn(3)}, ValueError, r"d\.shape\[0\] must be H = 4"),
    (lambda x: {"k_bias": x["k_bias"].bfloat16()}, TypeError, r"k_bias\.dtype must be one of float32"),
])
def test_invalid_calls(x, change, exc, pattern):
    with pytest.raises(exc, match="^mamba3_mimo_bwd_bwd: " + pattern):
        mamba3_mimo_bwd_bwd(**{**x, **change(x)})


def test_bad_groups_and_tiles(x):
    with pytest.raises(ValueError, match=r"H \(4\) must be a multiple of G \(3\)"):
        mamba3_mimo_bwd_bwd(**{**x, "q": torch.cat([x["q"], x["q"][:, :, :, :1]], 3),
                               "k": torch.cat([x["k"], x["k"][:, :, :, :1]], 3)})
    narrow = {n: x[n][..., :6].contiguous() for n in ("v", "dout", "z", "mimo_v", "mimo_o", "mimo_z", "states")}
    with pytest.raises(ValueError, match=r"N, P and chunk_size must be powers of two .* got N=8 P=6"):
        mamba3_mimo_bwd_bwd(**{**x, **narrow})
