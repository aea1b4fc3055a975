"""The generated API's short path: a call whose signature (shapes, dtypes, devices, scalars'
types and values) was seen before goes straight to the kernels its first call chose, with the
same outputs; any other call runs every check, so a bad argument is still named."""
import pytest
import torch

from opgen.evidence.launches import recording
from opgen.references.chunk_gla_fwd_o_gk import make_inputs


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture()
def gla(monkeypatch):
    """The generated GLA module with an empty signature cache and its kernels' launches counted."""
    import generated.chunk_gla_fwd_o_gk as module

    monkeypatch.setattr(module, "_SEEN", {})
    launches = []
    real = module._kernel_module

    def counted(rendering, variant, strided=False):
        launches.append(variant + " strided" * strided)
        return real(rendering, variant, strided)
    monkeypatch.setattr(module, "_kernel_module", counted)
    return module, launches


def test_a_seen_signature_skips_the_checks_and_runs_the_same_kernels(gla, monkeypatch):
    module, launches = gla
    x = make_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=3)
    first = module.chunk_gla_fwd_o_gk(**x)
    assert len(module._SEEN) == 1 and len(launches) == 1
    checked = module._tensor
    monkeypatch.setattr(module, "_tensor", None)  # the checks are not run again: calling it would fail
    y = make_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=4)  # other values, same signature
    second = module.chunk_gla_fwd_o_gk(**y)
    again = module.chunk_gla_fwd_o_gk(**x)
    assert len(launches) == 1 and len(module._SEEN) == 1  # no lookup, no new entry
    assert torch.equal(again, first) and not torch.equal(second, first)
    monkeypatch.setattr(module, "_tensor", checked)
    transposed = x["q"].transpose(1, 2).contiguous().transpose(1, 2)  # not contiguous: a signature of its own
    assert torch.equal(module.chunk_gla_fwd_o_gk(**{**x, "q": transposed}), first)
    assert len(module._SEEN) == 2 and launches[1:] == [launches[0], launches[0] + " strided"]


def test_a_seen_strided_signature_runs_the_twin_unless_its_copies_leave_every_input_contiguous(gla):
    """The signature holds whether each input is contiguous, not its strides: among calls of one
    strided signature, one whose only non-contiguous input has a last stride other than 1 (copied)
    runs the contiguous module, one with a view read in place the strided twin."""
    module, launches = gla
    x = make_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=3)
    first = module.chunk_gla_fwd_o_gk(**x)
    every_other = torch.empty(*x["q"].shape[:-1], 2 * x["q"].shape[-1], dtype=x["q"].dtype)[..., ::2]
    every_other.copy_(x["q"])  # last stride 2: copied
    sliced = torch.cat([x["q"], x["q"]], dim=-1)[..., :32]  # last stride 1: read in place
    for q in (every_other, sliced, every_other, sliced):
        assert torch.equal(module.chunk_gla_fwd_o_gk(**{**x, "q": q}), first)
        with recording() as seen:  # the launch's arguments, the kernel not run
            module.chunk_gla_fwd_o_gk(**{**x, "q": q})
        (launch,) = seen
        in_place = launch.kwargs["q"].data_ptr() == q.data_ptr()
        assert in_place == (q is sliced) and ("stride_q_t" in launch.kwargs) == in_place
    assert len(module._SEEN) == 2  # the contiguous signature and one strided one


@pytest.mark.parametrize("change, error, match", [
    (dict(use_exp2=1), TypeError, "use_exp2"),  # equal to True, but no bool
    (dict(scale=[0.1]), TypeError, "scale"),  # unhashable
    (dict(chunk_size=48), ValueError, "chunk_size must be one of 32, 64"),
    (dict(q="q"), TypeError, "q"),
])
def test_a_call_off_the_seen_signatures_runs_every_check(gla, change, error, match):
    module, launches = gla
    x = make_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=3)
    module.chunk_gla_fwd_o_gk(**x, use_exp2=True)
    with pytest.raises(error, match=match):
        module.chunk_gla_fwd_o_gk(**{**x, "use_exp2": True, **change})
    assert len(launches) == 1 and len(module._SEEN) == 1


def test_the_signature_cache_is_bounded(gla, monkeypatch):
    module, launches = gla
    monkeypatch.setattr(module, "_SEEN_MAX", 2)
    for T in (40, 41, 42):
        module.chunk_gla_fwd_o_gk(**make_inputs(1, T, 1, 16, 16, 32, dtype=torch.float16, seed=T))
    assert len(launches) == 3 and len(module._SEEN) == 1  # full at the third: emptied, then its own


def test_an_input_that_requires_grad_is_refused_while_grad_mode_is_on(gla):
    """The op has no backward: an input that requires grad under grad mode is refused by name (its
    gradient through the op would silently be missing), also after the same shapes were seen;
    under torch.no_grad() or detached it runs, and the mamba3 stage likewise."""
    module, launches = gla
    x = make_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=3)
    first = module.chunk_gla_fwd_o_gk(**x)
    h = x["h"].clone().requires_grad_()
    with pytest.raises(NotImplementedError, match=r"chunk_gla_fwd_o_gk: h requires grad, but the op has no "
                                                  r"backward .* torch\.no_grad\(\) or on h\.detach\(\)"):
        module.chunk_gla_fwd_o_gk(**{**x, "h": h})
    with torch.no_grad():
        assert torch.equal(module.chunk_gla_fwd_o_gk(**{**x, "h": h}), first)
    assert torch.equal(module.chunk_gla_fwd_o_gk(**{**x, "h": h.detach()}), first)
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd
    from opgen.references.mamba3_mimo_bwd_fwd import make_inputs as mamba3_inputs

    y = mamba3_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, has_z=False, seed=5)
    with pytest.raises(NotImplementedError, match=r"mamba3_mimo_bwd_fwd: dt requires grad"):
        mamba3_mimo_bwd_fwd(**{**y, "dt": y["dt"].clone().requires_grad_()})
