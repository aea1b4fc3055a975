"""The baseline of the whole Mamba-3 MIMO backward (upstream's mamba_mimo_bwd_combined) without
TileLang: our arguments in the wrapper's order, its results in our gradient order, what it
refuses and why, and the error when the bundle is missing. CPU only."""
import inspect
import sys

import pytest
import torch

from opgen.baselines import mamba3_mimo_backward as tl
from opgen.errors import UnsupportedInput
from opgen.references.mamba3_mimo_forward import chunk_decays, make_inputs

SIZES = dict(B=2, S=16, H=4, G=1, N=32, P=4, R=2, chunk_size=8)


def _args(has_z=True, has_d=True, dtype=torch.bfloat16, **sizes):
    """make_inputs with the float64 parameters in the float32 the kernels take; the layer's
    arguments as ``composed.mamba3_mimo_backward`` takes them."""
    sizes = {**SIZES, **sizes}
    x = make_inputs(**sizes, dtype=dtype, has_z=has_z, has_d=has_d)
    x = {n: (t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t)
         for n, t in x.items()}
    x["chunk_size"] = sizes["chunk_size"]
    return x


def test_our_gradient_names_are_the_composed_backwards():
    from composed.mamba3_mimo_backward import GRADIENTS, mamba3_mimo_backward
    assert tl.GRADIENTS == GRADIENTS
    assert sorted(tl.COMBINED_OUTPUTS) == sorted(GRADIENTS)
    # both entries take the composed backward's arguments
    params = list(inspect.signature(mamba3_mimo_backward).parameters)
    assert list(inspect.signature(tl.combined_args).parameters)[:-1] == params


def test_combined_args_are_the_wrappers_in_its_order():
    x = _args()
    up = tl.combined_args(**x)
    assert tuple(up) == tl.COMBINED_ARGS
    for name in ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "mimo_z",
                 "angles", "dt", "d"):
        assert up[name] is x[name], name
    assert up["trap"].dtype == torch.bfloat16 and torch.equal(up["trap"], x["trap"].to(torch.bfloat16))
    assert (up["chunk_size"], up["rotary_dim_divisor"], up["dtype"]) == (8, 4, "bfloat16")
    da_cs, da_cs_rev, segsum = chunk_decays(x["dA"].double(), 8)
    assert torch.allclose(up["da_cs"].double(), da_cs, atol=1e-6)
    assert torch.allclose(up["da_cs_rev"].double(), da_cs_rev, atol=1e-6)
    assert torch.allclose(up["segsum"].double(), segsum, atol=1e-6)
    assert up["segsum"].shape == (2, 4, 2, 8, 8)


def test_the_decays_come_from_the_function_given():
    seen = []

    def decays(dA, C):
        seen.append((tuple(dA.shape), C))
        return "cs", "rev", "seg"

    up = tl.combined_args(**_args(), decays=decays)
    assert seen == [((2, 4, 16), 8)]
    assert (up["da_cs"], up["da_cs_rev"], up["segsum"]) == ("cs", "rev", "seg")


def test_from_combined_puts_the_wrappers_results_in_our_gradient_order():
    out = tuple(f"upstream:{name}" for name in tl.COMBINED_OUTPUTS)
    assert tl.from_combined(out) == tuple(f"upstream:{name}" for name in tl.GRADIENTS)
    with pytest.raises(ValueError, match="returned 15 results, expected 14"):
        tl.from_combined(out + ("dout_norm_weight",))


@pytest.mark.parametrize("change, message", [
    (dict(dtype=torch.float32), "float16 or bfloat16"),
    (dict(S=20), "not a multiple of chunk_size"),
    (dict(N=16), "N=16 is below 32.*m_warp"),
    (dict(G=2), "G=2 with H=4.*G = 1 or G = H only"),
])
def test_cases_upstream_does_not_take_are_refused_with_the_reason(change, message):
    with pytest.raises(UnsupportedInput, match=message):
        tl.combined_args(**_args(**change))


def test_g_equal_to_h_is_taken():
    assert tl.combined_args(**_args(G=4))["q"].shape[3] == 4


@pytest.mark.parametrize("change, message", [
    (dict(raw_angles=True), "raw_angles=True"),
    (dict(z=None), "needs both mimo_z and z, got only mimo_z"),
])
def test_options_and_half_gates_upstream_does_not_take_are_refused(change, message):
    with pytest.raises(UnsupportedInput, match=message):
        tl.combined_args(**{**_args(), **change})


def test_a_half_precision_da_is_refused():
    x = _args()
    with pytest.raises(UnsupportedInput, match="dA in torch.bfloat16"):
        tl.combined_args(**{**x, "dA": x["dA"].to(torch.bfloat16)})


def test_a_missing_bundle_names_the_activation_script(monkeypatch):
    monkeypatch.setitem(sys.modules, "tilelang", None)
    monkeypatch.setitem(sys.modules, "tilelang.language", None)
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)
    for entry in (tl.tilelang, tl.tilelang_wrapper):
        with pytest.raises(UnsupportedInput, match=r"source \.tilelang/activate\.sh"):
            entry(**_args())
