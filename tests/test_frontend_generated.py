"""Every generated npu kernel variant is accepted by the Ascend front end (TTIR -> Linalg, CPU)."""
import importlib
from pathlib import Path

import pytest
import torch

from opgen import space
from opgen.frontend import ascend_frontend
from opgen.hardware import profile
from opgen.references.chunk_gla_fwd_o_gk import make_inputs
from opgen.spec import load_spec

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
