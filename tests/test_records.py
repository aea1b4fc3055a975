"""Tuning records: line format, append/read under a lock, latest winners, frozen rows, nearest fill."""
import dataclasses
import json
import multiprocessing
from pathlib import Path

import pytest

from opgen.spec import keys
from opgen.storage import records
from opgen.space import space
from opgen.table import table as tables
from opgen.table import fill_nearest, table_rows
from opgen.errors import RecordError
from opgen.spec.hardware import profile
from opgen.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
OP = "chunk_gla_fwd_o_gk"
CHIP = profile("h200")
TOOLS = {"triton": "3.6.0", "torch": "2.11.0", "cuda": "13.0"}
BASE = {"B": 4, "T": 2048, "H": 16, "K": 128, "V": 128, "chunk_size": 64, "dtype": "bfloat16"}
POINT = {"BK": 64, "BV": 64, "DOT_PRECISION": "ieee", "A_PAIR": True, "EARLY_INTRA": False, "EVICT_H": False,
         "TRIL_LOAD": False,
         "num_warps": 4, "num_stages": 2, "occupancy": 1}


@pytest.fixture(scope="module")
def gla():
    """The GLA spec under the nearest fill: these tests and those that import this fixture pin
    that rule on small record files (tests/test_fill_rank.py tests the ranked one the spec names)."""
    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    return spec.model_copy(update={"dispatch": spec.dispatch.model_copy(update={"fill_rule": "nearest"})})


@pytest.fixture(scope="module")
def hashes(gla):
    return {v.name: f"sha256:{v.name}" for v in space.variants_for(gla, "cuda")}


def _key(spec, case):
    return keys.key_of(spec, space.evaluate_params(spec, space.case_inputs(spec, case)))


def _winner(spec, variant="post_general_tiled", point=POINT, median=0.1234, date="2026-11-30", **case):
    case = {**BASE, **case}
    if variant.startswith("fp32"):  # its own dot precision, and the single-dot tril(A) it fixes
        point = {**point, "A_PAIR": False, "DOT_PRECISION": {"ieee": "tf32"}.get(point["DOT_PRECISION"],
                                                                            point["DOT_PRECISION"])}
    return records.WinnerRecord(
        op=OP, chip="h200", toolchain=TOOLS, kernel_hash=f"sha256:{variant}", key=_key(spec, case),
        case=case, variant=variant, point=dict(point), study=f"{OP}/{variant}", date=date,
        median_ms=median, remeasured_ms={f"{variant}:a": median, f"{variant}:b": median * 1.1},
        margin=0.1, error={"rel_l2": 1e-3, "ref_rel_l2": 2e-3},
        budget=records.Budget("smem_bytes", 57344, None))


def _trial(n=0, study="s", status="ok", reason="", op=OP, chip="h200"):
    return records.TrialRecord(
        op=op, chip=chip, toolchain=TOOLS, kernel_hash="sha256:k", key=("bfloat16", 64, False, False, 2, 2, 1, 1),
        case=dict(BASE), variant="post_general_tiled", point=dict(POINT), study=study, date="2026-11-30",
        trial=n, status=status, reason=reason, median_ms=0.5 if status == "ok" else None,
        times_ms=(0.5, 0.51, 0.49) if status == "ok" else (), error={"rel_l2": 1e-3, "ref_rel_l2": None},
        budget=records.Budget("smem_bytes", 57344, 57000))


def _check(won, fill_variant, fill_point, own_ms=0.1, fill_ms=0.13, margin=0.1):
    return records.CheckRecord(
        op=OP, chip="h200", toolchain=TOOLS, kernel_hash=won.kernel_hash, key=won.key, case=won.case,
        variant=won.variant, point=won.point, study=won.study, date=won.date, fill_variant=fill_variant,
        fill_point=dict(fill_point), fill_kernel_hash=f"sha256:{fill_variant}", fill_from="from (x,)",
        own_ms=own_ms, fill_ms=fill_ms, margin=margin)


def _path(tmp_path):
    return records.record_path(tmp_path, "h200", OP)


def test_record_path():
    assert records.record_path(Path("/r"), "h200", OP) == Path(f"/r/records/h200/{OP}.jsonl")


def test_round_trip_and_line_format(gla):
    for rec in (_trial(), _trial(3, status="timeout", reason="over 30 s"), _winner(gla),
                _check(_winner(gla), "fold_general_tiled", POINT),
                _check(_winner(gla), "fold_general_tiled", POINT, fill_ms=None)):
        line = rec.line()
        assert line == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":"))
        data = json.loads(line)
        assert data["schema"] == records.SCHEMA and data["kind"] == type(rec).KIND
        assert type(rec).from_json(data) == rec
    assert json.loads(_winner(gla).line())["key"] == ["bfloat16", 64, False, False, 3, 3, 1, 1]


def test_compiler_registers_and_spills_are_stored_beside_the_estimate():
    rec = _trial()
    data = {**rec.to_json(), "budget": {"kind": "smem_bytes", "estimate": 57344, "reported": 57000,
                                        "regs": 168, "spills": 12}}
    got = records.TrialRecord.from_json(data)
    assert (got.budget.regs, got.budget.spills) == (168, 12)
    assert json.loads(got.line())["budget"] == data["budget"]
    assert "regs" not in json.loads(rec.line())["budget"]  # unknown figures are left out, not zeroed


def test_a_trials_budget_carries_what_the_compiler_reported(gla):
    from opgen.tune.tune import Campaign
    from opgen.run.worker import Result

    campaign = Campaign.__new__(Campaign)
    campaign.spec, campaign.profile = gla, CHIP
    params = space.evaluate_params(gla, space.case_inputs(gla, BASE))
    variant = space.find_variant(gla, "post_general_tiled")
    point = space.Point(variant.name, tuple(POINT.items()))
    estimate = space.budget_bytes(gla, variant, POINT, params, CHIP)[1]
    got = campaign._budget(variant, point, params, Result("ok", reported={"shared": 49152, "n_regs": 128,
                                                                          "n_spills": 6}))
    assert got == {"kind": "smem_bytes", "estimate": estimate, "reported": 49152, "regs": 128, "spills": 6}
    assert campaign._budget(variant, point, params, Result("crash", "x")) == {
        "kind": "smem_bytes", "estimate": estimate, "reported": None}


@pytest.mark.parametrize("change, match", [
    ({"status": "ok", "reason": "why"}, "reason"),
    ({"status": "crash", "reason": ""}, "reason"),
    ({"status": "melted"}, "status"),
    ({"trial": True}, "trial: expected an integer"),
    ({"median_ms": float("nan")}, "median_ms: expected a finite number"),
    ({"date": "30/11/2026"}, "date"),
    ({"budget": {"kind": "ub_bytes", "estimate": 1}}, "budget"),
    ({"budget": {"kind": "smem_bytes", "estimate": 1, "reported": 1, "spill": 0}}, "budget"),
    ({"budget": {"kind": "smem_bytes", "estimate": 1, "reported": 1, "spills": 0.5}}, "expected an integer"),
    ({"key": "bfloat16"}, "key: expected a list"),
])
def test_invalid_fields_are_refused(change, match):
    data = {**_trial().to_json(), **change}
    with pytest.raises(RecordError, match=f"f.jsonl:7: .*{match}"):
        records.TrialRecord.from_json(data, "f.jsonl:7")


def test_missing_or_unknown_keys_are_refused(gla):
    data = _winner(gla).to_json()
    del data["margin"]
    with pytest.raises(RecordError, match=r"missing keys \['margin'\]"):
        records.WinnerRecord.from_json(data)
    with pytest.raises(RecordError, match=r"unknown keys \['extra'\]"):
        records.WinnerRecord.from_json({**_winner(gla).to_json(), "extra": 1})


def test_append_then_read(tmp_path, gla):
    path = _path(tmp_path)
    assert records.read(path, op=OP, chip="h200") == records.RecordFile(path, (), 0)
    written = [_trial(0), _trial(1, status="compile_error", reason="ub overflow"), _winner(gla)]
    assert records.append(path, written[:2]) == 0
    assert records.append(path, written[2:]) == 0
    got = records.read(path, op=OP, chip="h200")
    assert got.records == tuple(written) and got.torn == 0
    assert path.read_text().count("\n") == 3


def test_append_missing_adds_in_order_only_what_the_file_lacks(tmp_path):
    """What exporting a shared campaign's records does: any number of times, from any prefix."""
    path = _path(tmp_path)
    stored = [_trial(n) for n in range(4)]
    records.append(path, stored[:1])
    with open(path, "ab") as f:  # a torn line left by a writer that died
        f.write(_trial(9).line().encode()[:40])
    assert records.append_missing(path, stored[:2]) == 1
    assert records.append_missing(path, stored) == 2
    assert records.append_missing(path, stored) == 0
    got = records.read(path, op=OP, chip="h200")
    assert got.records == tuple(stored) and got.torn == 0
    with pytest.raises(RecordError, match="cannot append"):
        records.append_missing(path, [_trial(0, chip="h100")])


def test_torn_last_line_is_skipped_counted_and_cut(tmp_path):
    path = _path(tmp_path)
    records.append(path, [_trial(0), _trial(1)])
    with open(path, "ab") as f:
        f.write(_trial(2).line().encode()[:40])
    got = records.read(path, op=OP, chip="h200")
    assert [r.trial for r in got.records] == [0, 1] and got.torn == 1
    assert records.append(path, [_trial(3)]) == 1
    got = records.read(path, op=OP, chip="h200")
    assert [r.trial for r in got.records] == [0, 1, 3] and got.torn == 0


def test_complete_last_line_without_newline_is_kept(tmp_path):
    path = _path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(_trial(0).line())
    assert [r.trial for r in records.read(path, op=OP, chip="h200").records] == [0]
    assert records.append(path, [_trial(1)]) == 0
    assert [r.trial for r in records.read(path, op=OP, chip="h200").records] == [0, 1]


def test_bad_middle_line_names_the_line(tmp_path):
    path = _path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(_trial(0).line() + "\n{not json\n" + _trial(2).line() + "\n")
    with pytest.raises(RecordError, match=rf"{OP}\.jsonl:2: not a JSON line"):
        records.read(path, op=OP, chip="h200")
    bad = {**_trial(1).to_json(), "status": "melted"}
    path.write_text(_trial(0).line() + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r"jsonl:2: trial record: status"):
        records.read(path, op=OP, chip="h200")


def test_foreign_records_are_refused(tmp_path):
    path = _path(tmp_path)
    records.append(path, [_trial(0)])
    with pytest.raises(RecordError, match="jsonl:1: foreign record"):
        records.read(path, op="other_op", chip="h200")
    with pytest.raises(RecordError, match="foreign record"):
        records.read(path, op=OP, chip="ascend910b3")
    path.write_text(json.dumps({**_trial(0).to_json(), "schema": 2}) + "\n")
    with pytest.raises(RecordError, match="jsonl:1: foreign record.*'schema': 2"):
        records.read(path, op=OP, chip="h200")
    with pytest.raises(RecordError, match="cannot append"):
        records.append(path, [_trial(0, chip="h100")])


def test_key_of_buckets_like_the_generated_code(gla):
    assert _key(gla, BASE) == ("bfloat16", 64, False, False, 3, 3, 1, 1)
    assert [keys.bucket_index(k, (32, 64, 128, 256)) for k in (1, 32, 33, 256, 257)] == [0, 0, 1, 3, 4]
    assert _key(gla, {**BASE, "H": 1, "K": 48, "V": 512, "chunk_size": 32})[1:] == (32, False, True, 1, 6, 1, 0)  # 4*1*64 tasks
    assert _key(gla, {**BASE, "V": 100})[6] == 0 and _key(gla, {**BASE, "K": 36})[6] == 0  # not multiples of 8
    assert _key(gla, {**BASE, "scale": 2.0})[2] is True


def test_latest_winner_wins(gla):
    first, second = _winner(gla), _winner(gla, "fp32_general_tiled")
    other = _winner(gla, dtype="float16")
    assert records.latest_winners([first, _trial(), second, other]) == {first.key: second, other.key: other}
    assert records.latest_winners([second, first])[first.key] is first


def _write(path, recs):
    if path.exists():
        path.unlink()
    records.append(path, recs)


def test_frozen_rows_sorted_deterministic_and_commented(tmp_path, gla, hashes):
    path = _path(tmp_path)
    recs = [_winner(gla, dtype="float16"), _winner(gla, K=64, V=64), _winner(gla, H=1, T=8192),
            _winner(gla, scale=2.0), _winner(gla)]
    _write(path, recs)
    table = tables.frozen_rows(gla, CHIP, path, hashes, fill=False)
    assert tables.frozen_rows(gla, CHIP, path, hashes, fill=False) == table
    _write(path, recs[::-1])
    assert tables.frozen_rows(gla, CHIP, path, hashes, fill=False) == table
    found = [row.key for row in table.rows]
    assert found == sorted(found, key=keys.sort_key) and len(found) == 5 and table.stale == ()
    row = next(r for r in table.rows if r.key == _key(gla, BASE))
    assert row[:3] == (_key(gla, BASE), "post_general_tiled", POINT) and row.source is None
    assert row.comment == "median 0.1234 ms, smem_bytes 57344, tuned 2026-11-30"
    assert list(row.point) == list(gla.tunables_for("cuda"))
    # The latest line decides between two winners of one key that met, whatever the other lines' order.
    _write(path, recs + [_faced(_winner(gla, "fp32_general_tiled", median=0.1), recs[-1])])
    assert next(r for r in tables.frozen_rows(gla, CHIP, path, hashes, fill=False).rows
                if r.key == row.key).variant == "fp32_general_tiled"


def _faced(rec, *others):
    """``rec`` with ``others`` among its side-by-side re-measures."""
    names = {f"{o.variant}:" + ",".join(f"{k}={v}" for k, v in o.point.items()): o.median_ms for o in others}
    return dataclasses.replace(rec, remeasured_ms={**rec.remeasured_ms, **names})


def test_a_later_winner_replaces_the_held_one_only_if_it_faced_it(tmp_path, gla, hashes):
    """A campaign that never measured the frozen winner (cut short, or without its journal) does
    not replace it; one that measured it (a trial of that point on the key since it won, or a
    side-by-side re-measure) or one after a kernel change does."""
    path = _path(tmp_path)
    held = _winner(gla, median=0.1)
    later = _winner(gla, "fp32_general_tiled", point={**POINT, "DOT_PRECISION": "tf32x3"}, median=0.2)

    def frozen(*recs, kernel=hashes):
        _write(path, list(recs))
        return next(r.variant for r in tables.frozen_rows(gla, CHIP, path, kernel, fill=False).rows
                    if r.key == held.key)

    assert frozen(held, later) == "post_general_tiled"
    assert frozen(held, _faced(later, held)) == "fp32_general_tiled"
    met = dataclasses.replace(_trial(5, status="timeout", reason="no result after 9 s"), key=held.key)
    assert frozen(held, met, later) == "fp32_general_tiled"  # measured (and failed) since it won
    assert frozen(met, held, later) == "post_general_tiled"  # that trial came before it won
    other_point = dataclasses.replace(met, point={**POINT, "BV": 128})
    assert frozen(held, other_point, later) == "post_general_tiled"
    assert frozen(held, later, kernel={**hashes, "post_general_tiled": "sha256:new"}) == "fp32_general_tiled"
    unreadable = dataclasses.replace(held, case={**held.case, "dtype": "int8"})  # a case the spec rejects now
    assert frozen(unreadable, later) == "fp32_general_tiled"


def test_a_borrowing_chip_reads_its_lenders_records_then_its_own(tmp_path, gla, hashes):
    """The H100 inherits the H200's records: a bucket it measured nothing of keeps the H200's
    choice, one it tuned itself takes its own winner (read after the parent chip's), and a record of
    another chip inside its own file is still refused."""
    h100 = profile("h100")
    own = records.record_path(tmp_path, "h100", OP)
    parent = _winner(gla)
    other = _winner(gla, "fp32_general_tiled", dtype="float16")
    assert records.read_paths(own, h100) == ((own, "h100"),)  # no parent chip's file: its own alone
    _write(_path(tmp_path), [parent, other])
    assert records.read_paths(own, h100) == ((_path(tmp_path), "h200"), (own, "h100"))
    assert records.read_paths(_path(tmp_path), CHIP) == ((_path(tmp_path), "h200"),)  # h200 inherits from none
    elsewhere = tmp_path / "copy" / f"{OP}.jsonl"  # a file outside records/h100/: read alone
    assert records.read_paths(elsewhere, h100) == ((elsewhere, "h100"),)
    inherited = tables.frozen_rows(gla, h100, own, hashes, fill=False)
    assert inherited.rows == tables.frozen_rows(gla, CHIP, _path(tmp_path), hashes, fill=False).rows
    mine = dataclasses.replace(_faced(_winner(gla, "fp32_general_tiled", median=0.2), parent), chip="h100")
    _write(own, [mine])
    chosen = {r.key: (r.variant, r.winner.chip) for r in tables.frozen_rows(gla, h100, own, hashes, fill=False).rows}
    assert chosen == {parent.key: ("fp32_general_tiled", "h100"), other.key: ("fp32_general_tiled", "h200")}
    with own.open("a") as f:  # append() refuses it: written as a hand edit would
        f.write(other.line() + "\n")
    with pytest.raises(RecordError, match="chip 'h100'"):
        tables.frozen_rows(gla, h100, own, hashes, fill=False)


def test_no_record_file_means_no_rows(tmp_path, gla, hashes):
    assert tables.frozen_rows(gla, CHIP, _path(tmp_path), hashes) == table_rows.FrozenTable(
        (), (), 0, 0, table_rows.CrossChecked((), 0))


def test_stale_kernel_hash_is_excluded_and_reported(tmp_path, gla, hashes):
    path = _path(tmp_path)
    fresh, old = _winner(gla), _winner(gla, "fp32_general_tiled", dtype="float16")
    _write(path, [fresh, old])
    changed = {**hashes, "fp32_general_tiled": "sha256:new"}
    table = tables.frozen_rows(gla, CHIP, path, changed, fill=False)
    assert [r.key for r in table.rows] == [fresh.key]
    assert [s.record for s in table.stale] == [old] and "kernel changed" in table.stale[0].reason
    assert tables.stale(gla, CHIP, path, changed) == list(table.stale)
    assert tables.stale(gla, CHIP, path, hashes) == []
    # A winner whose variant has no kernel for the chip's rendering is stale too.
    del changed["fp32_general_tiled"]
    assert "no cuda kernel" in tables.stale(gla, CHIP, path, changed)[0].reason


def test_illegal_winner_is_an_error(tmp_path, gla, hashes):
    path = _path(tmp_path)
    _write(path, [_winner(gla, "split_general_tiled")])  # split needs float16
    with pytest.raises(RecordError, match="winner split_general_tiled .* not legal"):
        tables.frozen_rows(gla, CHIP, path, hashes)


def _filled(table):
    return {r.key: r for r in table.rows if r.source is not None}


def test_fill_picks_the_nearest_bucket_within_categorical_fields(tmp_path, gla, hashes):
    path = _path(tmp_path)
    small = _winner(gla)  # K, V buckets 3, 3
    large = _winner(gla, "fp32_general_tiled", point={**POINT, "DOT_PRECISION": "tf32x3"}, K=512, B=1)  # K 5
    half = _winner(gla, "post_h1_tiled", dtype="float16", H=1, T=8192)
    _write(path, [small, large, half])
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    filled = _filled(table)
    # two groups of 6 K x 7 V x 2 align x 4 tasks buckets, and the other dtype's bucket of each winner
    assert table.filled == len(filled) == 2 * 336 - 3 + 3
    assert [r.key for r in table.rows] == sorted((r.key for r in table.rows), key=keys.sort_key)

    def at(base, **idx):
        pos = {"K": 4, "V": 5, "align": 6, "tasks": 7}
        key = list(base.key)
        for name, value in idx.items():
            key[pos[name]] = value
        return filled[tuple(key)]

    assert at(small, K=4).comment.startswith(f"from {large.key!r}, median 0.1234 ms")  # tie: larger bucket
    assert at(small, K=4, V=5).variant == "fp32_general_tiled"  # tie again
    assert at(small, K=2).variant == "post_general_tiled"  # 1 from small, 3 from large
    assert at(small, K=5, V=0).variant == "fp32_general_tiled"  # 3 from large, 5 from small
    assert at(small, K=0, tasks=3).variant == "post_general_tiled"  # tasks moves through B, T
    assert at(small, align=0).source == small.key  # K or V off a multiple of 8: the aligned row next to it
    # Other categorical fields never cross; dtype (the spec's fill_across) crosses into a winner's own
    # buckets alone: a float16 bucket takes a bfloat16 row only where their K, V, align and tasks agree.
    def flipped(rec):
        return ({"float16": "bfloat16", "bfloat16": "float16"}[rec.key[0]],) + rec.key[1:]

    crossed = {k: r for k, r in filled.items() if r.source[0] != k[0]}
    assert {k: r.source for k, r in crossed.items()} == {flipped(w): w.key for w in (small, large, half)}
    assert filled[flipped(small)].variant == small.variant
    assert {r.variant for k, r in filled.items() if k[0] == "float16" and k not in crossed} == {"post_h1_tiled"}
    assert {r.variant for k, r in filled.items() if k[0] == "bfloat16" and k not in crossed} == {
        "post_general_tiled", "fp32_general_tiled"}
    assert tables.frozen_rows(gla, CHIP, path, hashes) == table


def test_the_other_dtypes_row_of_the_same_buckets_comes_before_a_row_one_step_away(tmp_path, gla, hashes):
    path = _path(tmp_path)
    here = _winner(gla, "fp32_general_tiled", point={**POINT, "DOT_PRECISION": "tf32x3"})  # bfloat16
    step = _winner(gla, dtype="float16", K=256)  # float16, one K bucket up
    _write(path, [here, step])
    filled = _filled(tables.frozen_rows(gla, CHIP, path, hashes))
    target = ("float16",) + here.key[1:]
    assert filled[target].source == here.key and filled[target].variant == "fp32_general_tiled"
    # a bucket step below the bfloat16 row and two below the float16 one: the float16 row
    below = target[:4] + (target[4] - 1,) + target[5:]
    assert filled[below].source == step.key
    assert all(r.source[0] == k[0] for k, r in filled.items() if k != target and k[0] == "float16")
    # without the field in fill_across the float16 bucket takes its own dtype's row
    spec = gla.model_copy(update={"dispatch": gla.dispatch.model_copy(update={"fill_across": ()})})
    assert _filled(tables.frozen_rows(spec, CHIP, path, hashes))[target].source == step.key


def test_fill_reaches_no_farther_than_the_specs_fill_distance(tmp_path, gla, hashes):
    from opgen.spec.keys import split_key_field

    path = _path(tmp_path)
    small = _winner(gla)
    _write(path, [small])
    bucketed = [i for i, f in enumerate(gla.dispatch.key.values()) if split_key_field(f)[1]]

    def within(distance):
        spec = gla.model_copy(update={"dispatch": gla.dispatch.model_copy(update={"fill_distance": distance})})
        return tables.frozen_rows(spec, CHIP, path, hashes)

    assert gla.dispatch.fill_distance is None and tables.frozen_rows(gla, CHIP, path, hashes).filled > 30
    near = _filled(within(1))
    assert near and all(sum(abs(k[i] - small.key[i]) for i in bucketed) == 1 for k in near)
    assert len(near) < len(_filled(within(2))) < tables.frozen_rows(gla, CHIP, path, hashes).filled
    none = within(0)
    assert none.filled == 0 and [r.key for r in none.rows] == [small.key]


def test_fill_skips_illegal_variants(tmp_path, gla, hashes):
    path = _path(tmp_path)
    single_point = {**POINT, "BK": 64, "BV": 64}
    single = _winner(gla, "post_single_tiled", point=single_point, B=2, T=8192, H=8, K=64, V=64)
    _write(path, [single])
    filled = _filled(tables.frozen_rows(gla, CHIP, path, hashes))
    # single needs K <= 64 and V <= 64, and fixes its one tile to pow2(K) x pow2(V): its 64 x 64
    # point stands only for K and V in (32, 64], across the task buckets, aligned to 8 or not
    assert filled and all(k[4] == 1 and k[5] == 1 for k in filled)
    assert len(filled) == 2 * 4 - 1
    # With a general winner farther up, a key past single's reach takes the next legal neighbour.
    general = _winner(gla, B=2, T=8192, H=8, K=256, V=64)  # K bucket 4, V bucket 1
    _write(path, [single, general])
    filled = _filled(tables.frozen_rows(gla, CHIP, path, hashes))
    for v_bucket in (0, 2):  # V <= 32 (single's tile would be 32 wide) and V > 64: single is nearer
        assert filled[single.key[:5] + (v_bucket,) + single.key[6:]].variant == "post_general_tiled"
    other_tasks = single.key[:7] + ((single.key[7] + 1) % 4,)
    assert filled[other_tasks].variant == "post_single_tiled"


def _append_many(path, study):
    for n in range(50):
        records.append(path, [_trial(n, study=study, status="crash", reason="x" * 3000)])


def test_concurrent_appends_keep_every_line_intact(tmp_path):
    path = _path(tmp_path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, f"w{i}")) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = records.read(path, op=OP, chip="h200")
    assert got.torn == 0 and len(got.records) == 100
    assert sorted((r.study, r.trial) for r in got.records) == sorted((f"w{i}", n) for i in range(2) for n in range(50))


def test_kernel_hash_ignores_the_generated_header():
    body = '"""Kernel."""\nimport triton\n'
    one = "# Generated by `opgen build`.\n# spec  specs/x.yaml  sha256:1\n" + body
    two = "# Generated by `opgen build`.\n# spec  specs/x.yaml  sha256:2\n" + body
    assert records.kernel_hash(one) == records.kernel_hash(two) != records.kernel_hash(one + "x = 1\n")


def test_the_cross_check_line_names_every_row_over_its_margin(gla):
    """The table's docstring names each tuned row whose leave-one-out fill loses more than the
    margin, worst first, with its loss; one row over it is the worst alone."""
    a, b, c = _winner(gla), _winner(gla, K=64, V=64), _winner(gla, K=32, V=32)
    checks = (_check(a, a.variant, a.point, fill_ms=0.13), _check(b, b.variant, b.point, fill_ms=0.15),
              _check(c, c.variant, c.point, fill_ms=0.105))
    line = table_rows.CrossChecked(checks, 3).line()
    assert line.endswith(f"FLAGGED. Over the margin (2 rows): {b.key!r} 50.0%, {a.key!r} 30.0%.")
    assert "Over the margin" not in table_rows.CrossChecked(checks[::2], 3).line()


def test_a_cross_check_counts_only_while_its_winner_and_fill_are_current(gla, hashes):
    """The table states the checks of its own rows: a check of another winner, or against another
    fill than the table now gives, says nothing about it. A failed re-measure is an infinite loss."""
    a = _winner(gla)
    b = _winner(gla, point={**POINT, "BV": 128}, K=64, V=64)
    fresh = {a.key: a, b.key: b}
    fill = next(r for r in fill_nearest.fill_nearest(gla, CHIP, {b.key: b}) if r.key == a.key)
    assert fill.point["BV"] == 128
    check = _check(a, fill.variant, fill.point, own_ms=0.1, fill_ms=0.13)
    got = tables.cross_checked(gla, CHIP, [a, b, check], fresh, hashes)
    assert (got.current, got.tuned, got.worst) == ((check,), 2, check) and got.flagged
    assert all(s in got.line() for s in ("1 of 2 tuned rows checked", "worst loss 30.0%", "FLAGGED"))
    lenient = _check(a, fill.variant, fill.point, margin=0.5)
    assert not tables.cross_checked(gla, CHIP, [lenient], fresh, hashes).flagged
    other_fill = _check(a, fill.variant, {**fill.point, "num_warps": 8})
    other_winner = _check(_winner(gla, point={**POINT, "num_warps": 8}), fill.variant, fill.point)
    new_kernel = dataclasses.replace(_check(a, fill.variant, fill.point), fill_kernel_hash="sha256:old")
    for stale in (other_fill, other_winner, new_kernel):
        assert tables.cross_checked(gla, CHIP, [stale], fresh, hashes).checked == 0
    failed = _check(a, fill.variant, fill.point, fill_ms=None)
    assert failed.loss == float("inf") and tables.cross_checked(gla, CHIP, [failed], fresh, hashes).flagged



def test_earlier_winners_are_the_newest_distinct_three_keyed_by_their_case(gla):
    """Seeds of a bucket's studies: newest first, no repeats, at most three; the key comes from the
    case under the current edges, not from the key stored when it was tuned."""
    from opgen.tune.campaign import earlier_winners

    points = [{**POINT, "BV": bv} for bv in (32, 64, 128, 64, 32)]
    found = [_winner(gla, point=p) for p in points]
    moved = dataclasses.replace(_winner(gla, point={**POINT, "num_warps": 8}, K=96, V=96), key=(0,) * 7)
    got = earlier_winners(gla, [*found, moved, _trial()])
    assert [p.config["BV"] for p in got[found[0].key]] == [32, 64, 128]
    assert [p.config["num_warps"] for p in got[_key(gla, moved.case)]] == [8] and (0,) * 7 not in got
    assert [p.config["BV"] for p in earlier_winners(gla, found, keep=1)[found[0].key]] == [32]


def test_the_report_names_a_faster_earlier_winner_of_another_point(tmp_path, gla, hashes):
    from opgen.evidence.report import report

    path = _path(tmp_path)
    fast = _winner(gla, median=0.1, date="2026-11-29")
    other = {**POINT, "BV": 128}
    _write(path, [fast, _faced(_winner(gla, point=other, median=0.2), fast), _winner(gla, point=other, median=0.25)])
    text = report(gla, CHIP, path, hashes)
    assert "an earlier winner, post_general_tiled at 0.1000 ms in its run (2026-11-29); " \
           "the frozen one is 150% slower" in text
    # the same point measured slower in a later run is noise between runs, not a displaced winner
    _write(path, [fast, _winner(gla, median=0.2)])
    assert "earlier winner" not in report(gla, CHIP, path, hashes)
    # nor is an earlier winner within the margin
    _write(path, [fast, _faced(_winner(gla, point=other, median=0.104), fast)])
    assert "earlier winner" not in report(gla, CHIP, path, hashes)
    # nor one timed under the other flush (its times do not compare)
    _write(path, [fast, _faced(dataclasses.replace(_winner(gla, point=other, median=0.2), flush="write"), fast)])
    assert "earlier winner" not in report(gla, CHIP, path, hashes)
    # a later winner that never met the frozen one is named, not frozen
    _write(path, [fast, _winner(gla, point=other, median=0.2, date="2026-12-01")])
    text = report(gla, CHIP, path, hashes)
    assert "post_general_tiled            0.1000" in text and "earlier winner" not in text
    assert "a later winner, post_general_tiled at 0.2000 ms (2026-12-01), never met it: not frozen" in text


def test_the_report_names_a_point_that_beat_the_winner_in_a_cross_check(tmp_path, gla, hashes):
    from opgen.evidence.report import report

    path = _path(tmp_path)
    won = _winner(gla)
    _write(path, [won, _check(won, "fold_general_tiled", POINT, own_ms=0.12, fill_ms=0.1)])
    assert "fold_general_tiled (from (x,)) ran 20% faster here in a cross-check (2026-11-30)" in \
        report(gla, CHIP, path, hashes)
    _write(path, [won, _check(won, "fold_general_tiled", POINT, own_ms=0.102, fill_ms=0.1)])  # within 5%
    assert "faster here" not in report(gla, CHIP, path, hashes)
    stale = dataclasses.replace(_check(won, "fold_general_tiled", POINT, own_ms=0.12, fill_ms=0.1),
                                fill_kernel_hash="sha256:old")
    _write(path, [won, stale])  # the other point's kernel changed since
    assert "faster here" not in report(gla, CHIP, path, hashes)


def test_a_winner_tuned_under_other_edges_stands_for_the_bucket_its_case_falls_in_now(tmp_path, gla, hashes):
    """Moving a dispatch edge re-keys the records by their cases instead of making their winners
    stale: the table keeps every measured choice (and fills the new neighbours from it)."""
    path = _path(tmp_path)
    won = _winner(gla, K=96, V=96)
    _write(path, [dataclasses.replace(won, key=(0,) * 7)])  # the key it had under older edges
    table = tables.frozen_rows(gla, CHIP, path, hashes)
    assert table.stale == () and (0,) * 7 not in {r.key for r in table.rows}
    row = next(r for r in table.rows if r.key == _key(gla, won.case))
    assert row.variant == won.variant and not row.comment.startswith("from ")


def test_flush_is_kept_and_lines_from_before_it_read_as_a_writing_flush(tmp_path, gla, hashes):
    """Times of the two flushes do not compare: each record says which one it was taken under."""
    rec = _winner(gla)
    assert rec.flush == "read" and json.loads(rec.line())["flush"] == "read"
    old = json.loads(rec.line())
    del old["flush"]  # a line without the field
    assert records.WinnerRecord.from_json(old).flush == "write"
    with pytest.raises(RecordError, match=r"flush: expected one of \['read', 'write'\]"):
        records.WinnerRecord.from_json({**old, "flush": "none"})
    path = _path(tmp_path)
    _write(path, [dataclasses.replace(rec, flush="write")])
    row = tables.frozen_rows(gla, CHIP, path, hashes, fill=False).rows[0]
    assert row.comment.startswith("median 0.1234 ms (writing flush), ")


def test_a_tunable_the_variant_fixes_keeps_its_records_in_force(tmp_path):
    """mamba3_mimo_bwd_bwd's H100 records predate PAIR_PRODUCTS, which blocked fixes (False): read
    now, every point and re-measured name carries it and every winner stays fresh. Moved to
    blocked_pairs, which searches it, the same winner is stale: its point lacks a searched tunable."""
    from opgen.render.kernels import kernel_hashes
    from opgen.table.table_records import read_keyed, split_winners

    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_bwd.yaml", ROOT)
    chip = profile("h100")
    source = ROOT / "records" / "h100" / "mamba3_mimo_bwd_bwd.jsonl"
    assert all("PAIR_PRODUCTS" not in json.loads(line)["point"] for line in source.read_text().splitlines())
    found = read_keyed(spec, chip, source).records
    assert all(r.point["PAIR_PRODUCTS"] is False for r in found)
    winners = [r for r in found if isinstance(r, records.WinnerRecord)]
    assert winners and all(name.endswith(",PAIR_PRODUCTS=False") for w in winners for name in w.remeasured_ms)
    hashes = kernel_hashes(ROOT, spec, "cuda")
    fresh, stale = split_winners(spec, chip, source, found, hashes)[:2]
    assert len(fresh) == len(winners) and not stale

    moved = tmp_path / "h100" / "mamba3_mimo_bwd_bwd.jsonl"
    moved.parent.mkdir()
    lines = [json.loads(line) for line in source.read_text().splitlines()]
    for line in lines:
        if line["kind"] == "winner":
            line.update(variant="blocked_pairs", kernel_hash=hashes["blocked_pairs"])
    moved.write_text("".join(json.dumps(line) + "\n" for line in lines))
    fresh, stale = split_winners(spec, chip, moved, read_keyed(spec, chip, moved).records, hashes)[:2]
    assert not fresh and stale and all("are not the spec's" in s.reason for s in stale)
