"""Every generated npu kernel variant is accepted by the Ascend front end (TTIR -> Linalg, CPU)."""
import importlib
from pathlib import Path

import pytest
import torch

from opgen.space import space
from opgen.evidence.frontend import ascend_frontend
from opgen.spec.hardware import profile
from opgen.references.chunk_gla_fwd_o_gk import make_inputs
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _cases():
    for variant in space.variants_for(SPEC, "npu"):
        dtypes = ["float16"] if variant.flags["SCALE_PATH"] == "split" else ["float16", "bfloat16"]
        single = variant.flags["SHAPE"] == "single"
        H = 1 if variant.flags["SHAPE"] == "h1" else 4
        shapes = [(2, 100, H, 64, 48, 64)] if single else [(2, 100, H, 128, 96, 64), (1, 70, H, 48, 160, 32)]
        if variant.flags["SHAPE"] == "vloop2":  # K past 128
            shapes = [(1, 70, H, 192, 96, 64)]
        for dtype in dtypes:
            for shape in shapes:
                yield pytest.param(variant, dtype, shape, id=f"{variant.name}-{dtype}-K{shape[3]}-V{shape[4]}-C{shape[5]}")


@pytest.mark.parametrize("variant, dtype, shape", list(_cases()))
def test_npu_variant_accepted_by_ascend_front_end(variant, dtype, shape):
    B, T, H, K, V, C = shape
    module = importlib.import_module(f"generated.chunk_gla_fwd_o_gk.kernels.npu.{variant.name}")
    x = make_inputs(B, T, H, K, V, C, dtype=DTYPES[dtype], seed=0)
    o = torch.empty_like(x["v"])
    params = space.evaluate_params(SPEC, space.case_inputs(SPEC, dict(B=B, T=T, H=H, K=K, V=V, chunk_size=C, dtype=dtype)))
    feasible, _ = space.points(SPEC, variant, profile("ascend910b3"), params)
    kinds = sorted({(p.config["DOT_PRECISION"], p.config["A_PAIR"]) for p in feasible})
    # fp32 path: ieee and hf32; the half paths: tril(A) cast and as a pair
    assert len(kinds) == 2
    for i, kind in enumerate(kinds):  # the second kind with the intra-chunk loads before the K loop
        early = i == 1 or variant.flags["SHAPE"] in ("vloop", "vloop2")  # they load A before the V loop
        point = next(p for p in feasible if (p.config["DOT_PRECISION"], p.config["A_PAIR"]) == kind
                     and p.config["EARLY_INTRA"] == early)
        _, kwargs, options = module.prepare(x["q"], x["v"], x["g"], x["A"], x["h"], o, x["scale"],
                                            use_exp2=K % 32 == 0, BT=C, num_programs=20, point=point.config)
        assert set(options) == {"multibuffer"}
        result = ascend_frontend(module.KERNEL, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{variant.name} {point.name()}: {result.stage}: {result.message[:2000]}"
        assert "linalg.matmul" in result.ops or any("matmul" in op for op in result.ops), result.ops


def test_cuda_rendering_is_refused_where_it_uses_tf32():
    """The check is not a rubber stamp: the cuda rendering's tf32 dot is refused on Ascend."""
    module = importlib.import_module("generated.chunk_gla_fwd_o_gk.kernels.cuda.fp32_general_tiled")
    x = make_inputs(1, 64, 2, 64, 64, 64, dtype=torch.bfloat16, seed=0)
    o = torch.empty_like(x["v"])
    point = dict(BK=64, BV=64, DOT_PRECISION="tf32", A_PAIR=False, EARLY_INTRA=False, EVICT_H=False, TRIL_LOAD=False, num_warps=4,
                 num_stages=2, occupancy=1)
    _, kwargs, _ = module.prepare(x["q"], x["v"], x["g"], x["A"], x["h"], o, x["scale"], False, 64, 1, point)
    result = ascend_frontend(module.KERNEL, kwargs, arch="Ascend910B3")
    assert not result.accepted and result.stage == "frontend"
    assert "hf32" in result.message


# The strided twins of a few npu variants (each shape, scale path and the h1 rows once), on views
# sliced out of wider tensors: the strides reach the front end as kernel arguments.
STRIDED_TWINS = [("split_general_persistent", (2, 100, 4, 128, 96, 64)), ("fold_h1_persistent", (2, 70, 1, 48, 160, 32)),
                 ("fp32_vloop2_persistent", (1, 70, 4, 192, 96, 64)), ("post_single_persistent", (2, 100, 4, 64, 48, 64))]


@pytest.mark.parametrize("name, shape", STRIDED_TWINS, ids=[n for n, _ in STRIDED_TWINS])
def test_npu_strided_twin_accepted_by_ascend_front_end(name, shape):
    B, T, H, K, V, C = shape
    variant = next(v for v in space.variants_for(SPEC, "npu") if v.name == name)
    module = importlib.import_module(f"generated.chunk_gla_fwd_o_gk.kernels.npu.strided.{name}")
    x = make_inputs(B, T, H, K, V, C, dtype=torch.float16, seed=0)
    fused = torch.cat([x["q"], x["v"]], dim=-1)
    views = {"q": fused[..., :K], "v": fused[..., K:]}
    for n in ("g", "A", "h"):
        views[n] = torch.cat([x[n], x[n][..., :8]], dim=-1)[..., :x[n].shape[-1]]
    assert not any(t.is_contiguous() for t in views.values())
    params = space.evaluate_params(SPEC, space.case_inputs(SPEC, dict(B=B, T=T, H=H, K=K, V=V, chunk_size=C, dtype="float16")))
    feasible, _ = space.points(SPEC, variant, profile("ascend910b3"), params)
    point = feasible[-1]
    _, kwargs, options = module.prepare(**views, o=torch.empty_like(x["v"]), scale=x["scale"], use_exp2=False, BT=C,
                                        num_programs=20, point=point.config)
    assert kwargs["stride_q_t"] == H * (K + V) and kwargs["stride_h_k"] == V + 8
    result = ascend_frontend(module.KERNEL, kwargs, arch="Ascend910B3", options=options)
    assert result.accepted, f"{name} {point.name()}: {result.stage}: {result.message[:2000]}"
    assert any("matmul" in op for op in result.ops), result.ops
