"""The TileLang baseline of mamba3_mimo_bwd_fwd without TileLang: the conversion to and from
upstream's kernel arguments, what it refuses, the error when the bundle is missing, and its place
in the spec. CPU only."""
import dataclasses
import inspect
import sys
from pathlib import Path

import pytest
import torch

from opgen.baselines import mamba3_mimo_bwd_fwd as tl
from opgen.errors import UnsupportedInput
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs
from opgen.spec.spec import load_spec
from opgen.run.worker import resolve

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(B=2, S=32, H=4, G=2, N=8, P=4, R=2, chunk_size=8)


def _args(has_z=True, has_d=True, dtype=torch.bfloat16, **sizes):
    inputs = make_inputs(**{**SIZES, **sizes}, dtype=dtype, has_z=has_z, has_d=has_d)
    return {**inputs, "output_dtype": torch.float32}


def test_to_upstream_passes_inputs_through_in_the_kernels_order_and_allocates_its_outputs():
    args = _args()
    config, up = tl.to_upstream(**args)
    assert config == tl.KernelConfig(N=8, P=4, R=2, has_z=True, has_d=True, chunk_size=8,
                                     rotary_dim_divisor=4, dtype="bfloat16")
    assert tuple(up) == tl.UPSTREAM_ARGS
    for name in ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "mimo_z",
                 "angles", "da_cs", "da_cs_rev", "dt", "trap", "d", "segsum"):
        assert up[name] is args[name], name  # contiguous and of the right dtype: the same tensor
    B, S, H, N, P, R = 2, 32, 4, 8, 4, 2
    want = {"states": ((B, H, S // 8, N, P), torch.bfloat16), "qk_dot": ((B, H, S, R, R), torch.bfloat16),
            "dmimo_o": ((B, H, R, P), torch.float32), "dmimo_z": ((B, H, R, P), torch.float32),
            "dz": ((B, S, H, P), torch.bfloat16)}
    for name, (shape, dtype) in want.items():
        assert (tuple(up[name].shape), up[name].dtype) == (shape, dtype), name
    assert not up["qk_dot"].any()  # zero-filled, as mamba_mimo_bwd_combined allocates it
    assert config.builder_args("B", "S", "H", "G") == ("B", "S", "H", "G", 8, 4, 2, True, True, True,
                                                        8, 4, "bfloat16", 128, 0)


def test_from_upstream_returns_the_kernels_outputs_as_our_tuple():
    config, up = tl.to_upstream(**_args())
    for i, name in enumerate(("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")):
        up[name].copy_(torch.full_like(up[name], float(i + 1)))  # what the kernel would write
    out = tl.from_upstream(up)
    assert len(out) == 5
    for i, (name, t) in enumerate(zip(tl.OUTPUTS, out)):
        assert t is up[name] and bool((t == i + 1).all()), name


def test_without_z_or_d_the_optional_tensors_are_none():
    config, up = tl.to_upstream(**_args(has_z=False, has_d=False))
    assert (config.has_z, config.has_d) == (False, False)
    assert [n for n, t in up.items() if t is None] == ["z", "mimo_z", "dz", "dmimo_z", "d"]
    states, qk_dot, dmimo_o, dmimo_z, dz = tl.from_upstream(up)
    assert dmimo_z is None and dz is None and states.shape == (2, 4, 4, 8, 4)


def test_trap_goes_in_the_input_dtype_and_strided_inputs_become_contiguous():
    args = _args()
    trap32 = args["trap"].float() + 1e-3  # not representable in bf16
    q_strided = args["q"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not q_strided.is_contiguous()
    _, up = tl.to_upstream(**{**args, "trap": trap32, "q": q_strided})
    assert up["trap"].dtype == torch.bfloat16 and torch.equal(up["trap"], trap32.to(torch.bfloat16))
    assert up["q"].is_contiguous() and torch.equal(up["q"], q_strided)


@pytest.mark.parametrize("change, message", [
    (dict(dtype=torch.float32), "float16 or bfloat16"),
    (dict(S=30), "not a multiple of chunk_size"),
])
def test_inputs_upstream_does_not_take_are_refused(change, message):
    with pytest.raises(UnsupportedInput, match=message):
        tl.to_upstream(**_args(**change))


def test_half_a_z_gate_is_refused():
    args = _args()
    with pytest.raises(UnsupportedInput, match="needs both mimo_z and z, got only mimo_z"):
        tl.to_upstream(**{**args, "z": None})


def test_a_missing_bundle_names_the_activation_script(monkeypatch):
    monkeypatch.setitem(sys.modules, "tilelang", None)  # import tilelang raises ImportError
    monkeypatch.setitem(sys.modules, "tilelang.language", None)
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)
    with pytest.raises(UnsupportedInput, match=r"source \.tilelang/activate\.sh"):
        tl.tilelang(**_args())
    with pytest.raises(UnsupportedInput, match="tilelang 0.1.8"):
        tl.compiled(tl.KernelConfig(8, 4, 2, True, True, 8, 4, "bfloat16"))


def test_the_kernel_is_built_once_per_configuration_with_dynamic_batch_sequence_and_heads(monkeypatch):
    built = []

    class FakeT:
        @staticmethod
        def dynamic(name):
            return f"dyn:{name}"

    def builder(*args):
        built.append(args)
        return object()

    monkeypatch.setattr(tl, "_KERNELS", {})
    monkeypatch.setattr(tl, "_import_builder", lambda: (builder, FakeT))
    config = tl.KernelConfig(8, 4, 2, False, True, 8, 4, "float16")
    first = tl.compiled(config)
    assert tl.compiled(config) is first
    assert built == [("dyn:B", "dyn:S", "dyn:H", "dyn:G", 8, 4, 2, False, True, True, 8, 4, "float16", 128, 0)]


def test_cpu_tensors_are_refused_once_the_bundle_imports(monkeypatch):
    monkeypatch.setattr(tl, "_import_builder", lambda: (None, None))
    with pytest.raises(UnsupportedInput, match="CUDA devices only"):
        tl.tilelang(**_args())


def test_the_spec_names_the_baseline_and_the_z_case_set():
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    fn = resolve(spec.baselines["tilelang"])
    assert fn is tl.tilelang
    assert list(inspect.signature(fn).parameters) == [*spec.signature.tensors, *spec.signature.scalars]
    assert tl.OUTPUTS == tuple(spec.signature.outputs)
    official, with_z = spec.expand_cases("official"), spec.expand_cases("official_z")
    assert len(with_z) == len(official) == 11
    assert with_z == [{**row, "mimo_z_given": True, "z_given": True} for row in official]


def test_the_static_baseline_builds_one_kernel_per_shape_with_constant_dims(monkeypatch):
    """tilelang_static compiles for the call's B, S, H, G; the device check comes first."""
    built = []

    def builder(*args):
        built.append(args)
        return object()

    monkeypatch.setattr(tl, "_KERNELS", {})
    monkeypatch.setattr(tl, "_import_builder", lambda: (builder, None))
    config = dataclasses.replace(tl.KernelConfig(8, 4, 2, False, True, 8, 4, "float16"), shape=(2, 16, 4, 1))
    assert tl.compiled(config) is tl.compiled(config)
    assert built == [(2, 16, 4, 1, 8, 4, 2, False, True, True, 8, 4, "float16", 128, 0)]
    with pytest.raises(UnsupportedInput, match="CUDA devices only"):
        tl.tilelang_static(**_args())
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    assert resolve(spec.baselines["tilelang_static"]) is tl.tilelang_static
