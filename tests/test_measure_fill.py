"""The measured fill: measure records round-trip; an untuned bucket takes the tuned point that
ran fastest there in its latest run, over the nearest bucket's, or keeps the spec's default where
that ran faster (and so do the unmeasured buckets nearer to it than to any tuned or filled
one); it falls back to the nearest fill when its measures are failed, stale or of
points no winner holds; the frozen table marks
measured fills; and ``opgen tune --measure-fill`` on the interpreter writes the records that
``opgen build`` freezes, deterministically."""
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import pytest

from opgen.storage import records
from opgen.table import table as tables
from opgen.table import bucket_shapes, fill_nearest, fits, table_records
from opgen.spec.keys import key_of
from opgen.errors import RecordError
from opgen.render.kernels import kernel_hashes
from opgen.spec.spec import load_spec
from opgen.build.table_layout import layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_records import BASE, CHIP, OP, POINT, TOOLS, _filled, _path, _winner, _write, gla, hashes  # noqa: E402,F401
from test_tune import RECORDS, _opgen, _project, _records  # noqa: E402


def _measure(key, case, won, ms, run="2026-12-01/aaaa", kernel_hash=None):
    return records.MeasureRecord(
        op=OP, chip="h200", toolchain=TOOLS, kernel_hash=kernel_hash or won.kernel_hash, key=key, case=case,
        variant=won.variant, point=dict(won.point), study=won.study, date="2026-12-01", ms=ms,
        source=f"winner of {won.key!r}", run=run)


@pytest.fixture()
def setup(tmp_path, gla):
    small = _winner(gla)  # K and V buckets 3
    large = _winner(gla, "fp32_general_tiled", point={**POINT, "DOT_PRECISION": "tf32x3"}, K=512, B=1)  # K 5
    case = {**small.case, "K": 256}  # K bucket 4: as near to both, so the nearest fill takes the larger
    target = key_of(gla, bucket_shapes.case_params(gla, case, "test"))
    return _path(tmp_path), small, large, case, target


def test_a_measure_record_round_trips_and_refuses_what_is_malformed(setup):
    path, small, _, case, target = setup
    rec = _measure(target, case, small, 0.1)
    assert records.MeasureRecord.from_json(json.loads(rec.line())) == rec
    failed = dataclasses.replace(rec, ms=None)
    _write(path, [small, rec, failed])
    assert records.read(path, op=OP, chip="h200").records == (small, rec, failed)
    with path.open("a") as f:
        f.write(rec.line()[:40])  # a writer died mid-line
    torn = records.read(path, op=OP, chip="h200")
    assert (torn.records, torn.torn) == ((small, rec, failed), 1)
    records.append(path, [rec])  # the next append cuts it
    assert records.read(path, op=OP, chip="h200").records == (small, rec, failed, rec)
    data = json.loads(rec.line())
    with pytest.raises(RecordError, match="given twice"):
        path.write_text(rec.line()[:-1] + ',"ms":0.5}\n')
        records.read(path, op=OP, chip="h200")
    with pytest.raises(RecordError, match="missing keys \\['run'\\]"):
        records.MeasureRecord.from_json({k: v for k, v in data.items() if k != "run"})
    with pytest.raises(RecordError, match="ms: expected a finite number"):
        records.MeasureRecord.from_json({**data, "ms": "fast"})
    # a failed point says why; one that ran has no reason; lines from before reasons read ""
    why = dataclasses.replace(rec, ms=None, reason="wrong_result: o: FAIL")
    assert records.MeasureRecord.from_json(json.loads(why.line())) == why
    with pytest.raises(RecordError, match="reason: expected empty for a point that ran"):
        records.MeasureRecord.from_json({**data, "reason": "crash: x"})
    assert records.MeasureRecord.from_json({k: v for k, v in data.items() if k != "reason"}).reason == ""


def test_the_measured_winner_beats_the_nearest_bucket(setup, gla, hashes):
    path, small, large, case, target = setup
    _write(path, [small, large])
    nearest = tables.frozen_rows(gla, CHIP, path, hashes)
    assert _filled(nearest)[target].source == large.key and nearest.measured == 0
    _write(path, [small, large, _measure(target, case, small, 0.10), _measure(target, case, large, 0.20)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    row = _filled(table)[target]
    assert (row.variant, row.source, row.measured.ms) == (small.variant, small.key, 0.10)
    assert row.comment.startswith("measured fastest here (0.1000 ms, run 2026-12-01/aaaa), from ")
    assert table.measured == 1 and table.filled == nearest.filled  # one row changed how, none added
    # the measured bucket serves its neighbours as a tuned one would: one tasks bucket up, it is
    # nearer than either winner (the nearest fill took the larger at equal distance before)
    above = target[:7] + (target[7] + 1,)
    assert _filled(nearest)[above].source == large.key
    assert (_filled(table)[above].source, _filled(table)[above].variant) == (target, small.variant)
    assert _filled(table)[above].measured is None and _filled(table)[above].winner.median_ms == 0.10
    assert tables.frozen_rows(gla, CHIP, path, hashes) == table


@pytest.mark.parametrize("measures, source", [
    # each run compares within itself, and a point's shares of the fastest count over every run
    # (geomean): 1.0 and 1.01 beat 1.2 and 1.0, though the latest run alone ranks the other way
    (lambda t, c, s, l: [_measure(t, c, s, 0.1, run="a"), _measure(t, c, l, 0.12, run="a"),
                         _measure(t, c, s, 0.101, run="b"), _measure(t, c, l, 0.1, run="b")], "small"),
    (lambda t, c, s, l: [_measure(t, c, s, 0.1, run="a"), _measure(t, c, l, 0.2, run="a"),
                         _measure(t, c, s, 0.3, run="b"), _measure(t, c, l, 0.1, run="b")], "large"),
    # the candidates are the latest run's: one it failed, or did not time, is none
    (lambda t, c, s, l: [_measure(t, c, s, 0.1, run="a"), _measure(t, c, l, 0.2, run="a"),
                         _measure(t, c, s, None, run="b"), _measure(t, c, l, 0.3, run="b")], "large"),
    (lambda t, c, s, l: [_measure(t, c, s, 0.1, run="a"), _measure(t, c, l, 0.2, run="a"),
                         _measure(t, c, l, 0.3, run="b")], "large"),
    # equal times: the nearest fill's order
    (lambda t, c, s, l: [_measure(t, c, s, 0.2), _measure(t, c, l, 0.2)], "large"),
    # a failed point is no candidate
    (lambda t, c, s, l: [_measure(t, c, s, None), _measure(t, c, l, 0.3)], "large"),
])
def test_the_measured_fill_weighs_every_run_and_breaks_ties_by_nearness(setup, gla, hashes, measures, source):
    path, small, large, case, target = setup
    _write(path, [small, large, *measures(target, case, small, large)])
    row = _filled(tables.frozen_rows(gla, CHIP, path, hashes))[target]
    assert row.measured is not None and row.source == {"small": small, "large": large}[source].key


@pytest.mark.parametrize("measures", [
    lambda t, c, s, l: [_measure(t, c, s, None)],  # every candidate failed
    lambda t, c, s, l: [_measure(t, c, s, 0.1, kernel_hash="sha256:edited")],  # measured on another kernel
    lambda t, c, s, l: [dataclasses.replace(_measure(t, c, s, 0.1), point={**s.point, "num_warps": 8})],  # no winner's
])
def test_without_a_current_measure_the_nearest_fill_serves(setup, gla, hashes, measures):
    path, small, large, case, target = setup
    _write(path, [small, large, *measures(target, case, small, large)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    row = _filled(table)[target]
    assert (row.measured, row.source, table.measured) == (None, large.key, 0)


def test_a_search_that_never_faced_the_measured_choice_waits_for_the_measure_step(setup, gla, hashes):
    """A winner on a measured bucket whose search never ran the point measured fastest there (a
    search over some variants alone) is no tuned row: the bucket keeps its measured fill, and the
    winner's point is a candidate, which a later run on the bucket may find fastest."""
    from opgen.spec.hardware import profile
    from opgen.tune.measure_fill import measure_fill
    from opgen.space.plan import buckets

    path, small, large, case, target = setup
    measured = [_measure(target, case, small, 0.10), _measure(target, case, large, 0.20)]
    narrow = _winner(gla, "post_general_tiled", point={**POINT, "BV": 128}, median=0.09, **{**case, "K": 256})
    assert narrow.key == target
    _write(path, [small, large, *measured, narrow])
    fresh = table_records.fresh_winners(gla, CHIP, path, hashes)
    found = table_records.read_keyed(gla, CHIP, path).records
    assert target not in fresh and table_records.pending_winners(gla, CHIP, path, found, hashes) == {target: narrow}
    row = _filled(tables.frozen_rows(gla, CHIP, path, hashes))[target]
    assert (row.variant, row.point["BV"], row.source) == (small.variant, 64, small.key)
    # the measure step measures the bucket again, the pending point among its candidates
    sunk = []
    measure_fill(gla, profile("h200"), buckets(gla, [case]), fresh, "b", lambda points, bucket: {p: "" for p in points},
                 lambda points, bucket: {p: 0.05 if p.config["BV"] == 128 else 0.1 for p in points},
                 lambda kind, rec: sunk.append(records.MeasureRecord(
                     op=OP, chip="h200", toolchain=TOOLS, kernel_hash=hashes[rec["variant"]], date="2026-12-02",
                     **{k: tuple(v) if k == "key" else v for k, v in rec.items()})),
                 pending={target: narrow})
    assert {(r.variant, r.point["BV"]) for r in sunk} >= {(narrow.variant, 128), (small.variant, 64)}
    _write(path, [small, large, *measured, narrow, *sunk])
    row = _filled(tables.frozen_rows(gla, CHIP, path, hashes))[target]
    assert (row.variant, row.point["BV"], row.source, row.measured.ms) == (narrow.variant, 128, target, 0.05)
    # a search that faced the measured choice (a side-by-side re-measure of it) is a tuned row
    faced_small = dataclasses.replace(narrow, remeasured_ms={
        **narrow.remeasured_ms, "post_general_tiled:" + ",".join(f"{k}={v}" for k, v in small.point.items()): 0.1})
    _write(path, [small, large, *measured, faced_small])
    assert table_records.fresh_winners(gla, CHIP, path, hashes)[target].point["BV"] == 128
    assert table_records.pending_winners(gla, CHIP, path, table_records.read_keyed(gla, CHIP, path).records, hashes) == {}
    # the measured choice weighs every run, as the fill does: a later run that timed large a hair
    # ahead leaves small the choice, which that search faced
    later = [_measure(target, case, small, 0.101, run="b"), _measure(target, case, large, 0.100, run="b")]
    _write(path, [small, large, *measured, *later, faced_small])
    assert table_records.fresh_winners(gla, CHIP, path, hashes)[target].point["BV"] == 128


def test_a_candidate_never_near_the_fastest_on_enough_buckets_is_left_out(setup, gla, hashes):
    """Successive halving across buckets: a candidate that ran under the share of the fastest's
    speed on every bucket it was measured on, on enough of them, is measured on its own bucket
    alone; one that came near once, or was measured on too few, stays."""
    from opgen.spec.hardware import profile
    from opgen.table.fill_measured import current_measures
    from opgen.tune.measure_fill import candidates, measure_fill, outrun
    from opgen.space.plan import buckets
    from opgen.space.space import Point

    path, small, large, case, target = setup
    chip = profile("h200")
    pool = candidates(gla, chip, {small.key: small, large.key: large})
    shapes = [{**case, "T": t} for t in (512, 4096, 40000)]  # three tasks buckets of the target's K and V
    keys = [key_of(gla, bucket_shapes.case_params(gla, c, "test")) for c in shapes]
    assert len(set(keys)) == 3
    runs = {k: (_measure(k, c, small, 0.10), _measure(k, c, large, 0.20)) for k, c in zip(keys, shapes)}
    out = outrun(gla, chip, pool, runs, 0.95, 3)
    assert [(o.key, o.point.variant, o.buckets, o.best) for o in out] == [(large.key, large.variant, 3, 0.5)]
    assert outrun(gla, chip, pool, runs, 0.95, 4) == []  # measured on too few buckets
    assert outrun(gla, chip, pool, runs, 0.0, 1) == []  # 0 keeps every candidate
    near = {**runs, keys[0]: (_measure(keys[0], shapes[0], small, 0.10), _measure(keys[0], shapes[0], large, 0.104))}
    assert outrun(gla, chip, pool, near, 0.95, 3) == []  # came within 5% once
    failed = {**runs, keys[0]: (_measure(keys[0], shapes[0], small, 0.10), _measure(keys[0], shapes[0], large, None))}
    assert [o.best for o in outrun(gla, chip, pool, failed, 0.95, 3)] == [0.5]  # a failure counts as 0
    # a later run that left it out takes none of that evidence away: it stays out on the next step
    later = [_measure(k, c, small, 0.09, run="2026-12-02/bbbb") for k, c in zip(keys, shapes)]
    every = current_measures([*(r for recs in runs.values() for r in recs), *later], hashes)
    assert every[keys[0]] == (*runs[keys[0]], later[0])
    assert [(o.point.variant, o.buckets, o.best) for o in outrun(gla, chip, pool, every, 0.95, 3)] == [
        (large.variant, 3, 0.5)]
    # each run compares within itself: a bucket counts a candidate's best share over its runs
    again = [_measure(keys[0], shapes[0], p, 0.10, run="2026-12-02/cccc") for p in (large, small)]
    earlier = [r for recs in runs.values() for r in recs]
    assert outrun(gla, chip, pool, current_measures([*earlier, *again], hashes), 0.95, 3) == []
    # the measure step leaves it out of another bucket, not out of the bucket it won
    measured = []
    twin = _winner(gla, large.variant, point=large.point, K=512, B=1, T=40000)  # the same point won here too
    assert twin.key != large.key
    found = buckets(gla, [case, large.case, twin.case])
    measure_fill(gla, chip, found, {small.key: small}, "run", lambda points, bucket: {p: "" for p in points},
                 lambda points, bucket: {p: 0.1 for p in points}, lambda kind, rec: measured.append(rec),
                 pending={large.key: large, twin.key: twin}, left_out=out)
    ran = {(tuple(r["key"]), r["variant"]) for r in measured}
    assert (target, large.variant) not in ran and (target, small.variant) in ran
    assert (large.key, large.variant) in ran and (twin.key, large.variant) in ran
    assert Point.of(large.variant, large.point, gla.tunables_for("cuda")) == out[0].point


def test_tune_refuses_a_drop_share_outside_0_1(tmp_path):
    proc = _opgen(tmp_path, "tune", "toy_op", "--chip", "interpreter", "--trials", "0",
                  "--measure-fill", "--drop-below", "1.5", check=False)
    assert proc.returncode == 2 and "argument --drop-below: expected a number in [0, 1], got '1.5'" in proc.stderr


def test_a_variant_illegal_on_part_of_a_bucket_fills_no_row_there(setup, gla, hashes):
    """A descriptor grid is legal where K and V are multiples of 8 only, which the ``align`` key
    field parts from the other calls: measured fastest on an aligned bucket, it fills that bucket,
    and no row of it serves the unaligned bucket beside it (K = 97 there; the generated API would
    refuse the call), which the nearest legal row fills."""
    path, small, large, case, target = setup
    tma = _winner(gla, "fold_general_tma", point={**POINT, "num_stages": 1}, K=64, V=64)
    assert fits.point_fits(gla, CHIP, tma.variant, tma.point, bucket_shapes.case_params(gla, tma.case, "test"))
    unaligned = tma.key[:6] + (0,) + tma.key[7:]
    assert fits.legal_across(gla, tma.variant, tma.case, "test")
    assert not fits.legal_across(gla, tma.variant, tma.case, "test", unaligned)
    assert (bucket_shapes.low_params(gla, tma.case, "test")["K"], bucket_shapes.low_params(gla, tma.case, "test")["V"]) == (40, 40)
    assert bucket_shapes.low_params(gla, tma.case, "test", unaligned)["K"] == 33
    pointer = _measure(target, case, small, 0.10)
    _write(path, [small, large, tma, _measure(target, case, tma, 0.05), pointer])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    filled = _filled(table)
    assert (filled[target].variant, filled[target].measured.ms) == ("fold_general_tma", 0.05)
    assert {r.key[6] for r in table.rows if r.variant == "fold_general_tma"} == {1}
    # the unaligned bucket beside it: small and large are as near, the larger bucket wins the tie
    assert filled[target[:6] + (0,) + target[7:]].variant == large.variant


def test_a_tuned_row_illegal_on_part_of_its_bucket_stops_the_build(tmp_path, gla, hashes):
    """Without the ``align`` field, a descriptor grid's tuned row would serve K = 33 in its
    bucket: the build refuses it and says the key needs a field."""
    key = {k: v for k, v in gla.dispatch.key.items() if k != "align"}
    coarse = gla.model_copy(update={"dispatch": gla.dispatch.model_copy(update={"key": key})})
    tma = _winner(gla, "fold_general_tma", point={**POINT, "num_stages": 1}, K=64, V=64)
    path = _path(tmp_path)
    _write(path, [tma])
    assert [r.variant for r in tables.frozen_rows(gla, CHIP, path, hashes, fill=False).rows] == [tma.variant]
    with pytest.raises(RecordError, match=r"not legal for \{'K': 33, 'V': 33\}, a call of its bucket .*needs a field"):
        tables.frozen_rows(coarse, CHIP, path, hashes)


def _default_measure(gla, target, case, ms, hashes, **change):
    from opgen.space.space import default_point

    point = default_point(gla, CHIP, bucket_shapes.case_params(gla, case, "test"))
    return records.MeasureRecord(
        op=OP, chip="h200", toolchain=TOOLS, kernel_hash=hashes[point.variant], key=target, case=case,
        variant=point.variant, point={**point.config, **change}, study="", date="2026-12-01", ms=ms,
        source="spec default", run="2026-12-01/aaaa")


@pytest.mark.parametrize("default_ms, small_ms, kept", [
    (0.05, 0.10, True),  # the default ran fastest: the bucket keeps it
    (0.10, 0.10, False),  # a tie goes to the tuned point
    (0.05, None, True),  # every tuned point failed there, the default ran
    (None, 0.10, False),  # the default failed there
])
def test_a_bucket_where_the_default_ran_fastest_keeps_it(setup, gla, hashes, default_ms, small_ms, kept):
    path, small, large, case, target = setup
    _write(path, [small, large, _measure(target, case, small, small_ms), _measure(target, case, large, 0.20),
                  _default_measure(gla, target, case, default_ms, hashes)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    assert (target in _filled(table)) == (not kept) and table.kept == ((target,) if kept else ())
    if not kept:
        assert _filled(table)[target].measured.ms == min(m for m in (small_ms, 0.20) if m is not None)
    # it serves the buckets around it as a filled one would: one tasks bucket up it is nearer than
    # either winner, so that bucket keeps the default too; one K bucket down, small is nearer
    above = target[:7] + (target[7] + 1,)
    if kept:
        assert above not in _filled(table) and fill_nearest.default_source(gla, CHIP, table, above) == target
        assert fill_nearest.default_source(gla, CHIP, table, target) is None  # kept itself, no neighbour's
        # the table counts the buckets the kept one leaves to the default, each of them without a row
        assert table.defaulted >= 1 and table.defaulted == sum(
            1 for key in itertools.product(*(range(n) for n in (6, 7, 2, 4)))
            if fill_nearest.default_source(gla, CHIP, table, target[:4] + key) is not None)
    else:
        assert table.defaulted == 0
        assert _filled(table)[above].source == target
    below = small.key[:7] + (target[7] + 1,)
    assert below != small.key and _filled(table)[below].source == small.key


@pytest.mark.parametrize("stale", [
    lambda r, hashes: dataclasses.replace(r, kernel_hash="sha256:edited"),  # measured on another kernel
    lambda r, hashes: dataclasses.replace(r, point={**r.point, "num_warps": 2}),  # the default is another point now
    lambda r, hashes: dataclasses.replace(r, run="2026-11-30/bbbb"),  # an earlier run
])
def test_a_default_measured_on_another_kernel_point_or_run_keeps_nothing(setup, gla, hashes, stale):
    path, small, large, case, target = setup
    default = stale(_default_measure(gla, target, case, 0.01, hashes), hashes)
    _write(path, [small, large, default, _measure(target, case, small, 0.10), _measure(target, case, large, 0.20)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    assert table.kept == () and _filled(table)[target].source == small.key


def test_a_measure_on_a_tuned_bucket_changes_nothing(setup, gla, hashes):
    path, small, large, _, _ = setup
    _write(path, [small, large])
    before = tables.frozen_rows(gla, CHIP, path, hashes)
    _write(path, [small, large, _measure(small.key, small.case, large, 0.01)])
    assert tables.frozen_rows(gla, CHIP, path, hashes).rows == before.rows


def test_the_layout_marks_measured_fills_and_keeps_them_apart_from_nearest_ranges(setup, gla, hashes):
    path, small, large, case, target = setup
    _write(path, [small, large, _measure(target, case, large, 0.1), _measure(target, case, small, 0.2)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    assert _filled(table)[target].source == large.key  # the same point the nearest fill gives
    fills = layout(gla, table)["fills"]
    marked = [f for f in fills if "measured fastest here" in " ".join(f[3])]
    assert len(marked) == 1
    # the range takes in the measured bucket and tuned ones (a tuned row wins over any range),
    # never a bucket the nearest fill serves with the same config
    cells = set(itertools.product(*(range(a, b + 1) for a, b in marked[0][1])))
    assert cells == {target[4:], large.key[4:]}
    assert layout(gla, table) == layout(gla, tables.frozen_rows(gla, CHIP, path, hashes))


def test_tune_measure_fill_on_the_interpreter_records_and_the_build_freezes_it(tmp_path):
    root = _project(tmp_path)
    spec = load_spec(root / "specs" / "toy_op.yaml", root)
    kernels = kernel_hashes(root, spec, "npu")
    winners = {}
    # two tuned buckets, two distinct points; the one of the "wrong" variant fails its check
    for key, n, variant, block in (((0,), 50, "wrong", 16), ((1,), 3000, "good", 32)):
        winners[key] = dict(op="toy_op", chip="interpreter", toolchain={"triton": "x"}, kernel_hash=kernels[variant],
                            key=key, case={"N": n, "dtype": "float32"}, variant=variant, point={"BLOCK": block},
                            study=f"toy/{n}", date="2026-12-01", median_ms=0.1, remeasured_ms={}, margin=None,
                            error={}, budget=None)
    records.append(root / RECORDS, [records.WinnerRecord(**w) for w in winners.values()])
    common = ("--warmup", "1", "--repeat", "2", "--no-progress", "--point-timeout", "30", "--date", "2026-12-01")
    plan = _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "far", "--trials", "0",
                  "--measure-fill", "--dry-run").stdout  # what it would run, run nowhere
    assert plan.splitlines()[-2:] == ["N > 4096: 3 candidates on 1 case",
                                      "1 buckets to measure, 3 candidates, 3 compile-and-check tasks; 0 kept"]
    assert not [r for r in _records(root) if r["kind"] == "measure"]
    out = _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "far", "--trials", "0",
                 "--measure-fill", *common).stdout
    measures = [r for r in _records(root) if r["kind"] == "measure"]
    # each distinct winner once, and the spec's default (good, BLOCK 16: no winner's point)
    assert sorted((m["source"], m["variant"], m["point"]["BLOCK"]) for m in measures) == [
        ("spec default", "good", 16), ("winner of (0,)", "wrong", 16), ("winner of (1,)", "good", 32)]
    assert {tuple(m["key"]) for m in measures} == {(2,)} and len({m["run"] for m in measures}) == 1
    assert [m["study"] for m in measures if m["source"] == "spec default"] == [""]
    failed = [m for m in measures if m["variant"] == "wrong"]
    assert len(failed) == 1 and failed[0]["ms"] is None and failed[0]["reason"].startswith("wrong_result: ")
    assert all(m["ms"] > 0 and m["reason"] == "" for m in measures if m["variant"] == "good")
    assert "N > 4096: (checked in " in out and "(wrong_result: " in out and "spec default: good:BLOCK=16" in out
    # run again: the bucket's run holds every candidate, so it is kept (a cut run resumes there)
    again = _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "far", "--trials", "0",
                   "--measure-fill", *common).stdout
    assert f"N > 4096: (measured in run {measures[0]['run']}, kept)" in again and "(wrong_result: " in again
    assert _opgen(root, "tune", "toy_op", "--chip", "interpreter", "--cases", "far", "--trials", "0",
                  "--measure-fill", "--dry-run").stdout.splitlines()[-1].startswith("0 buckets to measure")
    assert [r for r in _records(root) if r["kind"] == "measure"] == measures
    # the interpreter's times decide nothing here: the default is set slower, then faster
    lines = (root / RECORDS).read_text().splitlines()

    def default_ms(ms):
        edited = [json.loads(line) for line in lines]
        for r in edited:
            if r.get("source") == "spec default":
                r["ms"] = ms
        (root / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in edited))

    best = next(m for m in measures if m["variant"] == "good" and m["source"] != "spec default")
    default_ms(best["ms"] * 2)
    _opgen(root, "build")
    table = (root / "generated" / "toy_op" / "table_interpreter.py").read_text()
    assert "1 with the tuned point measured fastest there" in " ".join(table.split())
    fill = table[table.index("FILL = ("):]
    assert "# N > 4096, measured fastest here" in fill
    assert '((), ((2, 2),), "good/' in fill
    config = fill.split('((), ((2, 2),), "')[1].split('"')[0]
    frozen = {}
    exec(table, frozen)  # the table is constants only
    assert frozen["CONFIGS"][config][0] == "good"
    assert frozen["CONFIGS"][config][1]["BLOCK"] == best["point"]["BLOCK"]
    explained = json.loads(_opgen(root, "explain", "toy_op", "--chip", "interpreter", "N=5000", "--json").stdout)
    assert explained["filled_by"] == "measured" and explained["config"] == best["point"]
    _opgen(root, "build")
    assert (root / "generated" / "toy_op" / "table_interpreter.py").read_text() == table
    # the default ran faster: the bucket keeps it, no row and no nearest fill there
    default_ms(best["ms"] / 2)
    _opgen(root, "build")
    kept = (root / "generated" / "toy_op" / "table_interpreter.py").read_text()
    assert "1 more left to the spec's default, measured fastest there" in " ".join(kept.split())
    assert "measured fastest here" not in kept and "(2, 2)" not in kept[kept.index("FILL = ("):]
    explained = json.loads(_opgen(root, "explain", "toy_op", "--chip", "interpreter", "N=5000", "--json").stdout)
    assert explained["row"] == "default" and explained["config"] == {"BLOCK": 16}
    assert explained["why"] == "the spec's default, measured faster here than every tuned point"


def test_the_records_report_names_a_bucket_the_nearest_fill_puts_on_a_slower_kernel(setup, gla, hashes):
    from opgen.evidence.report import report

    path, small, large, case, target = setup
    _write(path, [small, large, _measure(target, case, small, 0.10), _measure(target, case, large, 0.15)])
    lines = report(gla, CHIP, path, hashes).splitlines()
    assert lines[-2] == "Measured fills: 1 untuned buckets take the tuned point that ran fastest there"
    assert lines[-1].startswith("dtype=bfloat16, BT=64, big_scale=False, H1=False, K in (128, 256], ")
    assert f"nearest fill's point (from {large.key!r}) ran 50% slower beside post_general_tiled" in lines[-1]
    _write(path, [small, large, _measure(target, case, large, 0.10), _measure(target, case, small, 0.15)])
    assert report(gla, CHIP, path, hashes).splitlines()[-1].startswith("Measured fills: 1 ")  # the same point
    # within the tuner's default tie margin (2%) the two points tie: no edge to move
    _write(path, [small, large, _measure(target, case, small, 0.100), _measure(target, case, large, 0.101)])
    assert report(gla, CHIP, path, hashes).splitlines()[-1].startswith("Measured fills: 1 ")
    # the default ran fastest: the bucket keeps it
    _write(path, [small, large, _measure(target, case, small, 0.10), _default_measure(gla, target, case, 0.05, hashes)])
    assert report(gla, CHIP, path, hashes).splitlines()[-1] == (
        "Measured fills: 0 untuned buckets take the tuned point that ran fastest there, 1 keep the spec's "
        "default, which ran faster there than every tuned point")


def test_explain_says_how_a_row_was_filled(setup, gla, hashes, tmp_path):
    from opgen.evidence import explain

    path, small, large, case, target = setup
    _write(path, [small, large, _measure(target, case, small, 0.10), _measure(target, case, large, 0.20)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    here = explain.explain(tmp_path, gla, CHIP, case, table, hashes)
    assert (here["filled_by"], here["measured"]["ms"], here["variant"]) == ("measured", 0.10, small.variant)
    assert "  measure 0.1000 ms here (run 2026-12-01/aaaa)" in explain.text(here).splitlines()
    above = explain.explain(tmp_path, gla, CHIP, {**case, "B": 8}, table, hashes)  # one tasks bucket up
    assert above["filled_by"] == "nearest measured" and "filled from the measured bucket" in explain.text(above)
    far = explain.explain(tmp_path, gla, CHIP, {**case, "K": 32}, table, hashes)
    assert far["filled_by"] == "nearest"


def test_a_winner_is_carried_to_another_shape_with_the_tunables_its_variant_fixes(gla):
    from opgen.space.space import carried

    vloop = {**POINT, "EARLY_INTRA": True}  # vloop fixes BK = max(16, pow2(K)) and EARLY_INTRA
    k32 = bucket_shapes.case_params(gla, {**BASE, "K": 32}, "test")
    assert carried(gla, "post_vloop_tiled", vloop, k32) == {**vloop, "BK": 32}
    assert carried(gla, "post_general_tiled", POINT, k32) == POINT  # general fixes nothing here
    assert carried(gla, "post_vloop2_tiled", vloop, bucket_shapes.case_params(gla, {**BASE, "K": 192}, "test"))["BK"] == 128


def test_the_measure_step_runs_each_winner_carried_to_the_bucket(gla):
    from opgen.spec.hardware import profile
    from opgen.tune.measure_fill import carried_point, measure_fill
    from opgen.space.plan import buckets
    from opgen.space.space import Point

    chip = profile("h200")
    vloop = _winner(gla, "post_vloop_tiled", point={**POINT, "EARLY_INTRA": True}, K=64)
    general = _winner(gla, "post_general_tiled", point={**POINT, "BK": 32}, K=64, V=256)
    found = buckets(gla, [{**BASE, "K": 32}, {**BASE, "K": 192}, {**BASE, "K": 16, "T": 8192}])
    pool = {vloop.key: vloop, general.key: general}
    sunk, checked = [], []

    def check(points, bucket):
        checked.append((bucket.key, [p.config["BK"] for p in points if p.variant == "post_vloop_tiled"]))
        return {p: "" for p in points}

    measure_fill(gla, chip, found, pool, "run", check,
                 lambda points, bucket: {p: 0.1 for p in points}, lambda kind, rec: sunk.append(rec))
    # K = 32: vloop runs its one K tile of 32 columns; K = 192: vloop is not legal (K <= 128);
    # K = 16 (bucket K <= 32, another tasks bucket): a 16-column tile would not cover a K = 32 call
    assert found[2].key[4] == found[0].key[4] and found[2].key != found[0].key
    assert checked == [(found[0].key, [32]), (found[1].key, []), (found[2].key, [])]
    assert {r["variant"] for r in sunk if r["key"] == list(found[0].key)} >= {"post_vloop_tiled", "post_general_tiled"}
    assert carried_point(gla, chip, Point.of(vloop.variant, vloop.point, gla.tunables_for("cuda")), found[1]) is None


def test_a_carried_point_measured_fastest_fills_the_bucket_with_its_own_tunables(gla, hashes, tmp_path):
    path = _path(tmp_path)
    vloop = _winner(gla, "post_vloop_tiled", point={**POINT, "EARLY_INTRA": True}, K=64)
    general = _winner(gla, "post_general_tiled", K=128)
    case = {**BASE, "K": 32}
    target = key_of(gla, bucket_shapes.case_params(gla, case, "test"))
    ran = dataclasses.replace(_measure(target, case, vloop, 0.05), point={**vloop.point, "BK": 32})
    _write(path, [vloop, general, ran, _measure(target, case, general, 0.10)])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    row = _filled(table)[target]
    assert (row.variant, row.point["BK"], row.source, row.measured.ms) == ("post_vloop_tiled", 32, vloop.key, 0.05)
    # its neighbours take the point as measured here, not the winner's K = 64 tile
    above = target[:7] + (target[7] + 1,)
    assert (_filled(table)[above].source, _filled(table)[above].point["BK"]) == (target, 32)


def test_a_point_measured_at_a_shape_whose_fixed_tile_misses_the_bucket_edge_fills_nothing(gla, hashes, tmp_path):
    path = _path(tmp_path)
    vloop = _winner(gla, "post_vloop_tiled", point={**POINT, "EARLY_INTRA": True}, K=64)
    general = _winner(gla, "post_general_tiled", point={**POINT, "BK": 32}, K=128)
    case = {**BASE, "K": 16}  # bucket K <= 32: vloop fixes BK 16 here and 32 at K = 32
    target = key_of(gla, bucket_shapes.case_params(gla, case, "test"))
    ran = dataclasses.replace(_measure(target, case, vloop, 0.05), point={**vloop.point, "BK": 16})
    _write(path, [vloop, general, ran, _measure(target, case, general, 0.10)])
    row = _filled(tables.frozen_rows(gla, CHIP, path, hashes))[target]
    assert (row.variant, row.source, row.measured.ms) == ("post_general_tiled", general.key, 0.10)


def test_the_measure_step_keeps_a_bucket_its_latest_run_covers_and_measures_the_others(gla, hashes):
    from opgen.spec.hardware import profile
    from opgen.tune.measure_fill import earlier_runs, measure_fill
    from opgen.space.plan import buckets

    chip = profile("h200")
    general = _winner(gla, "post_general_tiled", point={**POINT, "BK": 32}, K=64, V=256)
    found = buckets(gla, [{**BASE, "K": 32}])
    pool = {general.key: general}
    first: list = []
    measure_fill(gla, chip, found, pool, "a", lambda points, bucket: {p: "" for p in points},
                 lambda points, bucket: {p: 0.1 for p in points}, lambda kind, rec: first.append(rec))
    recs = [records.MeasureRecord(op=OP, chip="h200", toolchain=TOOLS, kernel_hash=hashes[r["variant"]],
                                  date="2026-12-01", **r) for r in first]
    assert len(recs) == 2  # the winner and the spec's default

    def rerun(earlier, with_pool=pool):
        ran: list = []
        results = measure_fill(gla, chip, found, with_pool, "b", lambda points, bucket: {p: "" for p in points},
                               lambda points, bucket: {p: 0.2 for p in points}, lambda kind, rec: ran.append(rec),
                               earlier_runs(earlier, hashes))
        return results, ran

    results, ran = rerun(recs)
    assert ran == [] and results[0].earlier == "a" and [t[2] for t in results[0].times] == [0.1, 0.1]
    other = _winner(gla, "fold_general_tiled", point={**POINT, "BK": 32, "num_stages": 3}, K=48, V=256)
    for earlier, with_pool in (
            (recs[:1], pool),  # a candidate the earlier run lacks
            ([dataclasses.replace(r, kernel_hash="sha256:edited") for r in recs], pool),  # another kernel
            ([dataclasses.replace(r, case={**r.case, "T": 1024}) for r in recs], pool),  # another case
            (recs, {**pool, other.key: other})):  # a new winner since
        results, ran = rerun(earlier, with_pool)
        assert results[0].earlier == "" and {r["run"] for r in ran} == {"b"} and len(ran) == len(with_pool) + 1


def test_the_measure_step_begins_no_bucket_past_its_deadline_and_a_later_run_measures_the_rest(gla, hashes):
    import time

    from opgen.spec.hardware import profile
    from opgen.tune.measure_fill import bucket_candidates, earlier_runs, measure_fill
    from opgen.space.plan import buckets

    chip = profile("h200")
    general = _winner(gla, "post_general_tiled", point={**POINT, "BK": 32}, K=64, V=256)
    found = buckets(gla, [{**BASE, "K": 32}, {**BASE, "K": 128}])
    pool = {general.key: general}
    assert len(bucket_candidates(gla, chip, found, pool)) == 2

    def run(name, deadline, earlier=()):
        ran: list = []
        results = measure_fill(gla, chip, found, pool, name, lambda points, bucket: {p: "" for p in points},
                               lambda points, bucket: {p: 0.1 for p in points}, lambda kind, rec: ran.append(rec),
                               earlier_runs(earlier, hashes), deadline=deadline)
        return results, [records.MeasureRecord(op=OP, chip="h200", toolchain=TOOLS, kernel_hash=hashes[r["variant"]],
                                               date="2026-12-01", **r) for r in ran]

    results, ran = run("a", time.monotonic() - 1)
    assert results == [] and ran == []
    first, ran = run("a", time.monotonic() + 3600)
    assert len(first) == 2 and {tuple(r.key) for r in ran} == {r.key for r in first}
    # one bucket measured before the deadline: the next run keeps it and measures nothing past its own
    one = [r for r in ran if tuple(r.key) == first[0].key]
    results, again = run("b", time.monotonic() - 1, one)
    assert [(r.key, r.earlier) for r in results] == [(first[0].key, "a")] and again == []
