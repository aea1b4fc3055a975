"""Every npu kernel of mamba3_mimo_bwd_fwd is accepted by the Ascend front end (TTIR -> Linalg)."""
import importlib
from pathlib import Path

import pytest
import torch

from opgen import space
from opgen.frontend import ascend_frontend
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs
from opgen.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)


def _cases():
    for variant in space.variants_for(SPEC, "npu"):
        for dtype, has_z in ((torch.bfloat16, True), (torch.float16, False), (torch.float32, True)):
            has_z = has_z and variant.flags["ALGO"] != "aux"  # the aux path has no Z gate
            yield pytest.param(variant.name, dtype, has_z, id=f"{variant.name}-{str(dtype)[6:]}-Z{int(has_z)}")


@pytest.mark.parametrize("variant, dtype, has_z", list(_cases()))
def test_npu_kernels_accepted_by_ascend_front_end(variant, dtype, has_z):
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.npu.{variant}")
    B, S, H, G, N, P, R, C = 2, 40, 4, 2, 16, 32, 4, 16
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, dtype=dtype, has_z=has_z, seed=0)
    NC = -(-S // C)
    f32 = dict(dtype=torch.float32)
    outs = dict(states=torch.empty(B, H, NC, N, P, **f32), qk_dot=torch.empty(B, H, S, R, R, **f32),
                dmimo_o=torch.empty(B, H, R, P, **f32),
                dmimo_z=torch.empty(B, H, R, P, **f32) if has_z else None,
                dz=torch.empty(B, S, H, P, **f32) if has_z else None)
    calls = module.kernel_calls(**x, **outs, num_programs=20, point={"BLOCK_P": 16, "multibuffer": True})
    assert len(calls) >= 2
    for kernel, _grid, kwargs, options in calls:
        assert options == {"multibuffer": True}
        result = ascend_frontend(kernel, kwargs, arch="Ascend910B3", options=options)
        assert result.accepted, f"{variant} {kernel.__name__ if hasattr(kernel, '__name__') else kernel}: {result.stage}: {result.message[:2000]}"
