"""The public API refuses bad input with TypeError/ValueError/NotImplementedError naming it."""
import pytest
import torch

from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk
from opgen.references.chunk_gla_fwd_o_gk import make_inputs


@pytest.fixture()
def x():
    inputs = make_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=0)
    return dict(q=inputs["q"], v=inputs["v"], g=inputs["g"], A=inputs["A"], h=inputs["h"], chunk_size=32)


def _call(x, **changes):
    return chunk_gla_fwd_o_gk(**{**x, **changes})


@pytest.mark.parametrize("change, exc, pattern", [
    (lambda x: {"q": x["q"].float()}, TypeError, r"q\.dtype must be one of float16, bfloat16, got torch\.float32"),
    (lambda x: {"v": x["v"].bfloat16()}, TypeError, r"v must have the dtype of q \(float16\), got bfloat16"),
    (lambda x: {"g": x["g"].half()}, TypeError, r"g\.dtype must be one of float32"),
    (lambda x: {"q": x["q"][0]}, ValueError, r"q must have 4 dims \[B, T, H, K\], got shape \(40, 2, 32\)"),
    (lambda x: {"h": x["h"][:, :1]}, ValueError, r"h\.shape\[1\] must be NT = 2 \(from cdiv\(T, BT\)\), got 1"),
    (lambda x: {"A": x["A"][..., :16].contiguous()}, ValueError, r"A\.shape\[3\] must be BT = 32 \(from chunk_size\), got 16"),
    (lambda x: {"v": x["v"][:, :39]}, ValueError, r"v\.shape\[1\] must be T = 40 \(from q\.shape\[1\]\), got 39"),
    (lambda x: {"q": x["q"].tolist()}, TypeError, r"q must be a torch\.Tensor, got list"),
    (lambda x: {"q": x["q"].to_sparse()}, TypeError, r"q must be a dense tensor \(the kernels index memory through strides\), got torch\.sparse_coo: pass q\.to_dense\(\)"),
    (lambda x: {"A": x["A"].to_sparse(2)}, TypeError, r"A must be a dense tensor .*got torch\.sparse_coo"),
    (lambda x: {"chunk_size": 48}, ValueError, r"chunk_size must be one of 32, 64, got 48"),
    (lambda x: {"chunk_size": True}, TypeError, r"chunk_size must be an int, got bool True"),
    (lambda x: {"chunk_size": 32.0}, TypeError, r"chunk_size must be an int, got float 32\.0"),
    (lambda x: {"use_exp2": 1}, TypeError, r"use_exp2 must be a bool, got int 1"),
    (lambda x: {"scale": "0.1"}, TypeError, r"scale must be a float, got str"),
    (lambda x: {"scale": float("nan")}, ValueError, r"scale must be a finite float32 value \(\|scale\| <= 3.402823e\+38: the kernels take it in float32\), got nan"),
    (lambda x: {"scale": float("inf")}, ValueError, r"scale must be a finite float32 value \(\|scale\| <= 3.402823e\+38: the kernels take it in float32\), got inf"),
    (lambda x: {"h": x["h"].to("meta")}, ValueError, r"h is on meta but q is on cpu"),
])
def test_bad_input_names_the_argument(x, change, exc, pattern):
    with pytest.raises(exc, match=r"^chunk_gla_fwd_o_gk: " + pattern):
        _call(x, **change(x))


def test_zero_length_sequence(x):
    empty = {k: (v[:, :0] if k != "chunk_size" else v) for k, v in x.items()}
    empty["h"] = x["h"][:, :0]
    with pytest.raises(ValueError, match="every dimension must be positive, got B=1 T=0"):
        _call(empty)


def test_cpu_needs_the_interpreter(x, monkeypatch):
    import generated.chunk_gla_fwd_o_gk as api

    monkeypatch.setattr(api, "_TABLE_CACHE", {})
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(NotImplementedError, match="CPU tensors run only under the Triton interpreter"):
        _call(x)


def test_device_without_table(x):
    meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    with pytest.raises(NotImplementedError, match="no dispatch table for device type 'meta'"):
        _call(meta)


def test_unknown_gpu_has_no_table(x, monkeypatch):
    import generated.chunk_gla_fwd_o_gk as api

    class FakeCuda:
        @staticmethod
        def get_device_name(device):
            return "NVIDIA A100-SXM4-80GB"

    monkeypatch.setattr(api.torch, "cuda", FakeCuda)
    with pytest.raises(NotImplementedError, match="no dispatch table for device 'NVIDIA A100-SXM4-80GB'"):
        api._table(torch.device("cuda", 0))


def test_tables_are_per_chip():
    import generated.chunk_gla_fwd_o_gk.table_ascend910b3 as b3
    import generated.chunk_gla_fwd_o_gk.table_h200 as h200
    import generated.chunk_gla_fwd_o_gk.table_interpreter as cpu

    assert (b3.CHIP, b3.RENDERING, b3.BUDGET_KIND, b3.BUDGET) == ("ascend910b3", "npu", "ub_bytes", 196608)
    assert (h200.CHIP, h200.RENDERING, h200.BUDGET_KIND) == ("h200", "cuda", "smem_bytes")
    assert (cpu.RENDERING, cpu.BUDGET, cpu.PROGRAMS) == ("npu", None, 4)


def test_default_choice_reproduces_the_seed_on_ascend():
    import generated.chunk_gla_fwd_o_gk as api

    params = dict(B=2, T=256, H=4, K=96, V=160, scale=0.125, chunk_size=64, use_exp2=False,
                  q_dtype="float16", v_dtype="float16", g_dtype="float32", A_dtype="float32",
                  h_dtype="float32", BT=64, NT=4, dtype="float16", es=2)
    variant, point = api._default_npu(196608, 20, **params)
    assert variant == "split_general_persistent"
    assert (point["BK"], point["BV"]) == (64, 32)
    variant, _ = api._default_npu(196608, 20, **{**params, "scale": 1.5})
    assert variant == "post_general_persistent"


@pytest.mark.parametrize("K, BK", [(16, 16), (24, 32), (32, 32)])
def test_a_row_takes_the_tunables_its_variant_fixes_at_the_call(x, monkeypatch, K, BK):
    """A table row serves every shape of its bucket: vloop's one K tile, a row measured at K = 32
    with BK = 32, runs pow2(K) wide at each K of the K <= 32 bucket; the tunables the variant
    leaves free stay the row's."""
    import generated.chunk_gla_fwd_o_gk as api

    row = ("fold_vloop_persistent", {"BK": 32, "BV": 32, "DOT_PRECISION": "ieee", "A_PAIR": True,
                                     "EARLY_INTRA": True, "EVICT_H": False, "TRIL_LOAD": False,
                                     "multibuffer": True, "occupancy": 1})
    launched = []

    class Module:
        @staticmethod
        def launch(point, **_):
            launched.append(point)

    monkeypatch.setattr(api, "_lookup", lambda table, key: row)
    monkeypatch.setattr(api, "_kernel_module", lambda rendering, variant: Module)
    inputs = make_inputs(1, 40, 2, K, 32, 32, dtype=torch.float16, seed=0)
    _call(x, **{k: inputs[k] for k in ("q", "v", "g", "A", "h")})
    assert launched == [{**row[1], "BK": BK}] and row[1]["BK"] == 32


def test_a_sparse_tensor_is_refused_after_a_call_of_its_shape_was_seen(x):
    with torch.no_grad():
        _call(x, h=x["h"].transpose(-1, -2).contiguous().transpose(-1, -2))  # a strided h's signature, seen
        with pytest.raises(TypeError, match=r"^chunk_gla_fwd_o_gk: h must be a dense tensor .*got torch\.sparse_coo"):
            _call(x, h=x["h"].to_sparse())


@pytest.mark.parametrize("name", ["q", "A"])
def test_shapes_are_checked_before_a_strided_view_is_copied(x, name):
    huge = x[name].reshape(-1)[:1].expand(2 ** 40, *x[name].shape[1:])  # every stride 0: a copy of petabytes
    with pytest.raises(ValueError, match=r"^chunk_gla_fwd_o_gk: \w+\.shape\[0\] must be B = "):
        _call(x, **{name: huge})


def test_a_call_too_large_for_memory_is_named_by_the_op(x):
    """Shapes that agree with each other but need more memory than the device has (every input a
    view expanded to B = 2**40): the allocator's error, led by the op's name, of its own type."""
    big = {name: t.expand(2**40, *t.shape[1:]) for name, t in x.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(RuntimeError, match=r"^chunk_gla_fwd_o_gk: the inputs' contiguous copies and the outputs "
                                           r"do not fit in the device's memory: .*allocate"):
        _call(x, **big)
