"""The TileLang baselines of mamba3_mimo_bwd_bwd without TileLang: the conversion to and from
upstream's kernel arguments, what it refuses and why, the error when the bundle is missing, and
their place in the spec. CPU only."""
import dataclasses
import inspect
import sys
from pathlib import Path

import pytest
import torch

from opgen.baselines import mamba3_mimo_bwd_bwd as tl
from opgen.errors import UnsupportedInput
from opgen.references.mamba3_mimo_bwd_bwd import make_inputs
from opgen.spec.spec import load_spec
from opgen.run.worker import resolve

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(B=2, S=16, H=4, G=2, N=32, P=4, R=2, chunk_size=8)


def _args(has_z=True, has_d=True, dtype=torch.bfloat16, **sizes):
    inputs = make_inputs(**{**SIZES, **sizes}, dtype=dtype, has_z=has_z, has_d=has_d)
    return {**inputs, "output_dtype": torch.float32}


@pytest.fixture(scope="module")
def args():
    return _args()


def test_to_upstream_passes_inputs_through_in_the_kernels_order_and_allocates_its_buffers(args):
    config, up = tl.to_upstream(**args)
    assert config == tl.KernelConfig(N=32, P=4, R=2, has_z=True, has_d=True, chunk_size=8,
                                     rotary_dim_divisor=4, dtype="bfloat16", threads=256)
    assert tuple(up) == tl.UPSTREAM_ARGS and len(up) == 31
    for name in ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "mimo_z",
                 "angles", "da_cs", "da_cs_rev", "dt", "d", "segsum"):
        assert up[name] is args[name], name  # contiguous and of the right dtype: the same tensor
    B, S, H, N, P, R, C = 2, 16, 4, 32, 4, 2, 8
    bf, f32 = torch.bfloat16, torch.float32
    want = {"dq": ((B, S * R, H, N), bf), "dk": ((B, S * R, H, N), bf), "dv": ((B, S, H, P), bf),
            "dmimo_v": ((B, H, R, P), f32), "dangles": ((B, S, H, N // 4), f32),
            "dfactor": ((B, H, S), f32), "dgamma_diag": ((B, H, S), f32), "dda": ((B, H, S), f32),
            "dssda": ((B, H, S // C, C, C), f32), "dda_cs_rev": ((B, H, S), f32),
            "dda_cs": ((B, H, S), f32), "dd": ((B, H), f32),
            "states": ((B, H, S // C, N, P), bf), "qk_dot": ((B, H, S, R, R), bf),
            "trap": ((B, H, S), bf)}
    for name, (shape, dtype) in want.items():
        assert (tuple(up[name].shape), up[name].dtype) == (shape, dtype), name
        assert up[name].is_contiguous(), name
    for name in ("dangles", "dfactor", "dgamma_diag", "dda", "dssda", "dda_cs_rev", "dda_cs"):
        assert not up[name].any(), name  # zero-filled, as mamba_mimo_bwd_combined allocates them
    # states, qk_dot and trap: ours rounded to the input dtype (upstream's first stage writes bf16)
    for name in ("states", "qk_dot", "trap"):
        assert torch.equal(up[name], args[name].to(bf)), name
    assert config.builder_args("B", "S", "H", "G") == ("B", "S", "H", "G", 32, 4, 2, True, True, True,
                                                        8, 4, "bfloat16", 256, 0)


def test_dq_and_dk_are_the_kernels_row_t_times_r_plus_r_buffers_seen_as_ours(args):
    """Upstream writes dq[b, t*R + r, h, n]; we read dq[b, t, r, h, n] of the same memory."""
    _, up = tl.to_upstream(**args)
    B, S, R, H, N = 2, 16, 2, 4, 32
    rows = torch.arange(S * R, dtype=torch.float32).view(1, S * R, 1, 1)
    for name in ("dq", "dk"):
        up[name].copy_(rows.expand(B, S * R, H, N))
    out = dict(zip(tl.OUTPUTS, tl.from_upstream(up)))
    t, r = torch.meshgrid(torch.arange(S), torch.arange(R), indexing="ij")
    for name in ("dq", "dk"):
        assert out[name].shape == (B, S, R, H, N), name
        assert out[name].data_ptr() == up[name].data_ptr(), name  # a view, no copy
        assert torch.equal(out[name][0, :, :, 0, 0].float(), (t * R + r).float()), name


def test_from_upstream_returns_the_buffers_in_our_order_and_masks_dssda_to_key_before_query(args):
    _, up = tl.to_upstream(**args)
    for i, name in enumerate(tl.UPSTREAM_ARGS):
        if name in tl.OUTPUTS and up[name] is not None:
            up[name].fill_(float(i + 1))  # what the kernel would write
    out = tl.from_upstream(up)
    assert len(out) == len(tl.OUTPUTS) == 12
    for name, t in zip(tl.OUTPUTS, out):
        want = float(tl.UPSTREAM_ARGS.index(name) + 1)
        if name == "dssda":
            C = t.shape[-1]
            key_first = torch.ones(C, C, dtype=torch.bool).triu(1)  # [key u, query t]: u < t
            assert bool((t[..., key_first] == want).all()) and not t[..., ~key_first].any()
        else:
            assert bool((t == want).all()), name


def test_without_z_or_d_the_optional_tensors_are_none():
    config, up = tl.to_upstream(**_args(has_z=False, has_d=False))
    assert (config.has_z, config.has_d) == (False, False)
    assert [n for n, t in up.items() if t is None] == ["z", "mimo_z", "d", "dd"]
    out = dict(zip(tl.OUTPUTS, tl.from_upstream(up)))
    assert out["dd"] is None and out["dq"].shape == (2, 16, 2, 4, 32)


def test_strided_inputs_become_contiguous_and_half_states_pass_through(args):
    q_strided = args["q"].transpose(0, 1).contiguous().transpose(0, 1)
    states = args["states"].to(torch.bfloat16)
    assert not q_strided.is_contiguous()
    _, up = tl.to_upstream(**{**args, "q": q_strided, "states": states})
    assert up["q"].is_contiguous() and torch.equal(up["q"], q_strided)
    assert up["states"] is states


def test_a_kept_cast_is_reused_for_the_same_tensor_and_dropped_with_it(args):
    cast = tl._CastOnce()
    states = args["states"].clone()
    first = cast("states", states, torch.bfloat16)
    assert cast("states", states, torch.bfloat16) is first  # the timed calls: no second cast
    states.mul_(2)  # a new version of the same tensor: cast again
    again = cast("states", states, torch.bfloat16)
    assert again is not first and torch.equal(again, states.to(torch.bfloat16))
    trap32 = args["trap"].float()  # trap, [B,H,S], is cast on every call
    assert cast("trap", trap32, torch.bfloat16) is not cast("trap", trap32, torch.bfloat16)
    del states
    assert "states" not in cast._kept


@pytest.mark.parametrize("change, message", [
    (dict(dtype=torch.float32), "float16 or bfloat16"),
    (dict(S=20), "not a multiple of chunk_size"),
    (dict(N=16), "N=16 is below 32.*m_warp \\* n_warp must equal num_warps"),
])
def test_inputs_upstream_does_not_take_are_refused_with_the_reason(change, message):
    with pytest.raises(UnsupportedInput, match=message):
        tl.to_upstream(**_args(**change))


def test_half_a_z_gate_is_refused(args):
    with pytest.raises(UnsupportedInput, match="needs both mimo_z and z, got only mimo_z"):
        tl.to_upstream(**{**args, "z": None})
    with pytest.raises(UnsupportedInput, match="needs both mimo_z and z, got only z"):
        tl.to_upstream(**{**args, "mimo_z": None})


def test_a_missing_bundle_names_the_activation_script(monkeypatch, args):
    monkeypatch.setitem(sys.modules, "tilelang", None)  # import tilelang raises ImportError
    monkeypatch.setitem(sys.modules, "tilelang.language", None)
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)
    with pytest.raises(UnsupportedInput, match=r"source \.tilelang/activate\.sh"):
        tl.tilelang(**args)
    with pytest.raises(UnsupportedInput, match="tilelang 0.1.8"):
        tl.tilelang_static(**args)
    with pytest.raises(UnsupportedInput, match="tilelang 0.1.8"):
        tl.compiled(tl.KernelConfig(32, 4, 2, True, True, 8, 4, "bfloat16", threads=256))


def test_kernels_are_built_once_per_configuration_dynamic_or_per_shape(monkeypatch):
    built = []

    class FakeT:
        @staticmethod
        def dynamic(name):
            return f"dyn:{name}"

    def builder(*a):
        built.append(a)
        return object()

    monkeypatch.setattr(tl, "_KERNELS", {})
    monkeypatch.setattr(tl, "_import_builder", lambda: (builder, FakeT))
    config = tl.kernel_config(32, 4, 2, 16, False, True, 8, 4, "float16")
    assert tl.compiled(config) is tl.compiled(config)
    static = dataclasses.replace(config, shape=(2, 16, 4, 1))
    assert tl.compiled(static) is tl.compiled(static)
    assert built == [("dyn:B", "dyn:S", "dyn:H", "dyn:G", 32, 4, 2, False, True, True, 8, 4, "float16", 256, 0),
                     (2, 16, 4, 1, 32, 4, 2, False, True, True, 8, 4, "float16", 256, 0)]


def test_cpu_tensors_are_refused_once_the_bundle_imports(monkeypatch, args):
    monkeypatch.setattr(tl, "_import_builder", lambda: (None, None))
    with pytest.raises(UnsupportedInput, match="CUDA devices only"):
        tl.tilelang(**args)
    with pytest.raises(UnsupportedInput, match="CUDA devices only"):
        tl.tilelang_static(**args)


def test_the_spec_names_both_baselines_and_case_sets_upstream_takes():
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_bwd.yaml", ROOT)
    assert resolve(spec.baselines["tilelang"]) is tl.tilelang
    assert resolve(spec.baselines["tilelang_static"]) is tl.tilelang_static
    params = list(inspect.signature(tl.tilelang).parameters)
    assert params == [*spec.signature.tensors, *spec.signature.scalars]
    assert tl.OUTPUTS == tuple(spec.signature.outputs)
    plain, with_z = spec.expand_cases("upstream_small"), spec.expand_cases("upstream_small_z")
    assert len(plain) == len(with_z) == 4
    assert with_z == [{**row, "mimo_z_given": True, "z_given": True} for row in plain]
    for row in plain:  # each one a case the baseline takes (whole chunks, N >= 32, half dtype)
        tl.kernel_config(row["N"], row["P"], row["R"], row["S"], False, True, row["chunk_size"], 4,
                         row["dtype"])
