"""chunk_gla_fwd_o_gk on the CPU interpreter against the float64 golden.

Every variant of both renderings runs on shapes legal for it (tails, H=1, B=1, odd K and V,
both chunk sizes, exp and exp2, both half dtypes), at two corners of its tunable space (each
point once: a cuda module's corner that its npu twin runs on the same case runs there alone);
the public API runs on the spec's interpreter cases and on K, V in {32, 48, 64, 96, 128, 160,
256}. The variants whose tiles are tensor descriptors run under an interpreter that knows them
(descriptor_interpreter.py).
"""
import importlib
from pathlib import Path

import pytest
import torch

from opgen.space import space
from opgen.run.accuracy import check_all
from opgen.spec.hardware import profile
from opgen.references.chunk_gla_fwd_o_gk import golden, magnitude, make_inputs, reference_fp32
from opgen.spec.spec import load_spec

from . import descriptor_interpreter

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# The tuner's bar: below FLA 0.6.0's error against the float64 golden by a margin.
BAR = SPEC.accuracy.max_rel_l2
DESCRIPTOR_GRIDS = ("tma", "tma_persistent")  # tiles loaded through tensor descriptors
assert BAR["bfloat16"] < 2.36e-3 and BAR["float16"] < 2.94e-4


def _check(o, x, use_exp2, dtype_name, precise):
    """The golden checks; ``precise`` points (fp32 operands or tril(A) as a pair) meet the bar."""
    args = dict(q=x["q"], v=x["v"], g=x["g"], A=x["A"], h=x["h"], scale=x["scale"],
                chunk_size=x["chunk_size"], use_exp2=use_exp2)
    gold = golden(**args)
    report = check_all(o, gold, reference_fp32(**args), magnitude(**args))
    assert report.passed, report.summary()
    if precise:
        assert report.rel_l2 <= BAR[dtype_name], report.summary()
    return report


def _variant_shapes(variant):
    """Two shapes legal for the variant, covering tails, odd sizes, both chunk sizes."""
    flags = variant.flags
    H = (1, 1) if flags["SHAPE"] == "h1" else (3, 2)
    if flags["SHAPE"] == "single":
        return [dict(B=1, T=100, H=H[0], K=64, V=48, chunk_size=64),
                dict(B=2, T=37, H=H[1], K=32, V=64, chunk_size=32)]
    if flags["SHAPE"] == "vloop2":  # K past 128: two K tiles, the second masked (K 192) or whole
        return [dict(B=1, T=70, H=H[0], K=192, V=48, chunk_size=64),
                dict(B=1, T=37, H=H[1], K=256, V=40, chunk_size=32)]
    return [dict(B=2, T=100, H=H[0], K=96, V=160, chunk_size=64),
            dict(B=1, T=45, H=H[1], K=48, V=32, chunk_size=32)]


def _variant_cases():
    for rendering, chip in (("npu", "ascend910b3"), ("cuda", "h200")):
        for n, variant in enumerate(space.variants_for(SPEC, rendering)):
            # split is float16 only; upstream Triton's interpreter (the descriptor grids') computes
            # bfloat16 dots wrongly, so those run float16 here and bfloat16 under the tuner's checks.
            half_only = variant.flags["SCALE_PATH"] == "split" or variant.flags["GRID"] in DESCRIPTOR_GRIDS
            # The others take the two half dtypes on their two shapes, pairwise: each dtype and each
            # shape (with exp, then exp2) once, the dtypes' order turning from variant to variant so
            # that every dtype meets both shapes and exp and exp2 across the variants (one module runs
            # both dtypes: the dtype changes no line of it, only its loads' element type).
            dtypes = ["float16"] * 2 if half_only else [("float16", "bfloat16"), ("bfloat16", "float16")][n % 2]
            for dtype, (i, shape) in zip(dtypes, enumerate(_variant_shapes(variant))):
                yield pytest.param(rendering, chip, variant, dtype, shape, i % 2 == 1,
                                   id=f"{rendering}-{variant.name}-{dtype}-T{shape['T']}-K{shape['K']}-V{shape['V']}")


LAUNCH_OPTIONS = {n for n, t in SPEC.tunables.items() if t.role == "launch"}
NPU_VARIANTS = {v.name for v in space.variants_for(SPEC, "npu")}


def _params(dtype, shape, use_exp2):
    return space.evaluate_params(SPEC, space.case_inputs(SPEC, {**shape, "dtype": dtype, "use_exp2": use_exp2}))


def _corners(rendering, chip, variant, dtype, shape, use_exp2):
    """The variant's smallest tiles with every option off; the largest that fit with the loads
    moved before the K loop where the variant does not fix that (and, where cuda searches them and the variant does not fix them, h
    loaded evict-first and A through its triangular mask). Both ieee: triton-ascend's interpreter
    runs only "ieee" fp32 dots (it computes every dot in fp32): it refuses tf32/tf32x3, which the
    cuda rendering's fp32 path runs on the H200, and knows no hf32, which the front-end test
    covers."""
    feasible, _ = space.points(SPEC, variant, profile(chip), _params(dtype, shape, use_exp2))
    assert feasible, f"no feasible point for {variant.name}"
    ieee = [p for p in feasible if p.config["DOT_PRECISION"] == "ieee"]
    feasible = ieee or [type(p)(p.variant, tuple((k, "ieee" if k == "DOT_PRECISION" else v) for k, v in p.values))
                        for p in feasible]
    cuda = rendering == "cuda"
    fixed = space.fixed_values(SPEC, variant, _params(dtype, shape, use_exp2))
    on = {n: cuda and n not in fixed for n in ("EVICT_H", "TRIL_LOAD")}
    return (feasible[0], next(p for p in reversed(feasible) if (p.config["EARLY_INTRA"] or "EARLY_INTRA" in fixed)
                              and all(p.config[n] == on[n] for n in on)))


def _kernel_config(point):
    return {k: v for k, v in point.config.items() if k not in LAUNCH_OPTIONS}


@pytest.mark.parametrize("rendering, chip, variant, dtype, shape, use_exp2", list(_variant_cases()))
def test_every_variant(rendering, chip, variant, dtype, shape, use_exp2):
    corners = _corners(rendering, chip, variant, dtype, shape, use_exp2)
    cuda = rendering == "cuda"
    if variant.flags["SCALE_PATH"] != "fp32":  # A_PAIR off and on (cuda searches the pair only)
        assert [p.config["A_PAIR"] for p in corners] == ([False, True] if rendering == "npu" else [True, True])
    fixed = space.fixed_values(SPEC, variant, _params(dtype, shape, use_exp2))  # vloop loads A before its V loop
    assert not any(corners[0].config[n] for n in ("EARLY_INTRA", "EVICT_H", "TRIL_LOAD") if n not in fixed)
    # A corner runs once: not again where both corners are one point, nor on the cuda rendering
    # where its npu twin (the same module under the interpreter but for its launch options, which
    # the interpreter drops) runs it on this case; every test runs at least one.
    twin = (_corners("npu", "ascend910b3", variant, dtype, shape, use_exp2)
            if cuda and variant.name in NPU_VARIANTS else ())
    configs = []
    for point in corners:
        config = _kernel_config(point)
        if config not in configs and config not in [_kernel_config(p) for p in twin]:
            configs.append(config)
    assert configs, f"{variant.name}: every corner runs on the npu twin"
    module = f"generated.chunk_gla_fwd_o_gk.kernels.{rendering}.{variant.name}"
    seed = hash((variant.name, dtype, shape["T"])) % 1000
    errors = {}
    for config in configs:
        x = make_inputs(**shape, dtype=DTYPES[dtype], seed=seed)
        args = dict(q=x["q"], v=x["v"], g=x["g"], A=x["A"], h=x["h"], o=torch.full_like(x["v"], float("nan")),
                    scale=x["scale"], use_exp2=use_exp2, BT=shape["chunk_size"], num_programs=3, point=config)
        if variant.flags["GRID"] in DESCRIPTOR_GRIDS:
            o = descriptor_interpreter.launch(module, **args)
        else:
            importlib.import_module(module).launch(**args)
            o = args["o"]
        report = _check(o, x, use_exp2, dtype, variant.flags["SCALE_PATH"] == "fp32" or config["A_PAIR"])
        errors[config["A_PAIR"]] = report.rel_l2
    if len(errors) == 2:  # same inputs: the pair removes the rounding of A
        assert errors[True] < errors[False], errors


API_SHAPES = [  # (B, T, H, K, V, chunk_size): tails, H=1, B=1, the K and V set
    (1, 37, 1, 32, 32, 32), (2, 100, 3, 48, 96, 64), (1, 64, 2, 64, 64, 64), (2, 130, 1, 96, 48, 64),
    (1, 70, 2, 128, 160, 32), (1, 33, 2, 160, 128, 64), (1, 65, 1, 256, 256, 64), (2, 20, 2, 256, 64, 32),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("B, T, H, K, V, C", API_SHAPES, ids=[f"B{b}-T{t}-H{h}-K{k}-V{v}-C{c}" for b, t, h, k, v, c in API_SHAPES])
def test_public_api(B, T, H, K, V, C, dtype):
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk

    x = make_inputs(B, T, H, K, V, C, dtype=DTYPES[dtype], seed=B * T + K)
    use_exp2 = (K + V) % 64 == 0
    o = chunk_gla_fwd_o_gk(x["q"], x["v"], x["g"], x["A"], x["h"], scale=x["scale"],
                           chunk_size=C, use_exp2=use_exp2)
    assert o.shape == (B, T, H, V) and o.dtype == DTYPES[dtype]
    _check(o, x, use_exp2, dtype, precise=True)  # the interpreter defaults are precise paths


def test_public_api_spec_cases():
    """A sample of the spec's interpreter case set, through the public function."""
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk

    rows = SPEC.expand_cases("interpreter")[::37]
    assert len(rows) >= 10
    for i, row in enumerate(rows):
        x = make_inputs(row["B"], row["T"], row["H"], row["K"], row["V"], row["chunk_size"],
                        dtype=DTYPES[row["dtype"]], seed=i)
        o = chunk_gla_fwd_o_gk(x["q"], x["v"], x["g"], x["A"], x["h"], scale=2.5, chunk_size=row["chunk_size"])
        _check(o, {**x, "scale": 2.5}, False, row["dtype"], precise=False)


TMA_POINT = dict(BK=32, BV=32, DOT_PRECISION="ieee", A_PAIR=True, EARLY_INTRA=False, EVICT_H=False, TRIL_LOAD=False)


def test_descriptor_grid_refuses_a_triton_without_tensor_descriptors():
    """The test's Triton (triton-ascend 3.2) has no host tensor descriptors: a tma module's call
    raises NotImplementedError naming its variant and the Triton it needs, before any launch."""
    import importlib.util

    import triton

    assert importlib.util.find_spec("triton.tools.tensor_descriptor") is None
    module = importlib.import_module("generated.chunk_gla_fwd_o_gk.kernels.cuda.fold_general_tma")
    x = make_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=0)
    with pytest.raises(NotImplementedError, match=rf"fold_general_tma needs Triton >= 3.4 \(tensor descriptors\), "
                                                  rf"not {triton.__version__}"):
        module.launch(q=x["q"], v=x["v"], g=x["g"], A=x["A"], h=x["h"], o=torch.empty_like(x["v"]),
                      scale=x["scale"], use_exp2=False, BT=32, num_programs=3, point=TMA_POINT)


def test_descriptor_grid_copies_operands_off_the_16_byte_alignment():
    """A descriptor's base must start on 16 bytes: a contiguous q and h that start 2 and 4 bytes
    past it (views one element into their storage) are copied, and the output matches the golden."""
    x = make_inputs(2, 45, 2, 48, 32, 32, dtype=torch.float16, seed=5)
    for name in ("q", "h"):
        t = x[name]
        shifted = torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)
        shifted.copy_(t)
        assert shifted.is_contiguous() and shifted.data_ptr() % 16 != 0
        x[name] = shifted
    o = descriptor_interpreter.launch(
        "generated.chunk_gla_fwd_o_gk.kernels.cuda.fold_general_tma_persistent",
        q=x["q"], v=x["v"], g=x["g"], A=x["A"], h=x["h"], o=torch.full_like(x["v"], float("nan")),
        scale=x["scale"], use_exp2=False, BT=32, num_programs=3, point={**TMA_POINT, "BK": 64})
    _check(o, x, False, "float16", precise=True)
