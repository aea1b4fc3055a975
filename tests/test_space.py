"""The search space: variants, legality, constraints, budgets and the spec's default choice."""
import dataclasses
import itertools
from pathlib import Path

import pytest

from opgen.space import space
from opgen.errors import BuildError
from opgen.spec.hardware import profile
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gla():
    return load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)


def _params(spec, **row):
    return space.evaluate_params(spec, space.case_inputs(spec, row))


def _distinct_combinations(spec, variant, chip, params):
    """Brute force: each distinct combination of the whole cross product of the chip's domains
    (fixed tunables substituted), in product order, with its formula environment."""
    names = spec.tunables_for(chip.backend)
    fixed = space.fixed_values(spec, variant, params)
    seen = set()
    for combo in itertools.product(*(spec.tunables[n].domain[chip.rendering] for n in names)):
        values = tuple(fixed.get(n, v) for n, v in zip(names, combo))
        if values not in seen:
            seen.add(values)
            yield values, {**params, **variant.flags, **dict(zip(names, values))}


def test_variants_per_rendering(gla):
    npu = [v.name for v in space.variants_for(gla, "npu")]
    cuda = [v.name for v in space.variants_for(gla, "cuda")]
    assert len(npu) == 20 and all(n.endswith("_persistent") for n in npu)
    # 4 scale paths x 5 shapes x 2 grids, the chunk-loop grids on fold and post without a V loop,
    # the heads-first grid on fold and post for general and the V loops
    assert len(cuda) == 62 and sum("_vloop_" in n for n in cuda) == 10 and sum("_vloop_" in n for n in npu) == 4
    assert sorted(n for n in cuda if n.endswith("_heads_first")) == [
        f"{path}_{shape}_heads_first" for path in ("fold", "post") for shape in ("general", "vloop2", "vloop")]
    # the descriptor grids: cuda only, general shape, fold and post
    assert sorted(n for n in cuda if "_tma" in n) == [
        "fold_general_tma", "fold_general_tma_persistent", "post_general_tma", "post_general_tma_persistent"]
    assert sum("_vloop2_" in n for n in cuda) == 10 and sum("_vloop2_" in n for n in npu) == 4
    chunks = sorted(n for n in cuda if "_chunks" in n)
    assert len(chunks) == 12 and all(n.split("_")[0] in ("fold", "post") and n.split("_")[1] in ("general", "h1", "single")
                                     for n in chunks)
    assert npu[0] == "fold_general_persistent"
    assert space.find_variant(gla, "split_h1_tiled").flags == {"SCALE_PATH": "split", "SHAPE": "h1", "GRID": "tiled"}
    with pytest.raises(BuildError, match="unknown variant 'nope'"):
        space.find_variant(gla, "nope")


def test_legality(gla):
    bf16 = _params(gla, B=1, T=64, H=1, K=64, V=64, chunk_size=64, dtype="bfloat16")
    fp16 = _params(gla, B=2, T=64, H=4, K=128, V=64, chunk_size=64, dtype="float16")
    assert not space.is_legal(gla, space.find_variant(gla, "split_general_tiled"), bf16)
    assert space.is_legal(gla, space.find_variant(gla, "split_general_tiled"), fp16)
    assert space.is_legal(gla, space.find_variant(gla, "fp32_h1_persistent"), bf16)
    assert space.is_legal(gla, space.find_variant(gla, "fold_vloop_tiled"), fp16)  # K <= 128
    wide = _params(gla, B=1, T=64, H=2, K=256, V=64, chunk_size=64, dtype="float16")
    assert not space.is_legal(gla, space.find_variant(gla, "fold_vloop_tiled"), wide)
    assert space.is_legal(gla, space.find_variant(gla, "fold_vloop2_tiled"), wide)  # 128 < K <= 256
    assert not space.is_legal(gla, space.find_variant(gla, "fold_vloop2_tiled"), fp16)
    assert not space.is_legal(gla, space.find_variant(gla, "fp32_h1_persistent"), fp16)
    assert space.is_legal(gla, space.find_variant(gla, "fold_single_persistent"), bf16)
    assert not space.is_legal(gla, space.find_variant(gla, "fold_single_persistent"), fp16)


def test_budget_filter_on_ascend(gla):
    params = _params(gla, B=1, T=4096, H=16, K=128, V=128, chunk_size=64, dtype="float16")
    variant = space.find_variant(gla, "fp32_general_persistent")
    points, count = space.points(gla, variant, profile("ascend910b3"), params)
    # BK BV DOT_PRECISION A_PAIR EARLY_INTRA EVICT_H TRIL_LOAD multibuffer occupancy
    assert count.total == 3 * 3 * 2 * 2 * 2 * 1 * 1 * 2 * 1
    assert count.duplicates == count.total // 2  # the fp32 path fixes A_PAIR
    assert count.feasible == len(points) == count.total - count.duplicates - count.constrained - count.over_budget
    assert count.over_budget > 0
    assert any(reason.startswith("ub_bytes > 196608") for reason, _ in count.reasons)
    for point in points:
        used = space.budget_bytes(gla, variant, point.config, params, profile("ascend910b3"))
        assert used[0] == "ub_bytes" and used[1] <= 196608
    # multibuffer doubles the loaded tiles: the biggest tiles fit only without it
    big = [p.config for p in points if p.config["BK"] == 128 and p.config["BV"] == 128]
    assert big and all(c["multibuffer"] is False for c in big)


def test_fixed_tunables_collapse_duplicates(gla):
    params = _params(gla, B=1, T=64, H=2, K=48, V=40, chunk_size=64, dtype="float16")
    variant = space.find_variant(gla, "fold_single_tiled")
    points, count = space.points(gla, variant, profile("h200"), params)
    assert {p.config["BK"] for p in points} == {64}
    assert {p.config["BV"] for p in points} == {64}
    assert {p.config["DOT_PRECISION"] for p in points} == {"ieee"}
    assert count.duplicates > 0


def test_points_are_the_whole_cross_product_filtered_but_formulas_run_once_per_reading(gla, monkeypatch):
    """The points and counts are those of the whole cross product (fixed tunables substituted,
    duplicates dropped, constraints then the budget), yet no duplicate is formed and each
    constraint or budget formula runs once for each combination of the tunables it reads."""
    chip = profile("ascend910b3")
    params = _params(gla, B=1, T=4096, H=16, K=128, V=128, chunk_size=64, dtype="float16")
    variant = space.find_variant(gla, "fp32_general_persistent")
    names = gla.tunables_for(chip.backend)
    kind, formulas = space.budget_formula(gla, chip)
    seen, want, constrained, over = [], [], 0, 0
    for values, env in _distinct_combinations(gla, variant, chip, params):
        seen.append(values)
        if not all(c.evaluate(env) for c in gla.constraints):
            constrained += 1
        elif max(f.evaluate(env) for f in formulas.values()) > chip.budget(kind):
            over += 1
        else:
            want.append(values)
    calls = []
    evaluate = space.Expr.evaluate
    monkeypatch.setattr(space.Expr, "evaluate", lambda self, env: calls.append(self) or evaluate(self, env))
    points, count = space.points(gla, variant, chip, params)
    assert [p.values for p in points] == [tuple(zip(names, v)) for v in want]
    assert (count.duplicates, count.constrained, count.over_budget) == (
        count.total - len(seen), constrained, over) and count.duplicates > 0 and over > 0

    def readings(expr):  # the distinct combinations of the free tunables a formula reads
        return len({tuple(v for n, v in zip(names, values) if n in expr.names) for values in seen})
    checked = (*gla.constraints, *formulas.values())
    assert sum(c in checked for c in calls) <= sum(readings(e) for e in checked) < len(seen)


def test_each_constrained_combination_counts_under_the_first_constraint_it_fails(gla):
    chip = profile("h200")
    params = _params(gla, B=1, T=64, H=2, K=32, V=32, chunk_size=32, dtype="float16")
    variant = space.find_variant(gla, "fold_general_tiled")
    first = {}
    for _, env in _distinct_combinations(gla, variant, chip, params):
        failed = next((c.source for c in gla.constraints if not c.evaluate(env)), None)
        if failed is not None:
            first[failed] = first.get(failed, 0) + 1
    _, count = space.points(gla, variant, chip, params)
    assert len(first) >= 2 and count.constrained == sum(first.values())
    assert {k: v for k, v in count.reasons if k in first} == first


def test_constraints_prune_oversized_tiles(gla):
    params = _params(gla, B=1, T=64, H=2, K=32, V=32, chunk_size=32, dtype="float16")
    variant = space.find_variant(gla, "fold_general_tiled")
    points, count = space.points(gla, variant, profile("h200"), params)
    assert all(p.config["BK"] <= 32 and p.config["BV"] <= 32 for p in points)
    assert dict(count.reasons)["BK <= max(16, pow2(K))"] > 0


@pytest.mark.parametrize("K, V, BK, BV", [
    (32, 64, 32, 64), (16, 48, 32, 64), (128, 128, 128, 128), (256, 512, 128, 128),
    (96, 96, 64, 32), (64, 160, 64, 32), (48, 256, 64, 128), (192, 80, 64, 128),
])
def test_npu_default_is_the_seed_rule(gla, K, V, BK, BV):
    params = _params(gla, B=2, T=256, H=4, K=K, V=V, chunk_size=64, dtype="bfloat16")
    point = space.default_point(gla, profile("ascend910b2"), params)
    assert (point.config["BK"], point.config["BV"]) == (BK, BV)


@pytest.mark.parametrize("row, variant", [
    (dict(B=2, T=256, H=4, K=128, V=128, dtype="float16"), "split_general_persistent"),
    (dict(B=2, T=256, H=4, K=128, V=128, dtype="bfloat16"), "fp32_general_persistent"),
    (dict(B=2, T=256, H=4, K=128, V=128, dtype="bfloat16", scale=2.0), "post_general_persistent"),
    (dict(B=2, T=256, H=1, K=128, V=128, dtype="bfloat16"), "fp32_h1_persistent"),
    (dict(B=1, T=256, H=4, K=64, V=48, dtype="float16"), "split_single_persistent"),
    (dict(B=2, T=256, H=4, K=64, V=48, dtype="float16"), "split_general_persistent"),
])
def test_npu_default_routes_like_the_seed(gla, row, variant):
    params = _params(gla, chunk_size=64, **row)
    assert space.default_point(gla, profile("ascend910b3"), params).variant == variant


def test_default_multibuffer_is_first_that_fits(gla):
    small = _params(gla, B=2, T=256, H=4, K=64, V=64, chunk_size=64, dtype="bfloat16")
    big = _params(gla, B=2, T=256, H=4, K=128, V=128, chunk_size=64, dtype="bfloat16")
    assert space.default_point(gla, profile("ascend910b3"), small).config["multibuffer"] is True
    assert space.default_point(gla, profile("ascend910b3"), big).config["multibuffer"] is False


@pytest.mark.parametrize("op", ["chunk_gla_fwd_o_gk", "mamba3_mimo_bwd_fwd"])
def test_every_case_has_a_legal_default_on_every_chip(op):
    """Defaults must never pick an excluded combination (rank-fold with fused pre-processing is not
    a variant) nor a point the spec's constraints refuse (tf32x3_split at C * R = 8 runs at tf32's
    precision). GLA's Ascend default keeps the MindSpeed-Ops port's BV = 64 where V is below it, a
    tile the tuner's constraints prune, so its constraints are not checked there."""
    from opgen.spec.hardware import PROFILES

    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    for set_name in spec.cases:
        for row in spec.expand_cases(set_name):
            params = _params(spec, **row)
            for chip in PROFILES.values():
                if chip.backend == "npu" and chip.cube_cores is None:  # the driver tells at run time
                    chip = dataclasses.replace(chip, cube_cores=32)
                point = space.default_point(spec, chip, params)
                variant = space.find_variant(spec, point.variant)
                assert space.is_legal(spec, variant, params)
                assert chip.rendering in variant.backends
                if not (op == "chunk_gla_fwd_o_gk" and chip.backend == "npu"):
                    assert space.constraint_failed(spec, point.variant, point.config, params) is None, (chip.name, row)


def test_an_axis_default_reads_the_axes_before_it():
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    small = _params(spec, B=1, S=64, H=2, G=1, N=64, P=64, R=4, chunk_size=16, dtype="bfloat16",
                    mimo_z_given=True, z_given=True)
    for chip, algo in (("h200", "splitscan"), ("ascend910b3", "rankfold")):
        flags = space.find_variant(spec, space.default_point(spec, profile(chip), small).variant).flags
        assert flags["ALGO"] == algo and flags["PRE"] == "separate" and flags["RANK_LOOP"] == "static"
    flags = space.find_variant(spec, space.default_point(spec, profile("h200"), {**small, "R": 3}).variant).flags
    assert flags["ALGO"] == "staged" and flags["PRE"] == "fused"
    # past 2^19 fp32 state entries per (b, h) the serial state kernel: 64 * 64 * 512 chunks
    long = {**small, "S": 8192, "NC": 512, "R": 8}
    flags = space.find_variant(spec, space.default_point(spec, profile("h200"), long).variant).flags
    assert flags["ALGO"] == "split" and flags["RANK_LOOP"] == "static"  # split has no rank loop


def test_forced_point_keeps_the_defaults_but_what_the_variant_fixes(gla):
    params = _params(gla, B=2, T=256, H=4, K=128, V=128, chunk_size=64, dtype="bfloat16")
    chosen = space.default_point(gla, profile("h200"), params)
    assert chosen.variant == "fold_general_tiled"
    forced = space.forced_point(gla, profile("h200"), space.find_variant(gla, "fp32_general_tiled"), params)
    assert forced.variant == "fp32_general_tiled"
    assert [n for n, _ in forced.values] == [n for n, _ in chosen.values]  # declaration order
    assert forced.config == {**chosen.config, "A_PAIR": False}  # the fp32 path fixes A_PAIR


def test_excluded_combinations_are_not_variants(gla, tmp_path):
    import yaml

    from opgen.spec.spec import load_spec as load

    data = yaml.safe_load((ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml").read_text())
    data["variants"]["axes"]["GRID"] = {g: data["variants"]["axes"]["GRID"][g] for g in ("tiled", "persistent")}
    data["variants"]["exclude"] = ["SCALE_PATH == 'post' and SHAPE != 'general'", "GRID == 'tiled' and SHAPE == 'h1'"]
    path = tmp_path / "chunk_gla_fwd_o_gk.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    names = {v.name for v in space.all_variants(load(path, tmp_path))}
    assert "post_general_tiled" in names and "post_h1_persistent" not in names
    assert "fold_h1_persistent" in names and "fold_h1_tiled" not in names
    # of 4 x 5 x 2: post on h1, single, vloop and vloop2 (two grids each); tiled h1 on the three
    # other scale paths
    assert len(names) == 40 - 8 - 3


@pytest.mark.parametrize("row, algo", [
    (dict(B=1, H=8, N=64, P=64, R=4), "aux"),  # 8 (b, h) programs leave cores idle; no Z; N*P 4096
    (dict(B=1, H=8, N=64, P=64, R=4, z=True), "rankfold"),  # the aux path has no Z gate
    (dict(B=1, H=8, N=256, P=128, R=4), "nblocked"),  # N*P over 16384: the state streams in N blocks
    (dict(B=4, H=16, N=256, P=128, R=2), "nblocked"),
    (dict(B=4, H=16, N=256, P=64, R=2), "staged"),  # N*P = 16384 stays on chip (the Ascend port's N256_P64)
    (dict(B=4, H=16, N=64, P=64, R=4), "rankfold"),  # 64 programs fill the 20 cube cores
    (dict(B=4, H=16, N=64, P=64, R=2), "staged"),
    (dict(B=4, H=16, N=64, P=64, R=2, S=2048), "post"),  # 128 chunks: the contractions leave the scan
    (dict(B=4, H=16, N=64, P=64, R=4, S=2048), "rankfold"),
])
def test_mamba3_npu_default_routes_like_the_seed(row, algo):
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    z = row.pop("z", False)
    row.setdefault("S", 256)
    params = _params(spec, G=1, chunk_size=16, dtype="bfloat16", mimo_z_given=z, z_given=z, **row)
    point = space.default_point(spec, profile("ascend910b3"), params)
    assert space.find_variant(spec, point.variant).flags["ALGO"] == algo


def test_budget_per_kernel_names_the_kernel_that_overflows():
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    params = _params(spec, B=1, S=256, H=2, G=1, N=256, P=128, R=4, chunk_size=16, dtype="bfloat16")
    variant = space.find_variant(spec, "rankfold_static_separate")
    points, count = space.points(spec, variant, profile("ascend910b3"), params)
    # two [256, BLOCK_P] fp32 states and the folded keys: only the scan overflows, past BLOCK_P 32
    assert count.reasons == (("ub_bytes(scan) > 196608", count.over_budget),) and count.over_budget > 0
    assert {(p.config["BLOCK_P"], p.config["multibuffer"]) for p in points} == {(8, True), (8, False), (16, False), (32, False)}
    for point in points:
        kind, parts = space.budget_parts(spec, variant, point.config, params, profile("ascend910b3"))
        assert kind == "ub_bytes" and set(parts) == {"pre", "aux", "post", "folded", "split_state", "split_chunk",
                                                     "split_gate", "split_reduce", "splitscan_increment",
                                                     "splitscan_scan", "scan"}
        assert parts["aux"] == parts["post"] == parts["folded"] == 0
        assert space.budget_bytes(spec, variant, point.config, params, profile("ascend910b3")) == (kind, max(parts.values()))
    # the aux path's own kernel counts; the pre-processing kernel alone is over at C=64, N=256
    wide = _params(spec, B=1, S=256, H=2, G=1, N=256, P=128, R=4, chunk_size=64, dtype="bfloat16")
    _, cut = space.points(spec, space.find_variant(spec, "aux_static_fused"), profile("ascend910b3"), wide)
    assert cut.feasible == 0 and all("pre" in reason for reason, _ in cut.reasons)
    assert any("aux" in reason for reason, _ in cut.reasons)
    # fold holds a whole [L, N] chunk and split [L, L] scores: at L = 256, N = 256 nothing fits the
    # UB; at N = 32 both do
    _, cut = space.points(spec, space.find_variant(spec, "fold_static_separate"), profile("ascend910b3"), wide)
    assert cut.feasible == 0 and dict(cut.reasons)["ub_bytes(folded) > 196608"] == cut.over_budget > 0
    _, cut = space.points(spec, space.find_variant(spec, "split_static_separate"), profile("ascend910b3"), wide)
    assert cut.feasible == 0 and cut.over_budget > 0
    assert all("split_chunk" in reason for reason, _ in cut.reasons if reason.startswith("ub_bytes"))
    # split's N blocks fit N = 256 at L = 16 where fold's whole-N chunk does not, BLOCK_N = N aside
    n256 = _params(spec, B=1, S=256, H=2, G=1, N=256, P=64, R=2, chunk_size=8, dtype="bfloat16")
    kept, _ = space.points(spec, space.find_variant(spec, "split_static_separate"), profile("ascend910b3"), n256)
    assert {p.config["BLOCK_N"] for p in kept} == {16, 32, 64, 128}
    # splitscan's scan kernel holds 16 chunks of at most 256 state entries, whatever the shape
    kept, _ = space.points(spec, space.find_variant(spec, "splitscan_static_separate"), profile("ascend910b3"), n256)
    assert {p.config["BLOCK_N"] for p in kept} == {16, 32, 64, 128}
    _, parts = space.budget_parts(spec, space.find_variant(spec, "splitscan_static_separate"), kept[0].config, n256,
                                  profile("ascend910b3"))
    assert parts["splitscan_scan"] == 4 * 16 * 256 * (4 + (2 if kept[0].config["multibuffer"] else 1)) + 4 * 256
    assert parts["split_state"] == 0 and parts["splitscan_increment"] > 0
    for name in ("fold_static_separate", "split_static_separate", "splitscan_static_separate"):
        small = _params(spec, B=1, S=256, H=2, G=1, N=32, P=64, R=2, chunk_size=8, dtype="bfloat16")
        kept, _ = space.points(spec, space.find_variant(spec, name), profile("ascend910b3"), small)
        assert kept and all(p.config["BLOCK_P"] >= 16 for p in kept)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_a_case_dtype_the_calls_cannot_have_is_an_error_not_another_dtype(gla, dtype):
    """float32 is g's, A's and h's dtype, but q and v (the tensors that follow the call's dtype)
    take none: a float32 case is refused, not run with q in float16."""
    from opgen.errors import SpecError

    row = dict(B=1, T=64, H=1, K=64, V=64, dtype="float16")
    assert space.case_inputs(gla, row)["q_dtype"] == "float16"
    with pytest.raises(SpecError, match=r"cases: expected a dtype of the op's calls \(bfloat16, float16\)"):
        space.case_inputs(gla, {**row, "dtype": dtype})


def test_an_axis_option_may_name_its_own_template():
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    templates = {v.name: v.template for v in space.all_variants(spec)}
    folded = ("fold_static_separate", "split_static_separate", "splitscan_static_separate",
              "rowsplit_static_separate", "rowscan_static_separate")
    assert {templates[n] for n in folded} == {"folded.py.j2"}
    assert {t for n, t in templates.items() if n not in folded} == {"bwd_fwd.py.j2"}


def test_bwd_bwd_space_leaves_out_the_points_that_faulted():
    """The H100 search's tf32x3 points that stopped on an illegal memory access (8 warps, the
    chunk kernel's smallest N step) are refused by a constraint; every point that ran is not."""
    import json

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_bwd.yaml", ROOT)
    crashed = ran = 0
    for line in (ROOT / "records" / "h100" / "mamba3_mimo_bwd_bwd.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] != "trial":
            continue
        failed = space.constraint_failed(spec, record["variant"], record["point"], _params(spec, **record["case"]))
        if record["status"] == "crash":
            crashed += 1
            assert failed is not None and "num_warps < 8" in failed, record["point"]
        elif record["point"]["num_warps"] < 8 or record["point"]["DOT_PRECISION"] == "ieee":
            ran += 1
            assert failed is None, record["point"]
    assert crashed == 4 and ran >= 16


def test_bwd_bwd_searches_bf16x3_only_for_half_outputs():
    """Three bf16 passes fall outside an fp32 output's error model: the space keeps them for bf16
    outputs and refuses them for fp32 ones; six passes stay in both."""
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_bwd.yaml", ROOT)
    row = dict(B=4, S=2048, H=16, G=1, N=64, P=64, R=4, chunk_size=16, d_given=True, dtype="bfloat16")
    point = {"BLOCK_N": 64, "BLOCK_P": 16, "CHUNK_MAXNREG": 0, "DS_BLOCK_N": 32, "DS_BLOCK_P": 32,
             "num_stages": 1, "num_warps": 4}
    for out, precision, refused in (("float32", "bf16x3", True), ("bfloat16", "bf16x3", False),
                                    ("float32", "bf16x6", False)):
        params = _params(spec, **row, output_dtype=out)
        failed = space.constraint_failed(spec, "blocked_pairs", {**point, "DOT_PRECISION": precision}, params)
        assert (failed is not None) == refused, (out, precision, failed)
