"""The fill rule ranked on the measured buckets' evidence (``opgen.table.fill_rank``, the evidence from
``opgen.table.fill_evidence``), on small record sets built here: it takes the candidate the nearby
buckets' times favour over the nearest winner, never a tile wider than the target's dims (unless
narrowed), never a point timed in another dtype alone; and its leave-one-out figures
(``opgen.table.fill_score``) are the ones the synthetic times imply, worked out here apart."""
import math
import sys
from pathlib import Path

import pytest

from opgen.table import fill_rank as fr
from opgen.table import fill_score as fs
from opgen.spec import keys
from opgen.storage import records
from opgen.table import table as tables
from opgen.table import fill_nearest
from opgen.table.bucket_shapes import case_params, edge_params

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_records import BASE, CHIP, OP, POINT, TOOLS, _key, _path, _winner, _write, gla, hashes  # noqa: E402,F401

NARROW = {**POINT, "BV": 32}
WIDE = {**POINT, "BV": 128}


def _measure(spec, won, ms, run="2026-12-01/aaaa", **case):
    """``won``'s point timed on the bucket of ``BASE`` changed by ``case``."""
    case = {**BASE, **case}
    return records.MeasureRecord(
        op=OP, chip="h200", toolchain=TOOLS, kernel_hash=won.kernel_hash, key=_key(spec, case), case=case,
        variant=won.variant, point=dict(won.point), study=won.study, date="2026-12-01", ms=ms,
        source=f"winner of {won.key!r}", run=run)


def _trial(won, point, ms, n=0):
    """A search trial of ``point`` (``won``'s variant) on ``won``'s case."""
    return records.TrialRecord(
        op=OP, chip="h200", toolchain=TOOLS, kernel_hash=won.kernel_hash, key=won.key, case=dict(won.case),
        variant=won.variant, point=dict(point), study=won.study, date=won.date, trial=n, status="ok", reason="",
        median_ms=ms, times_ms=(ms,), error={"rel_l2": 1e-3, "ref_rel_l2": None},
        budget=records.Budget("smem_bytes", 57344, 57000))


def _evidence(spec, hashes, winners, recs):
    return fr.gather(spec, CHIP, recs, hashes, {w.key: w for w in winners})


def _weighted(evidence, target, tau=0.5, cross=0.25, plain=0.5):
    """The rule's score worked out apart: per bucket of ``evidence`` ({key: share}), its share's
    log weighed exp(-distance / tau), distance the bucket steps plus ``cross`` for another dtype
    and ``plain`` per other differing plain field (GLA's key: dtype, BT, big_scale, H1, then
    the bucketed K, V, align, tasks)."""
    num = den = 0.0
    for key, share in evidence.items():
        d = sum(abs(a - b) for a, b in zip(key[4:], target[4:]))
        d += (cross if key[0] != target[0] else 0) + plain * sum(a != b for a, b in zip(key[1:4], target[1:4]))
        w = math.exp(-d / tau)
        num, den = num + w * math.log(share), den + w
    return num / den


@pytest.mark.parametrize("near_faster", ["wide", "narrow"])
def test_the_rule_takes_what_the_nearby_buckets_favour_over_the_nearest_winner(gla, hashes, near_faster):
    wide = _winner(gla, point=POINT, V=64, T=256)  # three bucket steps from the target
    narrow = _winner(gla, point=NARROW, T=4096)  # one tasks bucket from it: the nearest fill's source
    fast, slow = (wide, narrow) if near_faster == "wide" else (narrow, wide)
    recs = [wide, narrow,
            _measure(gla, fast, 0.10, V=96), _measure(gla, slow, 0.13, V=96),  # one V bucket away
            _measure(gla, fast, 0.10, K=96), _measure(gla, slow, 0.12, K=96),  # one K bucket away
            _measure(gla, slow, 0.10, K=256, V=256, T=8192), _measure(gla, fast, 0.20, K=256, V=256, T=8192)]
    target = _key(gla, BASE)
    ev = _evidence(gla, hashes, [wide, narrow], recs)
    choice = fr.rank_fill(gla, CHIP, ev, target, BASE)
    assert choice.candidate.sources == (fast.key,) and choice.variant == fast.variant
    assert choice.point == {n: fast.point[n] for n in gla.tunables_for("cuda")}
    shares = {_key(gla, {**BASE, "V": 96}): 1.0, _key(gla, {**BASE, "K": 96}): 1.0,
              _key(gla, {**BASE, "K": 256, "V": 256, "T": 8192}): 2.0}
    assert {k: s for k, _, s in choice.evidence} == shares
    assert choice.predicted == pytest.approx(math.exp(_weighted(shares, target)))
    # the nearest fill takes the nearest winner whatever the measured buckets say
    params = case_params(gla, BASE, "test")
    assert fill_nearest.leave_one_out_fill(gla, CHIP, {w.key: w for w in (wide, narrow)}, target, params)[2] == \
        f"from {narrow.key!r}"


def test_no_tile_wider_than_the_target_dims_unless_narrowed(gla, hashes):
    wide = _winner(gla, point=WIDE, V=256)  # BV 128
    fits = _winner(gla, point=POINT, K=256)  # BV 64
    recs = [wide, fits,
            _measure(gla, wide, 0.10, V=96), _measure(gla, fits, 0.15, V=96),
            _measure(gla, wide, 0.10, K=96, V=64), _measure(gla, fits, 0.12, K=96, V=64)]
    ev = _evidence(gla, hashes, [wide, fits], recs)
    small = {**BASE, "V": 64}  # V <= 64: a 128-wide V tile is half empty on every call
    target = _key(gla, small)
    assert fr.rank_fill(gla, CHIP, ev, target, small).candidate.sources == (fits.key,)
    narrowed = fr.rank_fill(gla, CHIP, ev, target, small, fr.RankParams(clamp=True))
    assert narrowed.candidate.sources == (wide.key,) and narrowed.clamped and narrowed.point["BV"] == 64
    high = edge_params(gla, small, "test")
    for choice in (fr.rank_fill(gla, CHIP, ev, target, small), narrowed):
        assert all(c.evaluate({**high, **choice.point}) for c in gla.constraints)
    # at V in (64, 96] the same tile covers the bucket's largest call (pow2(96) = 128)
    mid = {**BASE, "V": 80}
    assert fr.rank_fill(gla, CHIP, ev, _key(gla, mid), mid).candidate.sources == (wide.key,)


def test_no_row_crosses_dtype_without_a_time_in_the_target_dtype(gla, hashes):
    half = _winner(gla, point=NARROW, dtype="float16")  # timed on float16 buckets alone
    both = _winner(gla, point=POINT, K=256, V=256, T=8192)
    recs = [half, both,
            _measure(gla, half, 0.10, dtype="float16"), _measure(gla, both, 0.12, dtype="float16"),
            _measure(gla, half, 0.10, dtype="float16", V=96), _measure(gla, both, 0.12, dtype="float16", V=96),
            _measure(gla, both, 0.10, K=256, V=256, T=256)]  # the only bfloat16 time, far away
    ev = _evidence(gla, hashes, [half, both], recs)
    target = _key(gla, BASE)
    assert fr.rank_fill(gla, CHIP, ev, target, BASE).candidate.sources == (both.key,)
    # what the guard keeps out: the other dtype's bucket of the same shape favours ``half``
    assert fr.rank_fill(gla, CHIP, ev, target, BASE, fr.RankParams(own=False)).candidate.sources == (half.key,)


def _loo_records(tmp_path, gla):
    """Records of two winners timed side by side on four measured buckets; the shares they imply
    per bucket and winner, worked out apart; the first winner."""
    a = _winner(gla, point=POINT, K=256, V=256, T=8192)
    b = _winner(gla, point=NARROW, V=32, T=256)
    times = {  # bucket (changes of BASE) -> run -> (a's ms, b's ms)
        (("V", 64),): {"r1": (0.10, 0.12)},
        (("V", 96),): {"r1": (0.10, 0.11), "r2": (0.105, 0.10)},
        (): {"r1": (0.13, 0.10)},
        (("K", 96), ("V", 64)): {"r1": (0.10, 0.125)},
    }
    recs = [a, b, _trial(a, a.point, 0.5), _trial(a, NARROW, 0.6, n=1)]
    shares = {}  # worked out apart: each run's time over its fastest, geometric mean over the runs
    for change, runs in times.items():
        logs = {"a": [], "b": []}
        for run, (ta, tb) in runs.items():
            recs += [_measure(gla, a, ta, run=f"2026-12-01/{run}", **dict(change)),
                     _measure(gla, b, tb, run=f"2026-12-01/{run}", **dict(change))]
            logs["a"].append(math.log(ta / min(ta, tb)))
            logs["b"].append(math.log(tb / min(ta, tb)))
        shares[_key(gla, {**BASE, **dict(change)})] = {n: math.exp(sum(v) / len(v)) for n, v in logs.items()}
    shares[a.key] = {"a": 1.0, "b": 0.6 / 0.5}  # the tuned bucket: its search's trials
    path = _path(tmp_path)
    _write(path, recs)
    return path, shares, a


def test_the_leave_one_out_figures_are_what_the_times_imply(tmp_path, gla, hashes):
    path, shares, a = _loo_records(tmp_path, gla)
    rows = fs.leave_one_out(gla, CHIP, path, hashes, rule="rank")
    expected = {}
    for target in shares:
        if target == a.key:  # its own winner is no candidate there: b, from the trials
            expected[target] = 0.5 / 0.6
            continue
        score = {n: _weighted({k: s[n] for k, s in shares.items() if k != target}, target) for n in "ab"}
        pick = min("ab", key=lambda n: (score[n], n != "b"))  # a tie: the pool's order (b's key first)
        expected[target] = 1 / shares[target][pick]
    assert {r.key: r.ratio for r in rows} == pytest.approx(expected)
    assert {r.key: r.kind for r in rows} == {k: "tuned" if k == a.key else "measured" for k in shares}
    ratios = [v for k, v in expected.items() if k != a.key]
    summary = fs.summarize(r for r in rows if r.kind == "measured")
    assert summary.geomean == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert (summary.least, summary.scored, summary.over, summary.unscored) == \
        (pytest.approx(min(ratios)), 4, sum(r < 1 / 1.1 for r in ratios), 0)
    assert 0 < summary.over < 4  # the times above make the rule lose a bucket and win others
    text = fs.loo_report(gla, {"rank": rows})
    assert f"rank     measured {summary.line()}" in text and str(a.key) in text
    nearest = fs.leave_one_out(gla, CHIP, path, hashes, rule="nearest")
    assert {r.key for r in nearest} == set(shares)


def test_a_bucket_nobody_measured_gets_a_case_of_its_own_and_a_row(gla, hashes):
    won = _winner(gla, point=POINT)
    recs = [won, _measure(gla, won, 0.1, V=96), _measure(gla, won, 0.1, dtype="float16", K=96)]
    ev = _evidence(gla, hashes, [won], recs)
    target = _key(gla, {**BASE, "dtype": "float16", "K": 64, "V": 64})
    case = fr.target_case(gla, ev, target)
    assert case["dtype"] == "float16" and keys.key_of(gla, case_params(gla, case, "test"))[:7] == target[:7]
    choice = fr.fill_ranked(gla, CHIP, ev, target)
    assert choice.candidate.sources == (won.key,) and choice.key == target
    # a plain field no bucket of the evidence has (H == 1): no case, no row
    assert fr.fill_ranked(gla, CHIP, ev, _key(gla, {**BASE, "H": 1})) is None


def test_evidence_reaches_no_farther_than_the_specs_fill_distance(gla, hashes):
    won = _winner(gla, point=POINT, K=256)
    recs = [won, _measure(gla, won, 0.1, V=96), _measure(gla, won, 0.1, K=64, V=64)]  # 1 and 4 steps away
    ev = _evidence(gla, hashes, [won], recs)
    target = _key(gla, BASE)
    for distance, found in ((None, 2), (1, 1), (0, 0)):
        spec = gla.model_copy(update={"dispatch": gla.dispatch.model_copy(update={"fill_distance": distance})})
        choice = fr.rank_fill(spec, CHIP, ev, target, BASE)
        assert (0 if choice is None else len(choice.evidence)) == found
    spec = gla.model_copy(update={"dispatch": gla.dispatch.model_copy(update={"fill_distance": 0})})
    assert len(fr.rank_fill(spec, CHIP, ev, target, BASE, fr.RankParams(reach=5)).evidence) == 2


def test_the_gate_flags_each_bucket_the_rule_loses_with_the_buckets_to_measure(tmp_path, gla, hashes):
    path, _, _ = _loo_records(tmp_path, gla)
    ranked = gla.model_copy(update={"dispatch": gla.dispatch.model_copy(update={"fill_rule": "ranked"})})
    rows = fs.leave_one_out(ranked, CHIP, path, hashes, rule="rank")
    lost = {r.key for r in rows if r.ratio is not None and r.ratio < 1 / 1.1}
    table = tables.frozen_rows(ranked, CHIP, path, hashes)
    filled = [r.key for r in table.rows if r.source is not None and r.measured is None]
    gate = fs.fill_gate(ranked, CHIP, path, hashes, filled)
    assert lost and {row.key for row, _ in gate.losses} == lost
    assert gate.worst.ratio == min(r.ratio for r in rows if r.key in lost)
    for row, around in gate.losses:  # the rule-filled buckets one step from it, same dtype and flags
        assert around and all(k in filled and k[:4] == row.key[:4]
                              and sum(abs(x - y) for x, y in zip(k[4:], row.key[4:])) == 1 for k in around)
    assert "FLAGGED: " in gate.line() and "Fill rule: ranked." in gate.line()
    report = fs.gate_report(ranked, gate, OP, "h200")
    assert sum(line.startswith("ERROR: ") for line in report) == len(lost)
    assert any(line.strip().startswith("measure the") for line in report)
    # a rule that loses nothing is no error
    kept = [r for r in rows if r.key not in lost]
    assert not fs.FillGate("ranked", {"measured": fs.summarize(kept)}, ()).line().count("FLAGGED")
