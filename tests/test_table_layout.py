"""The frozen table as written: named configs, tuned rows, fill ranges. Its lookup gives every key
the row the freeze chose (filled keys included) and no range takes a key the freeze left to the
spec's default; generated modules keep their lines within 100 characters."""
import itertools
import re
from pathlib import Path

import pytest

from opgen.storage import records
from opgen.errors import SpecError
from opgen.spec.hardware import profile
from opgen.render.kernels import kernel_hashes
from opgen.spec.keys import bucket_range, split_key_field
from opgen.spec.spec import load_spec
from opgen.table.table import frozen_rows
from opgen.build.table_layout import config_names, fill_ranges

ROOT = Path(__file__).resolve().parents[1]


def test_bucket_ranges_read_as_the_values_they_stand_for():
    edges = (32, 64, 96, 128)
    assert [bucket_range("K", edges, i) for i in range(5)] == [
        "K <= 32", "K in (32, 64]", "K in (64, 96]", "K in (96, 128]", "K > 128"]
    assert bucket_range("K", edges, 1, 2) == "K in (32, 96]" and bucket_range("K", edges, 0, 4) == "K any"


def test_a_table_without_tuned_rows_has_no_fill(tmp_path):
    spec, chip = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT), profile("h200")
    table = frozen_rows(spec, chip, records.record_path(tmp_path, "h200", spec.op), kernel_hashes(ROOT, spec, "cuda"))
    assert table.rows == () and table.filled == 0
    assert fill_ranges(spec, table.rows, config_names(table.rows)) == []


def test_a_spec_with_fill_distance_0_freezes_its_tuned_rows_alone(h200_table):
    """With dispatch.fill_distance 0 an untuned bucket runs the spec's default unless the measure
    step timed the tuned points on it: the GLA H200 records, whose table fills hundreds of buckets
    at an unbounded distance, freeze their tuned and measured rows alone."""
    (spec, unbounded), chip = h200_table("chunk_gla_fwd_o_gk"), profile("h200")
    hashes, path = kernel_hashes(ROOT, spec, "cuda"), records.record_path(ROOT, "h200", spec.op)
    assert unbounded.filled > unbounded.measured > 0
    bounded = spec.model_copy(update={"dispatch": spec.dispatch.model_copy(update={"fill_distance": 0})})
    table = frozen_rows(bounded, chip, path, hashes)
    assert table.filled == table.measured == unbounded.measured
    assert all(r.source is None or r.measured is not None for r in table.rows)
    assert len(table.rows) == len(unbounded.rows) - unbounded.filled + unbounded.measured
    assert all(f.measured for f in fill_ranges(bounded, table.rows, config_names(table.rows)))


def test_fill_moves_lets_a_row_fill_only_buckets_that_differ_in_those_fields(tmp_path, h200_table):
    """mamba3's ``dispatch.fill_moves: [work]``: each filled row of its H200 table comes from the
    tuned row of the same N, P, R (and C, Z, dtype) buckets at another grid size; every bucket of
    another shape runs the default. A field the key does not bucket is refused."""
    (spec, table), chip = h200_table("mamba3_mimo_bwd_fwd"), profile("h200")
    work = list(spec.dispatch.key).index("work")
    filled = [r for r in table.rows if r.source is not None and r.measured is None]
    assert filled and all(r.source[:work] + r.source[work + 1:] == r.key[:work] + r.key[work + 1:]
                          and r.source[work] != r.key[work] for r in filled)
    anywhere = spec.model_copy(update={"dispatch": spec.dispatch.model_copy(update={"fill_moves": ()})})
    assert frozen_rows(anywhere, chip, records.record_path(ROOT, "h200", spec.op),
                       kernel_hashes(ROOT, spec, "cuda")).filled > table.filled
    text = (ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml").read_text().replace("fill_moves: [work]", "fill_moves: [C]")
    (tmp_path / "mamba3_mimo_bwd_fwd.yaml").write_text(text)
    with pytest.raises(SpecError, match=r"dispatch\.fill_moves.*bucketed key fields"):
        load_spec(tmp_path / "mamba3_mimo_bwd_fwd.yaml", ROOT)


@pytest.mark.parametrize("op", ["chunk_gla_fwd_o_gk"])
def test_fill_ranges_serve_every_filled_key_and_nothing_else(op, h200_table):
    spec, table = h200_table(op)
    names = config_names(table.rows)
    fills = fill_ranges(spec, table.rows, names)
    fields = list(spec.dispatch.key.values())
    bucketed = [i for i, f in enumerate(fields) if split_key_field(f)[1]]
    counts = [len(split_key_field(fields[i])[1]) + 1 for i in bucketed]
    rows = {r.key: names[(r.variant, tuple(r.point.items()))] for r in table.rows}
    tuned = {r.key for r in table.rows if r.source is None}
    # a measured bucket is a range of its own (its neighbours took other points), so the ranges
    # compress the filled keys less than the nearest fill alone did
    assert table.filled > 0 and len(fills) < table.filled / 4
    for plain in {tuple(v for i, v in enumerate(k) if i not in bucketed) for k in rows}:
        for index in itertools.product(*(range(n) for n in counts)):
            it, ip = iter(index), iter(plain)
            key = tuple(next(it) if i in bucketed else next(ip) for i in range(len(fields)))
            held = {f.config for f in fills if f.plain == plain
                    and all(lo <= x <= hi for x, (lo, hi) in zip(index, f.ranges))}
            if key in tuned:
                continue
            assert held == ({rows[key]} if key in rows else set()), key


def test_a_fill_for_one_key_is_that_keys_row_of_the_whole_fill():
    """fill_nearest(..., only=key), what a leave-one-out check asks, gives the row the fill of every
    key gives that key, or none where that fill gives none (the GLA H200 records, each tuned key
    left out in turn)."""
    from opgen.table.fill_nearest import fill_nearest
    from opgen.table.table_records import fresh_winners

    spec, chip = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT), profile("h200")
    fresh = fresh_winners(spec, chip, records.record_path(ROOT, "h200", spec.op), kernel_hashes(ROOT, spec, "cuda"))
    assert len(fresh) >= 4
    filled = 0
    for key in sorted(fresh)[::max(1, len(fresh) // 6)]:
        others = {k: w for k, w in fresh.items() if k != key}
        whole = [r for r in fill_nearest(spec, chip, others) if r.key == key]
        assert fill_nearest(spec, chip, others, only=key) == whole
        filled += bool(whole)
    assert filled >= 1


def test_a_config_keeps_its_name_when_others_come_and_go(h200_table):
    """Config names come from the tunables, not from their rank: a re-tune that adds, drops or
    moves other configs leaves a config's name as it was, and no two configs share one."""
    spec, table = h200_table("mamba3_mimo_bwd_fwd")
    names = config_names(table.rows)
    assert len(set(names.values())) == len(names) > 2
    assert all(re.fullmatch(rf"{variant}/[0-9a-f]{{6,}}", name) for (variant, _), name in names.items())
    kept = [r for r in table.rows if names[(r.variant, tuple(r.point.items()))] != min(names.values())]
    assert {i: n for i, n in config_names(tuple(kept[::-1])).items()} == {
        i: n for i, n in names.items() if n != min(names.values())}
