"""opgen explain: for one call's shape, the bucket, the kernel the frozen table runs, whether its
row is tuned, filled or the spec's default, and the budget; from the committed files alone."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opgen.errors import UsageError
from opgen.evidence.explain import explain, parse_values, text
from opgen.spec.hardware import profile
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
GLA = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
MAMBA3 = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)


def _explain(spec, *words, chip="h200"):
    return explain(ROOT, spec, profile(chip), parse_values(spec, list(words)))


def test_a_tuned_shape_names_its_winner_and_cross_check():
    out = _explain(GLA, "B=8", "T=1024", "H=16", "K=128", "V=128", "dtype=bfloat16", "chunk_size=64")
    assert out["row"] == "tuned" and out["variant"].startswith("fold_general")
    assert "K in (96, 128]" in out["bucket"] and out["winner"]["bucket"] == out["bucket"]
    assert out["winner"]["median_ms"] > 0 and "loss" in out["cross_check"]
    assert out["budget"]["kind"] == "smem_bytes" and out["budget"]["limit"] == 232448
    assert "tuned in this bucket" in text(out)


def test_a_filled_shape_names_the_tuned_bucket_it_comes_from():
    # GLA's ranked fill: the candidate timed nearest the fastest around, with its evidence and the
    # rule's loss on the records
    out = _explain(GLA, "B=2", "T=300", "H=4", "K=128", "V=200", "dtype=float16", "chunk_size=64")
    assert out["row"] == "filled" and out["filled_from"] == out["winner"]["bucket"] != out["bucket"]
    assert out["filled_by"] == "ranked" and out["ranked"]["buckets"] > 0 and 0 < out["ranked"]["predicted"] <= 1
    assert out["rule"]["name"] == "ranked" and 0 < out["rule"]["min"] <= out["rule"]["geomean"] <= 1
    assert "ranked fill: the point of the winner of" in text(out) and "rule    ranked fill" in text(out)
    # the nearest fill: a bucket nearer to one the measure step kept at the spec's default than to
    # any row keeps it too
    nearest = GLA.model_copy(update={"dispatch": GLA.dispatch.model_copy(update={"fill_rule": "nearest"})})
    out = _explain(nearest, "B=2", "T=300", "H=4", "K=128", "V=200", "dtype=float16", "chunk_size=64")
    assert out["filled_by"] == "nearest" and "filled from the tuned bucket" in text(out)
    out = _explain(nearest, "B=2", "T=300", "H=4", "K=96", "V=200", "dtype=float16", "chunk_size=64")
    assert out["row"] == "default" and out["default_from"] != out["bucket"]
    assert f"measured fastest on the nearest measured bucket, {out['default_from']}" in text(out)
    # a bucket next to one the measure step filled takes that bucket's row
    out = _explain(nearest, "B=2", "T=300", "H=4", "K=96", "V=200", "dtype=float16", "chunk_size=32")
    assert out["filled_by"] == "nearest measured" and "filled from the measured bucket" in text(out)


def test_an_untuned_shape_runs_the_specs_default():
    out = _explain(MAMBA3, "B=4", "S=2048", "H=16", "G=1", "N=128", "P=64", "R=4", "chunk_size=16",
                   "dtype=float16")
    assert out["row"] == "default" and out["variant"] == "split_static_separate"
    # the spec's cuda default at N = 128, C = 16: the chunk kernel's N blocks of 64, the serial
    # state kernel's of 32, the whole P, the kernel's own tf32 split
    assert {k: out["config"][k] for k in ("BLOCK_N", "STATE_BLOCK_N", "BLOCK_P", "DOT_PRECISION")} == dict(
        BLOCK_N=64, STATE_BLOCK_N=32, BLOCK_P=64, DOT_PRECISION="tf32x3_split")
    assert "winner" not in out
    assert max(out["budget"]["estimate"].values()) < out["budget"]["limit"]


def test_a_call_the_checks_refuse_says_so():
    out = _explain(MAMBA3, "B=4", "S=64", "H=16", "G=0", "N=128", "P=64", "R=4")
    assert out["refused"].startswith("ValueError: every dimension must be positive") and "key" not in out


@pytest.mark.parametrize("words, expected", [
    (["B=4", "X=2"], "NAME among"), (["B=four"], "expected a int"), (["dtype=float8"], "expected a dtype"),
    (["dtype=float32"], "a call of chunk_gla_fwd_o_gk has a dtype among bfloat16, float16"),
    (["B=2", "T=64", "H=1", "K=64"], "missing V"), (["B"], "expected NAME=VALUE"),
])
def test_bad_words_are_usage_errors(words, expected):
    with pytest.raises(UsageError, match=expected):
        parse_values(GLA, words)


def test_the_command_prints_json():
    out = subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(ROOT), "explain", "mamba3_mimo_bwd_fwd",
                          "--chip", "interpreter", "B=1", "S=32", "H=2", "G=1", "N=16", "P=16", "R=2", "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    result = json.loads(out)
    assert result["chip"] == "interpreter" and result["row"] == "default" and result["variant"]


@pytest.mark.parametrize("spec", [GLA, MAMBA3], ids=lambda s: s.op)
def test_every_case_runs_a_point_its_variant_allows_there(spec):
    """For every case of every case set, the H200 table's choice (tuned, filled or default) is a
    variant legal there with the tunables it fixes at their values there: a row filled from
    another bucket never hands over a tile the variant's kernel asserts against (vloop's one K
    tile, pow2(K) wide, tuned at K = 64 and filled into K = 96)."""
    from opgen.storage.records import record_path
    from opgen.render.kernels import kernel_hashes
    from opgen.space.space import case_inputs, evaluate_params, find_variant, fixed_values, is_legal
    from opgen.table.table import frozen_rows

    chip = profile("h200")
    hashes = kernel_hashes(ROOT, spec, chip.rendering)  # rendered once: every call explains the same table
    table = frozen_rows(spec, chip, record_path(ROOT, chip.name, spec.op), hashes)
    kinds = set()
    for name in spec.cases:
        for row in spec.expand_cases(name):
            out = explain(ROOT, spec, chip, row, table, hashes)
            if "refused" in out:
                continue
            kinds.add(out["row"])
            params = evaluate_params(spec, case_inputs(spec, row))
            variant = find_variant(spec, out["variant"])
            assert is_legal(spec, variant, params), (name, row, out["variant"])
            fixed = fixed_values(spec, variant, params)
            assert {n: out["config"][n] for n in fixed} == fixed, (name, row, out["variant"], out["row"])
    assert "default" in kinds and (spec is MAMBA3 or {"tuned", "filled"} <= kinds)
