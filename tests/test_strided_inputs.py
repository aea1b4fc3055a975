"""Strided inputs (a slice of a fused projection, a transposed view) give exactly the outputs of
their contiguous copies, for the ops under the interpreter; the caller's tensors are not changed.
GLA reads its views in place (the strided twins): every input sliced out of a fused tensor or
transposed, on tails and odd H, against the float64 golden; the kernel receives the view's own
storage and strides (no copy), a last stride other than 1 is copied once; the cuda twins of a few
variants (the descriptor grids' in the interpreter that knows them) equal their contiguous modules.
mamba3_mimo_bwd_fwd and mamba3_mimo_bwd_bwd read their activations in place the same way."""
import functools
import importlib
from pathlib import Path

import pytest
import torch

from opgen.space import space
from opgen.run.accuracy import check_all
from opgen.spec.hardware import profile
from opgen.evidence.launches import recording
from opgen.references.chunk_gla_fwd_o_gk import golden, magnitude, reference_fp32
from opgen.references.chunk_gla_fwd_o_gk import make_inputs as gla_inputs
from opgen.references.mamba3_mimo_bwd_bwd import OUTPUTS as BWD_BWD_OUTPUTS
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs as mamba3_inputs
from opgen.spec.spec import load_spec

from numerics import descriptor_interpreter

ROOT = Path(__file__).resolve().parents[1]
GLA = ["q", "v", "g", "A", "h"]


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


def _every_other(x):
    """x's values every other element of a tensor twice as wide in its last dim (last stride 2)."""
    view = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)[..., ::2]
    view.copy_(x)
    return view


def _twice_counting_copies(fn, views):
    """fn(**views) twice, the second on the seen signature's path and recorded (not run): the first
    call's outputs, the second's launches and how many tensors .contiguous() copied in all."""
    copies = []
    real = torch.Tensor.contiguous

    def counted(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        copies.append(out is not self)
        return out
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "contiguous", counted)
        outs = fn(**views)
        with recording() as launches:
            fn(**views)
    return outs, launches, copies.count(True)


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
    from opgen.spec.spec import load_spec
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for op in ("chunk_gla_fwd_o_gk", "mamba3_mimo_bwd_fwd", "mamba3_mimo_bwd_bwd"):
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
    for name in ("q", "k", "v", "dout", "z", "angles"):  # the spec's api.strided: read in place
        assert not seen[0][name].is_contiguous() and torch.equal(seen[0][name], x[name]), name
        assert seen[1][name] is seen[0][name], name  # made once, reused by every timed call
    for name in ("dt", "segsum", "q_bias", "mimo_v", "d"):  # what the op would copy passes as it is
        assert seen[0][name] is x[name], name


# --- GLA: the strided twins ----------------------------------------------------------------------
def _fused(x):
    """GLA's inputs as views in place: q and v the two parts of one fused [B, T, H, K + V]
    projection; g, A and h the first part of a tensor wider in its last dim (A's rows, h's rows
    of K x V, padded to 16 bytes past their width, so the descriptor grids take them too)."""
    q, v = x["q"], x["v"]
    K, V = q.shape[-1], v.shape[-1]
    fused = torch.cat([q, v], dim=-1)
    out = {**x, "q": fused[..., :K], "v": fused[..., K:]}
    for name in ("g", "A", "h"):
        t = x[name]
        wide = torch.full((*t.shape[:-1], t.shape[-1] + 4), 7.0, dtype=t.dtype)
        wide[..., :t.shape[-1]] = t
        out[name] = wide[..., :t.shape[-1]]
    return out


def _transposed_all(x):
    """GLA's inputs as transposed views: dims 1 and 2 (tokens or chunks, and heads) swapped in
    memory; with one head (where that is no change) dims 0 and 1, the batch and the tokens."""
    a, b = (1, 2) if x["q"].shape[2] > 1 else (0, 1)
    return {**x, **{n: x[n].transpose(a, b).contiguous().transpose(a, b) for n in GLA}}


LAYOUTS = {"fused": _fused, "transposed": _transposed_all}


def _golden_check(o, x, use_exp2=False):
    args = dict(q=x["q"], v=x["v"], g=x["g"], A=x["A"], h=x["h"], scale=x["scale"],
                chunk_size=x["chunk_size"], use_exp2=use_exp2)
    report = check_all(o, golden(**args), reference_fp32(**args), magnitude(**args))
    assert report.passed, report.summary()


# (B, T, H, K, V, C): T not a multiple of C; odd H; H = 1 (the h1 shape); K past 64 (general)
GLA_SHAPES = [(2, 45, 3, 48, 40, 32), (2, 45, 1, 96, 40, 32), (1, 70, 3, 80, 72, 64)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", GLA_SHAPES, ids=["B{}-T{}-H{}-K{}-V{}-C{}".format(*s) for s in GLA_SHAPES])
def test_gla_reads_every_input_in_place(layout, shape):
    """Each input a view (none contiguous): the output is the contiguous call's and meets the
    golden checks, and the launched kernel got each view itself (its storage, offset and strides)."""
    import generated.chunk_gla_fwd_o_gk as module

    x = gla_inputs(*shape, dtype=torch.float16, seed=sum(shape))
    views = LAYOUTS[layout](x)
    assert not any(views[n].is_contiguous() for n in GLA)
    o = module.chunk_gla_fwd_o_gk(**views)
    assert torch.equal(o, module.chunk_gla_fwd_o_gk(**x))
    _golden_check(o, x)
    with recording() as launches:
        module.chunk_gla_fwd_o_gk(**views)
    (launch,) = launches
    assert launch.kernel.fn.__module__.startswith("generated.chunk_gla_fwd_o_gk.kernels.npu.strided.")
    args, _ = launch.split()
    for name in GLA:
        assert args[name].data_ptr() == views[name].data_ptr() and args[name].stride() == views[name].stride(), name
        strides = {k: v for k, v in args.items() if k.startswith(f"stride_{name}_")}
        expected = {f"stride_{name}_{d}": views[name].stride(i) for i, d in enumerate("bthk" if name == "h" else "bth")}
        assert {f"stride_{name}_b", f"stride_{name}_t"} <= set(strides) <= set(expected), name  # h1: no H stride
        assert strides == {k: expected[k] for k in strides}, name


def test_gla_copies_once_an_input_whose_last_stride_is_not_one():
    """q every other element of a wider tensor (last stride 2) is copied, once; v, g, A and h,
    fused views, are still read in place; the output is the contiguous call's."""
    import generated.chunk_gla_fwd_o_gk as module

    x = gla_inputs(1, 45, 3, 48, 40, 32, dtype=torch.float16, seed=9)
    views = _fused(x)
    views["q"] = every_other = _every_other(x["q"])
    o, launches, copies = _twice_counting_copies(module.chunk_gla_fwd_o_gk, views)
    assert copies == 2  # q, once a call
    assert torch.equal(o, module.chunk_gla_fwd_o_gk(**x))
    args, _ = launches[0].split()
    assert args["q"].is_contiguous() and args["q"].data_ptr() != every_other.data_ptr()
    assert all(args[n].data_ptr() == views[n].data_ptr() for n in GLA[1:])


SPEC = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
LAUNCH_OPTIONS = {n for n, t in SPEC.tunables.items() if t.role == "launch"}
# cuda variants of each shape and grid family (tiled, heads_first, chunks, persistent; the V
# loops; h1), and the descriptor grid, its A through the triangular mask
CUDA_TWINS = [("fold_general_heads_first", (1, 45, 3, 80, 72, 32)), ("post_h1_chunks2", (2, 100, 1, 48, 40, 32)),
              ("fp32_vloop2_persistent", (1, 40, 3, 160, 40, 32)), ("split_vloop_tiled", (1, 45, 3, 48, 72, 32)),
              ("fold_single_tiled", (2, 45, 3, 40, 48, 64)), ("post_general_tma_persistent", (1, 45, 3, 48, 40, 32))]


def _point(variant, shape, **want):
    """A point of ``variant`` on the h200 for ``shape`` (float16) with the options ``want`` where
    the variant leaves them free; ieee fp32 dots (the interpreter's); no launch options."""
    B, T, H, K, V, C = shape
    params = space.evaluate_params(SPEC, space.case_inputs(SPEC, dict(B=B, T=T, H=H, K=K, V=V, chunk_size=C,
                                                                       dtype="float16")))
    feasible, _ = space.points(SPEC, variant, profile("h200"), params)
    best = max(feasible, key=lambda p: sum(p.config.get(k) == v for k, v in want.items()))
    return {k: "ieee" if k == "DOT_PRECISION" else v for k, v in best.config.items() if k not in LAUNCH_OPTIONS}


@pytest.mark.parametrize("name, shape", CUDA_TWINS, ids=[n for n, _ in CUDA_TWINS])
def test_cuda_twin_equals_its_contiguous_module(name, shape):
    """A cuda strided twin on transposed views computes exactly what its contiguous module computes
    on the contiguous tensors; the descriptor grid's (one launch in the interpreter that knows
    descriptors), on the fused views, meets the golden checks."""
    variant = next(v for v in space.variants_for(SPEC, "cuda") if v.name == name)
    point = _point(variant, shape, TRIL_LOAD=True, EARLY_INTRA=True, EVICT_H=True)
    x = gla_inputs(*shape, dtype=torch.float16, seed=sum(shape))
    runs = [(True, _fused(x))] if "tma" in name else [(False, x), (True, _transposed_all(x))]
    outputs = []
    for strided, inputs in runs:
        module = f"generated.chunk_gla_fwd_o_gk.kernels.cuda.{'strided.' if strided else ''}{name}"
        args = dict(**{n: inputs[n] for n in GLA}, o=torch.full_like(x["v"], float("nan")), scale=x["scale"],
                    use_exp2=False, BT=shape[-1], num_programs=3, point=point)
        if "tma" in name:
            outputs.append(descriptor_interpreter.launch(module, **args))
        else:
            importlib.import_module(module).launch(**args)
            outputs.append(args["o"])
    _golden_check(outputs[0], x)
    for o in outputs[1:]:
        assert torch.equal(o, outputs[0])


def test_the_descriptor_twin_takes_aligned_views_and_copies_the_others():
    """The tma twins build their descriptors over a view whose strides are multiples of 16 bytes
    (the fused layout) and copy one that is not, or whose data is not 16-byte aligned."""
    twin = importlib.import_module("generated.chunk_gla_fwd_o_gk.kernels.cuda.strided.fold_general_tma")
    x = gla_inputs(1, 45, 3, 48, 40, 32, dtype=torch.float16, seed=3)
    for name, view in _fused(x).items():
        if name in GLA:
            assert twin._aligned(view) is view, name
    odd = torch.cat([x["g"], x["g"][..., :2]], dim=-1)[..., :48]  # rows of 50 float32: 200 bytes
    shifted = torch.empty(x["q"].numel() + 1, dtype=x["q"].dtype)[1:].view(x["q"].shape)
    for t in (odd, shifted):
        copy = twin._aligned(t)
        assert copy.data_ptr() != t.data_ptr() and copy.is_contiguous() and copy.data_ptr() % 16 == 0


# --- mamba3_mimo_bwd_fwd: the strided twins ------------------------------------------------------
MAMBA3 = ["dout", "q", "k", "v", "angles", "z"]
MAMBA3_SPEC = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
MAMBA3_OUTPUTS = ("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")


def _mamba3_fused(x):
    """The activations as a model hands them over: z, v, q and k the parts of one fused [B, S, F]
    projection (F past their widths), the angles the first part of a wider tensor, dout transposed
    (dims 1 and 2)."""
    names = [n for n in ("z", "v", "q", "k") if x[n] is not None]
    B, S = x["q"].shape[:2]
    fused = torch.cat([x[n].reshape(B, S, -1) for n in names] + [x["q"].new_zeros(B, S, 5)], dim=-1)
    out, start = dict(x), 0
    for n in names:
        width = x[n][0, 0].numel()
        out[n] = fused[..., start:start + width].unflatten(-1, x[n].shape[2:])
        start += width
    out["angles"] = torch.cat([x["angles"], x["angles"][..., :3]], dim=-1)[..., :x["angles"].shape[-1]]
    out["dout"] = x["dout"].transpose(1, 2).contiguous().transpose(1, 2)
    return out


def _mamba3_transposed(x):
    """Each activation a transposed view: its batch and token dims swapped in memory."""
    return {**x, **{n: x[n].transpose(0, 1).contiguous().transpose(0, 1) for n in MAMBA3 if x[n] is not None}}


MAMBA3_LAYOUTS = {"fused": _mamba3_fused, "transposed": _mamba3_transposed}


def _mamba3_golden_check(outs, x):
    from numerics.test_mamba3_mimo_bwd_fwd import _check
    _check(outs, x)


# (B, S, H, G, N, P, R, C, Z): GQA (G < H) with the Z gate and without; a sequence tail
MAMBA3_SHAPES = [(2, 32, 4, 2, 16, 16, 2, 8, True), (2, 24, 4, 1, 8, 16, 4, 8, False), (2, 21, 2, 1, 16, 8, 2, 8, True)]


@pytest.mark.parametrize("layout", sorted(MAMBA3_LAYOUTS))
@pytest.mark.parametrize("shape", MAMBA3_SHAPES, ids=["B{}-S{}-H{}-G{}-N{}-P{}-R{}-C{}-Z{:d}".format(*s) for s in MAMBA3_SHAPES])
def test_mamba3_reads_every_activation_in_place(layout, shape):
    """dout, q, k, v, angles and z views (none contiguous): the outputs are the contiguous call's
    and meet the golden checks; on whole chunks every kernel got each view itself (its storage and
    strides: no copy), on a tail the padding's copies."""
    import generated.mamba3_mimo_bwd_fwd as module

    *dims, C, has_z = shape
    x = mamba3_inputs(*dims, chunk_size=C, dtype=torch.bfloat16, has_z=has_z, seed=sum(dims))
    views = MAMBA3_LAYOUTS[layout](x)
    given = [n for n in MAMBA3 if x[n] is not None]
    assert not any(views[n].is_contiguous() for n in given)
    outs = module.mamba3_mimo_bwd_fwd(**views)
    _same(outs, module.mamba3_mimo_bwd_fwd(**x))
    _mamba3_golden_check(outs, x)
    with recording() as launches:
        module.mamba3_mimo_bwd_fwd(**views)
    assert launches and all(".kernels.npu.strided." in launch.kernel.fn.__module__ for launch in launches)
    tail = dims[1] % C != 0
    for launch in launches:
        args, _ = launch.split()
        for name in given:
            if name not in args:
                continue
            strides = {k: v for k, v in args.items() if k.startswith(f"stride_{name}_")}
            if tail:  # padded to whole chunks: a contiguous copy
                assert args[name].is_contiguous() and args[name].data_ptr() != views[name].data_ptr(), name
                continue
            assert args[name].data_ptr() == views[name].data_ptr() and args[name].stride() == views[name].stride(), name
            dims_of = "btrg" if name in ("q", "k") else "bth"
            assert strides == {f"stride_{name}_{d}": views[name].stride(i) for i, d in enumerate(dims_of)}, name


def test_mamba3_copies_once_an_activation_whose_last_stride_is_not_one():
    """q every other element of a wider tensor (last stride 2) is copied, once a call; the other
    views are read in place; the outputs are the contiguous call's."""
    import generated.mamba3_mimo_bwd_fwd as module

    x = mamba3_inputs(2, 32, 4, 2, 16, 16, 2, chunk_size=8, dtype=torch.bfloat16, has_z=True, seed=9)
    views = _mamba3_fused(x)
    views["q"] = every_other = _every_other(x["q"])
    outs, launches, copies = _twice_counting_copies(module.mamba3_mimo_bwd_fwd, views)
    assert copies == 2  # q, once a call
    _same(outs, module.mamba3_mimo_bwd_fwd(**x))
    for launch in launches:
        args, _ = launch.split()
        if "q" in args:
            assert args["q"].is_contiguous() and args["q"].data_ptr() != every_other.data_ptr()
        for name in ("dout", "k", "v", "angles", "z"):
            if name in args:
                assert args[name].data_ptr() == views[name].data_ptr(), name


# a cuda variant of each family (stage0, the staged pre-processing fused and separate, rankfold,
# aux, nblocked, post, fold, split with its gate kernel, row tiles and prefetch, splitscan)
MAMBA3_TWINS = [("stage0_dynamic_separate", True, {}), ("staged_static_separate", True, {}),
                ("rankfold_static_separate", True, {}), ("aux_static_fused", False, {}),
                ("nblocked_static_fused", True, {}), ("post_dynamic_separate", True, {}),
                ("fold_static_separate", True, {}),
                ("split_static_separate", True, dict(GATE_KERNEL=True, STATE_PREFETCH=True)),
                ("split_static_separate", True, dict(ROW_TILES=True, BLOCK_N=8)),
                ("splitscan_static_separate", False, dict(ROW_TILES=True, STATE_TRANSPOSED=True))]


@pytest.mark.parametrize("name, has_z, point", MAMBA3_TWINS,
                         ids=[f"{n}-Z{z:d}{'-' + '-'.join(p) if p else ''}" for n, z, p in MAMBA3_TWINS])
def test_mamba3_cuda_twin_equals_its_contiguous_module(name, has_z, point):
    """A cuda strided twin on the fused views computes exactly what its contiguous module computes
    on the contiguous tensors (GQA, whole chunks)."""
    from numerics.test_mamba3_mimo_bwd_fwd import _launch

    x = mamba3_inputs(2, 16, 4, 2, 16, 16, 2, chunk_size=8, dtype=torch.bfloat16, has_z=has_z, seed=11)
    point = {"BLOCK_P": 16, "BLOCK_N": 16, "STATE_BLOCK_N": 16, "STATE_BLOCK_P": 16, **point}
    base = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.{name}")
    twin = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.strided.{name}")
    _same(tuple(_launch(twin, _mamba3_fused(x), point=point)), tuple(_launch(base, x, point=point)))


# --- mamba3_mimo_bwd_bwd: the strided twins ------------------------------------------------------
# Two small cases for every test below (the interpreter's time), both with a tail (S = 19, C = 8)
# and GQA (G < H): the Z gate on (B = 1), and off with B = 2 (the transposed layout swaps the batch
# and token dims). (B, S, H, G, N, P, R) by has_z.
BWD_BWD_SHAPES = {True: (1, 19, 2, 1, 16, 16, 2), False: (2, 19, 2, 1, 16, 16, 2)}


@functools.cache
def _bwd_bwd(has_z):
    """The case's inputs and the contiguous call's outputs (computed once, shared by the tests)."""
    from generated.mamba3_mimo_bwd_bwd import mamba3_mimo_bwd_bwd
    from opgen.references.mamba3_mimo_bwd_bwd import make_inputs as bwd_bwd_inputs

    x = bwd_bwd_inputs(*BWD_BWD_SHAPES[has_z], chunk_size=8, dtype=torch.bfloat16, has_z=has_z, seed=21)
    return x, mamba3_mimo_bwd_bwd(**x)


def _bwd_bwd_golden_check(outs, x):
    """The call's outputs against the float64 golden of x (the numerics tests' criteria)."""
    from numerics.test_mamba3_mimo_bwd_bwd import _check
    _check(dict(zip(BWD_BWD_OUTPUTS, outs)), x)


@pytest.mark.parametrize("layout, has_z", [("fused", True), ("transposed", False)], ids=["fused-Z", "transposed-noZ"])
def test_bwd_bwd_reads_every_activation_in_place(layout, has_z):
    """dout, q, k, v, angles and z views (none contiguous), on a tail: the outputs are the
    contiguous call's and meet the golden checks, and the kernel got each view itself (its storage
    and strides: no copy)."""
    import generated.mamba3_mimo_bwd_bwd as module

    x, contiguous = _bwd_bwd(has_z)
    views = MAMBA3_LAYOUTS[layout](x)
    given = [n for n in MAMBA3 if x[n] is not None]
    assert not any(views[n].is_contiguous() for n in given)
    outs = module.mamba3_mimo_bwd_bwd(**views)
    _same(outs, contiguous)
    _bwd_bwd_golden_check(outs, x)
    with recording() as launches:  # the launch without its run
        module.mamba3_mimo_bwd_bwd(**views)
    assert launches and all(".kernels.npu.strided." in launch.kernel.fn.__module__ for launch in launches)
    for launch in launches:
        args, _ = launch.split()
        for name in given:
            assert args[name].data_ptr() == views[name].data_ptr() and args[name].stride() == views[name].stride(), name
            strides = {k: v for k, v in args.items() if k.startswith(f"stride_{name}_")}
            dims_of = "btrg" if name in ("q", "k") else "bth"
            assert strides == {f"stride_{name}_{d}": views[name].stride(i) for i, d in enumerate(dims_of)}, name


def test_bwd_bwd_copies_once_an_activation_whose_last_stride_is_not_one():
    """k every other element of a wider tensor (last stride 2) is copied, once a call (the seen
    signature's path too); the other views are read in place; the outputs are the contiguous call's."""
    import generated.mamba3_mimo_bwd_bwd as module

    x, contiguous = _bwd_bwd(True)
    views = _mamba3_fused(x)
    views["k"] = every_other = _every_other(x["k"])
    outs, launches, copies = _twice_counting_copies(module.mamba3_mimo_bwd_bwd, views)
    assert copies == 2  # k, once a call
    _same(outs, contiguous)
    (launch,) = launches
    args, _ = launch.split()
    assert args["k"].is_contiguous() and args["k"].data_ptr() != every_other.data_ptr()
    for name in ("dout", "q", "v", "angles", "z"):
        assert args[name].data_ptr() == views[name].data_ptr(), name


@pytest.mark.parametrize("name", ["serial", "blocked"])
def test_bwd_bwd_cuda_twin_equals_its_contiguous_module(name):
    """A cuda strided twin on the fused views (the Z gate on, a tail, GQA; blocked's four kernels)
    computes exactly what its contiguous module computes on the contiguous tensors."""
    x, contiguous = _bwd_bwd(True)
    results = []
    for prefix, inputs in (("", x), ("strided.", _mamba3_fused(x))):
        module = importlib.import_module(f"generated.mamba3_mimo_bwd_bwd.kernels.cuda.{prefix}{name}")
        outs = {n: None if o is None else torch.full_like(o, float("nan")) for n, o in zip(BWD_BWD_OUTPUTS, contiguous)}
        module.launch(**inputs, **outs, num_programs=1, point={})
        results.append(tuple(outs[n] for n in BWD_BWD_OUTPUTS))
    _same(results[1], results[0])
