"""mamba3_mimo_bwd_fwd on the CPU interpreter against the float64 golden.

Every variant of both renderings runs on a few cases (dtypes, Z and D on and off, GQA, tails,
R in 1, 2, 4, 8), the two renderings of a variant taking them in turn; the public function runs
the issue's pairwise grid, the rank set, tails and the official shapes scaled down. Criteria as
the Ascend port's: the dual benchmark for states, dmimo_o and dz; max|err| / max|golden| for qk_dot
and dmimo_z, whose values sit near 0.
"""
import importlib
from pathlib import Path

import pytest
import torch

from opgen.space import space
from opgen.run.accuracy import dual_benchmark, max_abs_rel
from opgen.references.mamba3_mimo_bwd_fwd import golden, make_inputs, reference_fp32
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
OUTPUTS = ("states", "qk_dot", "dmimo_o", "dmimo_z", "dz")
NEAR_ZERO = {"qk_dot", "dmimo_z"}  # the Ascend port's global max-relative metric
# max|err| / max|golden| allowed for the near-zero outputs, by output dtype (a few output ulps)
NEAR_ZERO_BAR = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def _check(outs, x, output_dtype=torch.float32):
    gold, ref = golden(**x), reference_fp32(**x)
    for name, out in zip(OUTPUTS, outs):
        if gold[name] is None:
            assert out is None, name
            continue
        assert out.dtype == output_dtype and out.shape == gold[name].shape, name
        if name in NEAR_ZERO:
            err = max_abs_rel(out, gold[name])
            assert err <= NEAR_ZERO_BAR[output_dtype], f"{name}: max_abs_rel {err:.3e}"
        else:
            result = dual_benchmark(out, ref[name], gold[name])
            assert result.passed, f"{name}: {result.reason}"


def _launch(module, x, output_dtype=torch.float32, point=None):
    B, S, R, G, N = x["q"].shape
    H, P = x["v"].shape[2], x["v"].shape[3]
    C = x["chunk_size"]
    NC = -(-S // C)
    has_z = x["z"] is not None

    def empty(*shape):
        return torch.empty(shape, dtype=output_dtype)

    outs = dict(states=empty(B, H, NC, N, P), qk_dot=empty(B, H, S, R, R), dmimo_o=empty(B, H, R, P),
                dmimo_z=empty(B, H, R, P) if has_z else None, dz=empty(B, S, H, P) if has_z else None)
    module.launch(**x, **outs, num_programs=4, point=point or {"BLOCK_P": P})
    return [outs[n] for n in OUTPUTS]


VARIANT_CASES = [  # (B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor)
    (1, 32, 2, 1, 8, 8, 2, 16, "float32", True, True, 4),
    (1, 20, 4, 2, 8, 8, 4, 8, "bfloat16", False, True, 2),
    (1, 24, 2, 2, 8, 16, 8, 16, "float16", True, False, 4),
    (2, 24, 2, 1, 16, 8, 1, 8, "bfloat16", True, True, 2),
    # no Z gate (the aux path): a tail with GQA and R=1, and R=8 with D
    (2, 20, 4, 2, 8, 16, 1, 8, "float16", False, False, 4),
    (1, 32, 2, 1, 16, 8, 8, 16, "float32", False, True, 2),
]


def _legal(variant, case):
    B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor = case
    row = dict(B=B, S=S, H=H, G=G, N=N, P=P, R=R, chunk_size=C, dtype=dtype, mimo_z_given=has_z, z_given=has_z)
    return space.is_legal(SPEC, variant, space.evaluate_params(SPEC, space.case_inputs(SPEC, row)))


def _variant_params():
    variants = space.variants_for(SPEC, "cuda")
    npu = {v.name for v in space.variants_for(SPEC, "npu")}
    # the npu rendering has every variant but the cuda-only ones (rowsplit, rowscan)
    assert npu == {v.name for v in variants if "npu" in v.backends}
    for variant in variants:
        cases = [(i, c) for i, c in enumerate(VARIANT_CASES) if _legal(variant, c)]
        assert len(cases) >= 3, variant.name
        # Under the interpreter a cuda rendering differs from its npu twin only in the smallest
        # tl.dot it takes (both use 16 there) and its launch options (none there): the same
        # arithmetic, so the twins take the variant's cases in turn (each case runs once, each
        # rendering at least once). A run-time rank loop differs from its unrolled twin only in
        # the loop (the same arithmetic in the same order): three cases of those keep the suite
        # short, each of another rank (trip count), the largest ranks first.
        if variant.flags["RANK_LOOP"] == "dynamic":
            by_rank = {}
            for i, case in sorted(cases, key=lambda c: -c[1][6]):
                by_rank.setdefault(case[6], (i, case))
            cases = list(by_rank.values())[:3]
        for turn, (i, case) in enumerate(cases):
            rendering = ("npu", "cuda")[turn % 2] if variant.name in npu else "cuda"
            yield pytest.param(rendering, variant.name, case, id=f"{rendering}-{variant.name}-{i}")


@pytest.mark.parametrize("rendering, variant, case", list(_variant_params()))
def test_every_variant(rendering, variant, case):
    B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor = case
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.{rendering}.{variant}")
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, rotary_dim_divisor=divisor, dtype=DTYPES[dtype],
                    has_z=has_z, has_d=has_d, seed=B * S + R)
    point = {"BLOCK_P": P if variant.startswith("stage0") else P // 2}
    _check(_launch(module, x, point=point), x)


# Pairwise over B {1,2} x S {32,64} x H {2,4} x dtype x Z x D x GQA (every pair of values appears).
PAIRWISE = [  # (B, S, H, dtype, Z, D, GQA)
    (1, 32, 2, "float16", True, True, False), (1, 64, 4, "bfloat16", False, False, True),
    (2, 32, 4, "float32", True, False, True), (2, 64, 2, "float16", False, True, True),
    (1, 32, 4, "bfloat16", True, True, True), (2, 64, 2, "float32", False, True, False),
    (1, 64, 2, "float32", True, False, False), (2, 32, 2, "bfloat16", False, False, False),
    (2, 32, 4, "float16", False, False, False), (1, 64, 4, "float16", True, True, True),
]


@pytest.mark.parametrize("B, S, H, dtype, has_z, has_d, gqa", PAIRWISE,
                         ids=[f"B{b}-S{s}-H{h}-{d}-Z{int(z)}-D{int(dd)}-GQA{int(g)}" for b, s, h, d, z, dd, g in PAIRWISE])
def test_public_api_pairwise(B, S, H, dtype, has_z, has_d, gqa):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = make_inputs(B, S, H, 2 if gqa else 1, 16, 8, 2, chunk_size=16, dtype=DTYPES[dtype],
                    has_z=has_z, has_d=has_d, seed=S + H)
    _check(mamba3_mimo_bwd_fwd(**x), x)


@pytest.mark.parametrize("R", [1, 2, 4, 8])
def test_public_api_ranks(R):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = make_inputs(1, 32, 2, 1, 16, 16, R, chunk_size=8, dtype=torch.bfloat16, seed=R)
    _check(mamba3_mimo_bwd_fwd(**x), x)


@pytest.mark.parametrize("S", [33, 40, 48, 50])
@pytest.mark.parametrize("C", [16, 32])
def test_public_api_tails(S, C):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = make_inputs(1, S, 2, 1, 8, 8, 2, chunk_size=C, dtype=torch.bfloat16, seed=S * C)
    _check(mamba3_mimo_bwd_fwd(**x), x)


# The 11 official shapes (N, P, R, C) with B, S, H and N, P scaled down to interpreter size.
OFFICIAL = [(16, 64, 4, 8), (32, 64, 4, 16), (64, 64, 4, 16), (128, 64, 4, 16), (256, 64, 4, 8),
            (64, 128, 4, 16), (128, 32, 4, 16), (128, 128, 4, 8), (128, 64, 8, 8), (128, 64, 2, 32),
            (128, 64, 1, 64)]


@pytest.mark.parametrize("N, P, R, C", OFFICIAL, ids=[f"N{n}_P{p}_R{r}_C{c}" for n, p, r, c in OFFICIAL])
def test_public_api_official_scaled_down(N, P, R, C):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = make_inputs(1, 2 * C, 2, 1, N // 8, P // 8, R, chunk_size=C, dtype=torch.bfloat16, seed=N + P)
    _check(mamba3_mimo_bwd_fwd(**x, output_dtype=torch.float32), x)


def test_bfloat16_outputs():
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = make_inputs(1, 32, 2, 1, 8, 8, 2, chunk_size=16, dtype=torch.bfloat16, seed=3)
    _check(mamba3_mimo_bwd_fwd(**x, output_dtype=torch.bfloat16), x, torch.bfloat16)


# fold and split on tiles where every product is a tl.dot (L = C * R, N and BLOCK_P >= 16): GQA,
# a tail, R in 1, 2, 4, 8, Z and D on and off, a BLOCK_P below P; split's N blocks (fold ignores
# BLOCK_N): two rotated blocks (N32, divisor 2), and a rotated block then one that passes through
# (N32, divisor 4)
FOLDED_CASES = [  # (B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor, BLOCK_P, BLOCK_N)
    (1, 40, 2, 1, 16, 32, 4, 8, "bfloat16", True, True, 4, 16, 16),
    (2, 50, 4, 2, 32, 16, 2, 16, "float16", True, False, 2, 16, 16),
    (1, 64, 2, 1, 16, 32, 1, 16, "float32", False, True, 4, 32, 16),
    (1, 32, 2, 2, 32, 32, 8, 4, "bfloat16", True, True, 4, 32, 16),
]


@pytest.mark.parametrize("variant", ["fold_static_separate", "split_static_separate", "splitscan_static_separate"])
@pytest.mark.parametrize("case", FOLDED_CASES,
                         ids=[f"R{c[6]}_C{c[7]}_N{c[4]}_P{c[5]}_BN{c[13]}" for c in FOLDED_CASES])
def test_folded_variants_on_dot_sized_tiles(variant, case):
    B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor, block_p, block_n = case
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.{variant}")
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, rotary_dim_divisor=divisor, dtype=DTYPES[dtype],
                    has_z=has_z, has_d=has_d, seed=S + N + R)
    # split's chunk kernel with its per-token and per-rank tiles here and the Z gate's terms in the
    # gate kernel, its state kernel a chunk's loads ahead; splitscan's with per-row loads and the
    # terms in the chunk kernel; the state path's N tile below the chunk kernel's where N allows, its
    # P tile the whole P where the chunk kernel's is below it, else half of it (16 at least), its
    # blocks formed transposed (as they are not in test_folded_variants_bf16_outputs)
    split = variant.startswith("split_")
    state_p = P if block_p < P else max(16, P // 2)
    _check(_launch(module, x, point={"BLOCK_P": block_p, "BLOCK_N": block_n, "STATE_BLOCK_N": max(16, N // 2),
                                     "STATE_BLOCK_P": state_p, "STATE_TRANSPOSED": True, "ROW_TILES": split,
                                     "GATE_KERNEL": split, "STATE_PREFETCH": split}), x)


@pytest.mark.parametrize("variant", ["split_static_separate", "splitscan_static_separate"])
def test_split_chunk_products_on_rotation_halves(variant):
    """CHUNK_HALVES: the chunk kernel's products over N on each block's halves apart (16 columns
    each), a rotated block then one that passes through (N64, divisor 4), a tail, GQA, Z and D."""
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.{variant}")
    x = make_inputs(1, 36, 2, 2, 64, 32, 2, chunk_size=8, rotary_dim_divisor=4, dtype=torch.bfloat16,
                    has_z=True, has_d=True, seed=11)
    _check(_launch(module, x, point={"BLOCK_P": 32, "BLOCK_N": 32, "CHUNK_HALVES": True}), x)


@pytest.mark.parametrize("variant", ["fold_static_separate", "split_static_separate", "splitscan_static_separate"])
def test_folded_variants_bf16_outputs(variant):
    """split reads its entering states from an fp32 copy when the outputs are narrower."""
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.{variant}")
    x = make_inputs(1, 40, 2, 1, 16, 32, 4, chunk_size=8, dtype=torch.bfloat16, has_z=True, seed=3)
    _check(_launch(module, x, output_dtype=torch.bfloat16,
                   point={"BLOCK_P": 32, "ROW_TILES": True, "GATE_KERNEL": True, "STATE_PREFETCH": True}), x,
           output_dtype=torch.bfloat16)


@pytest.mark.parametrize("variant", ["split_static_separate", "splitscan_static_separate"])
def test_split_register_cap_is_the_chunk_kernels_alone(variant):
    """CHUNK_MAXNREG caps the chunk kernel's launch (maxnreg beside the point's launch options) and
    no other kernel's; 0 or a launch without options (the interpreter's) caps nothing."""
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.{variant}")
    x = make_inputs(1, 64, 2, 1, 32, 16, 2, chunk_size=16, dtype=torch.bfloat16, has_z=True, seed=1)
    outs = dict(states=torch.empty(1, 2, 4, 32, 16), qk_dot=torch.empty(1, 2, 64, 2, 2),
                dmimo_o=torch.empty(1, 2, 2, 16), dmimo_z=torch.empty(1, 2, 2, 16), dz=torch.empty(1, 64, 2, 16))

    def options(point):
        calls = module.kernel_calls(**x, **outs, num_programs=4, point=dict(point, BLOCK_P=16, GATE_KERNEL=True))
        return {kernel.__name__.rsplit("_", 2)[-2]: opts for kernel, _grid, _kwargs, opts in calls}

    capped = options({"CHUNK_MAXNREG": 168, "num_warps": 4, "num_stages": 2})
    assert capped.pop("chunk") == {"num_warps": 4, "num_stages": 2, "maxnreg": 168}
    assert len(capped) >= 3 and all(o == {"num_warps": 4, "num_stages": 2} for o in capped.values()), capped
    assert all("maxnreg" not in o for o in options({"CHUNK_MAXNREG": 0, "num_warps": 4}).values())
    assert all(o == {} for o in options({"CHUNK_MAXNREG": 168}).values())


@pytest.mark.parametrize("S, C", [(16 * 37 + 5, 16), (8, 8), (5, 16)], ids=["NC38", "NC1", "NC1_tail"])
def test_splitscan_chunk_counts(S, C):
    """splitscan's scan carries the state across its groups of 16 chunks; a single chunk has no
    increments to scan."""
    module = importlib.import_module("generated.mamba3_mimo_bwd_fwd.kernels.cuda.splitscan_static_separate")
    x = make_inputs(1, S, 2, 1, 16, 16, 16 // C if C <= 16 else 1, chunk_size=C, dtype=torch.bfloat16,
                    has_z=S % 2 == 1, has_d=True, seed=S)
    _check(_launch(module, x, point={"BLOCK_P": 16, "BLOCK_N": 16, "GATE_KERNEL": True}), x)


def test_cuda_default_below_dot_sized_chunks():
    """At C * R = 8 no product of split or splitscan is a tl.dot: the cuda default's whole point
    there (ieee, not tf32x3_split, whose helpers took the tf32-rounded parts alone in broadcast
    sums) holds fp32's precision."""
    from opgen.spec.hardware import profile

    row = dict(B=1, S=40, H=2, G=1, N=32, P=32, R=1, chunk_size=8, dtype="bfloat16", mimo_z_given=False, z_given=False)
    point = space.default_point(SPEC, profile("h200"), space.evaluate_params(SPEC, space.case_inputs(SPEC, row)))
    assert point.variant.startswith("splitscan") and point.config["DOT_PRECISION"] == "ieee"
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.{point.variant}")
    x = make_inputs(1, 40, 2, 1, 32, 32, 1, chunk_size=8, dtype=torch.bfloat16, has_z=False, has_d=True, seed=3)
    _check(_launch(module, x, point=dict(point.config)), x)


@pytest.mark.parametrize("variant", ["rowsplit_static_separate", "rowscan_static_separate"])
@pytest.mark.parametrize("case, rows, gate", [(FOLDED_CASES[0], 64, True), (FOLDED_CASES[2], 16, False),
                                              (FOLDED_CASES[3], 16, True)], ids=["R4_C8", "R1_C16_rows16", "R8_C4_rows16"])
def test_row_block_variants(variant, case, rows, gate, monkeypatch):
    """rowsplit and rowscan: the chunk kernel in two passes over N (the scores into y, then Q S
    added), its programs on blocks of query rows: the whole chunk, or (the module's row block
    shrunk to 16) two and more blocks a chunk, each its own share of dmimo_o / dmimo_z; the Z
    gate's terms in the chunk kernel or in the gate kernel."""
    B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor, block_p, block_n = case
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_fwd.kernels.cuda.{variant}")
    monkeypatch.setattr(module, "_CHUNK_ROWS", rows)
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, rotary_dim_divisor=divisor, dtype=DTYPES[dtype],
                    has_z=has_z, has_d=has_d, seed=S + N + R)
    _check(_launch(module, x, point={"BLOCK_P": block_p, "BLOCK_N": block_n, "STATE_BLOCK_N": max(16, N // 2),
                                     "STATE_BLOCK_P": P, "ROW_TILES": True, "GATE_KERNEL": gate,
                                     "STATE_PREFETCH": variant.startswith("rowsplit")}), x)
