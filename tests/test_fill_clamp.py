"""Tiles clamped to the dims they cover: a point carried to a bucket (by the nearest fill, the
measure step and the measured fill alike) meets the spec's constraints on the bucket's largest
call, each tile lowered to the largest value of its domain that does; the frozen H200 tables hold
no filled row whose tile is wider than every call of its bucket."""
import sys
from pathlib import Path

import pytest

from opgen.table import table as tables
from opgen.table import bucket_shapes
from opgen.spec.keys import key_of
from opgen.table.bucket_shapes import bucket_corner
from opgen.spec.hardware import profile
from opgen.render.kernels import kernel_hashes
from opgen.storage.records import record_path
from opgen.space.space import carried, carried_clamped, clamped, constraint_failed
from opgen.spec.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_records import BASE, CHIP, POINT, _path, _winner, _write, gla, hashes  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]


def _at(spec, **case):
    return bucket_shapes.case_params(spec, {**BASE, **case}, "test")


@pytest.mark.parametrize("V, BV, want", [(64, 128, 64), (40, 128, 64), (32, 128, 32), (33, 64, 64),
                                         (96, 128, 128), (16, 32, None), (512, 128, 128)])
def test_a_tile_wider_than_its_dim_is_lowered_to_the_largest_that_covers_it(gla, V, BV, want):
    point = {**POINT, "BK": 64, "BV": BV}
    got = clamped(gla, CHIP, "post_general_tiled", point, _at(gla, V=V))
    if want is None:  # BV <= max(16, pow2(16)) = 16: no value of the domain (32, 64, 128) meets it
        assert got is None
        return
    assert got == {**point, "BV": want}
    assert constraint_failed(gla, "post_general_tiled", got, _at(gla, V=V)) is None


def test_both_tiles_are_clamped_and_a_tile_within_its_dim_is_kept(gla):
    point = {**POINT, "BK": 128, "BV": 128}
    assert clamped(gla, CHIP, "post_general_tiled", point, _at(gla, K=32, V=64)) == {**point, "BK": 32, "BV": 64}
    assert clamped(gla, CHIP, "post_general_tiled", point, _at(gla, K=128, V=128)) == point


def test_a_tile_the_variant_fixes_is_carried_not_clamped(gla):
    # vloop fixes BK to the whole K: carried to K = 32 it runs BK 32 whatever it was tuned with
    vloop = {**POINT, "BK": 128, "BV": 128}
    params = _at(gla, K=32, V=64)
    got = carried_clamped(gla, CHIP, "post_vloop_tiled", vloop, params, params)
    assert (got["BK"], got["BV"]) == (32, 64)


def test_the_nearest_fill_clamps_a_wide_source_tile_to_the_target_bucket(tmp_path, gla, hashes):
    path = _path(tmp_path)
    wide = _winner(gla, point={**POINT, "BV": 128}, V=96)  # V bucket (64, 96]
    _write(path, [wide])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    target = key_of(gla, _at(gla, V=64))  # V bucket (32, 64], one step below
    row = next(r for r in table.rows if r.key == target)
    assert (row.source, row.point["BV"], row.winner.point["BV"]) == (wide.key, 64, 128)
    same = next(r for r in table.rows if r.key == key_of(gla, _at(gla, V=128)))  # a step above: 128 covers it
    assert same.point["BV"] == 128


@pytest.mark.parametrize("op", ["chunk_gla_fwd_o_gk", "mamba3_mimo_bwd_fwd"])
def test_no_filled_row_of_a_committed_table_runs_a_tile_wider_than_its_bucket(op):
    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    chip = profile("h200")
    table = tables.frozen_rows(spec, chip, record_path(ROOT, chip.name, op), kernel_hashes(ROOT, spec, chip.rendering))
    checked = 0
    for row in table.rows:
        if row.source is None or row.measured is not None:
            continue  # tuned, or measured on its bucket
        largest = bucket_corner(spec, row.winner.case, "test", row.key, "high")
        if largest is None:
            continue
        ran = carried(spec, row.variant, row.point, largest)  # a variant's fixed tiles as the call takes them
        assert constraint_failed(spec, row.variant, ran, largest) is None, row
        checked += 1
    assert checked > 0 or op == "mamba3_mimo_bwd_fwd"


def test_explain_names_the_clamped_tiles_of_a_filled_row(tmp_path, gla, hashes):
    from opgen.evidence.explain import explain, text

    path = _path(tmp_path)
    _write(path, [_winner(gla, point={**POINT, "BV": 128}, V=96)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    got = explain(tmp_path, gla, CHIP, {**BASE, "V": 50}, table, hashes)
    assert (got["row"], got["clamped"], got["config"]["BV"]) == ("filled", {"BV": [128, 64]}, 64)
    assert "clamped BV 128 -> 64" in text(got)
