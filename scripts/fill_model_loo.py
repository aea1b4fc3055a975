"""Learned cost models as fill rules, scored by the leave-one-out of
``opgen.table.fill_score.leave_one_out`` beside the nearest and ranked rules.

Each measured and tuned bucket is filled from the others' records alone and its choice scored by
the fastest time there over the chosen point's (unscored where that point was not timed there).
Two models predict a candidate's log share (its time over the bucket's fastest) on the target:

- ``local``: per candidate, a ridge regression of its log shares on the other buckets against
  their standardized shape features (log2 of each bucketed key field's value on the bucket's
  case, each plain field as 0/1 or an indicator per value), each bucket weighed
  ``exp(-distance / tau)`` by the ranked rule's key distance, the slopes shrunk by ``lam``
  (``lam`` infinite: the ranked rule itself; ``tau`` infinite: one global linear model per
  candidate).
- ``point``: one ridge regression (``lam``) over every point timed on the other buckets, the
  point's features (variant indicator, log2 of each numeric tunable, an indicator per text value)
  crossed with the bucket's shape features; its prediction blended ``alpha`` to ``1 - alpha``
  with the ranked rule's.

Both choose among the candidates the ranked rule admits (``fill_rank._admit``: legal, within
budget, no tile wider than the dims; timed in the target's own plain fields), least prediction
first. Columns: ``nearest`` and ``ranked`` (the product's rules), ``ranked*`` (this script's ranked
rule, which must match), ``local`` and ``point`` at fixed parameters (:data:`FIXED`, set before
scoring), ``nested`` (per left-out bucket the rule of the grid an inner leave-one-out on the other
buckets alone picks), ``best`` (the best admitted candidate timed there: no rule does better).
Then the figures of every rule of the grid, fixed. Runs on the CPU (under a minute per op),
from the repository root:

    python scripts/fill_model_loo.py chunk_gla_fwd_o_gk h200 [--quiet]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opgen.render.kernels import kernel_hashes  # noqa: E402
from opgen.space.space import carried, parse_point_name, point_id  # noqa: E402
from opgen.spec.hardware import ChipProfile, profile  # noqa: E402
from opgen.spec.keys import Key, key_text, sort_key, split_key_field  # noqa: E402
from opgen.spec.spec import OpSpec, load_spec  # noqa: E402
from opgen.storage.records import record_path  # noqa: E402
from opgen.table.fill_evidence import Candidate, Evidence, candidates, measured_buckets, tuned_shares  # noqa: E402
from opgen.table.fill_rank import RankParams, _admit, distance  # noqa: E402
from opgen.table.fill_score import LOSS, _read, _score, leave_one_out, summarize_ratios  # noqa: E402

LOCAL = tuple(("local", tau, lam) for tau in (0.5, 1.0, 2.0, math.inf) for lam in (0.03, 0.1, 0.3, 1.0, math.inf))
FIXED = (("local", 1.0, 0.3), ("point", 100.0, 0.5))  # fixed before scoring, not picked on the figures
POINT = tuple(("point", lam, alpha) for lam in (10.0, 100.0, 1000.0) for alpha in (0.5, 1.0))


class Data(NamedTuple):
    """Everything the rules read, by bucket index ``b`` and candidate index ``c``."""

    keys: list[Key]
    kinds: list[str]
    x: np.ndarray  # (buckets, features): standardized shape features
    y: np.ndarray  # (candidates, buckets): log share, nan where not timed
    dist: np.ndarray  # (buckets, buckets): the ranked rule's distance, inf where none counts
    plain: np.ndarray  # (buckets, buckets): same plain key fields
    sources: list[set[int]]  # per candidate the buckets it won (a pending winner's: none here)
    variant: list[bool]  # per candidate: a winner's point (not the spec's default)
    admitted: list[list[int]]  # per target the candidates _admit lets stand for it, pool order
    ratio: list[dict[int, float | None]]  # per target and admitted candidate: fastest over its time
    default_ratio: list[float | None]  # per target: the spec's default's ratio (no row)
    ident: list[dict[int, str]]  # per target and admitted candidate: its point carried there
    timed: list[dict[str, float]]  # per bucket: each timed point's log share


def features(spec: OpSpec, params: dict[str, Any]) -> list[float]:
    """A bucket's shape: log2 of each bucketed key field's value on its case, each plain field's
    value (a bool as 0/1, a number as log2, a string as one indicator per value, added later)."""
    out: list[float] = []
    for field in spec.dispatch.key.values():
        expr, edges = split_key_field(field)
        value = expr.evaluate(params)
        if isinstance(value, str):
            continue
        out.append(float(value) if isinstance(value, bool) else math.log2(max(float(value), 1.0)))
    return out


def _shape_matrix(spec: OpSpec, keys: list[Key], params: list[dict[str, Any]]) -> np.ndarray:
    """The standardized features of each bucket, constant columns dropped."""
    strings = sorted({(i, v) for k in keys for i, v in enumerate(k) if isinstance(v, str)})
    rows = [features(spec, p) + [float(k[i] == v) for i, v in strings[1:]] for k, p in zip(keys, params)]
    x = np.asarray(rows, dtype=float)
    sd = x.std(axis=0)
    keep = sd > 1e-9
    return (x[:, keep] - x[:, keep].mean(axis=0)) / sd[keep]


def load(op: str, chip_name: str) -> tuple[OpSpec, ChipProfile, Data]:
    """The op's evidence on the chip, as the leave-one-out gathers it, in index form."""
    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    chip = profile(chip_name)
    hashes = kernel_hashes(ROOT, spec, chip.rendering)
    got = _read(spec, chip, record_path(ROOT, chip.name, spec.op), hashes)
    buckets = {**measured_buckets(spec, chip, got.records, got.hashes, skip=got.tuned),
               **tuned_shares(spec, chip, got.records, got.hashes, got.tuned)}
    keys = sorted(buckets, key=sort_key)
    index = {k: i for i, k in enumerate(keys)}
    pool = candidates(spec, chip, {**got.pending, **got.tuned})
    evidence = Evidence(pool, {k: buckets[k] for k in keys})
    y = np.full((len(pool), len(keys)), np.nan)
    for c, cand in enumerate(pool):
        for k, log in evidence.logs_of(spec, chip, cand):
            y[c, index[k]] = log
    n = len(keys)
    dist = np.full((n, n), np.inf)
    for a in range(n):
        for b in range(n):
            d = distance(spec, keys[a], keys[b])
            if d is not None:
                dist[a, b] = d
    strict = RankParams(plain_cost=None, cross_cost=None)
    plain = np.array([[distance(spec, keys[a], keys[b], strict) is not None for b in range(n)] for a in range(n)])
    admitted, ratio, default_ratio, idents = _admissions(spec, chip, pool, [buckets[k] for k in keys])
    data = Data(keys, [buckets[k].kind for k in keys], _shape_matrix(spec, keys, [buckets[k].params for k in keys]),
                y, dist, plain, [{index[s] for s in cand.sources if s in index} for cand in pool],
                [bool(cand.variant) for cand in pool], admitted, ratio, default_ratio, idents,
                [{p: math.log(v) for p, v in buckets[k].shares.items()} for k in keys])
    return spec, chip, data


def _admissions(spec: OpSpec, chip: ChipProfile, pool: Sequence[Candidate], buckets: list[Any]) -> tuple[
        list[list[int]], list[dict[int, float | None]], list[float | None], list[dict[int, str]]]:
    """Per target the admitted candidates, their scored ratios, the default's, and the
    candidates' points carried to the target's case."""
    admitted, ratio, default_ratio, idents = [], [], [], []
    for bucket in buckets:
        here, scored, named = [], {}, {}
        for c, cand in enumerate(pool):
            got = _admit(spec, chip, cand, bucket.case, False)
            if got is not None:
                here.append(c)
                scored[c] = _score(spec, chip, bucket, got[0], got[1])[0]
                moved = carried(spec, got[0], got[1], bucket.params)
                named[c] = point_id(got[0], got[2] if moved is None else moved)
        admitted.append(here)
        ratio.append(scored)
        idents.append(named)
        found = Candidate("", {}, ()).at(spec, chip, bucket.params)
        default_ratio.append(None if found is None else _score(spec, chip, bucket, *found)[0])
    return admitted, ratio, default_ratio, idents


def predict(data: Data, t: int, out: Sequence[int], tau: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate the predicted log share on target ``t`` from every bucket but ``out``, and
    the evidence mask (the rule's weights over buckets with a time of the candidate)."""
    w = np.exp(-data.dist[t] / tau) if math.isfinite(tau) else np.isfinite(data.dist[t]).astype(float)
    w[list(out)] = 0.0
    timed = ~np.isnan(data.y)
    mask = timed & (w > 0)
    wc = np.where(mask, w, 0.0)
    mass = wc.sum(axis=1)
    y = np.where(mask, data.y, 0.0)
    mean = (wc * y).sum(axis=1) / np.where(mass > 0, mass, 1.0)
    if not math.isfinite(lam) or data.x.shape[1] == 0:
        return mean, mask
    wn = wc / np.where(mass > 0, mass, 1.0)[:, None]
    z = data.x - data.x[t]
    f = z.shape[1]
    design = np.concatenate([np.ones((len(z), 1)), z], axis=1)
    a = np.einsum("cb,bi,bj->cij", wn, design, design)
    a[:, 1:, 1:] += lam * np.eye(f)
    a[:, 0, 0] += 1e-9
    rhs = np.einsum("cb,bi,cb->ci", wn, design, y)
    theta = np.linalg.solve(a, rhs[:, :, None])[:, :, 0]
    return np.where(mass > 0, theta[:, 0], mean), mask


class Points(NamedTuple):
    """The point model's design: per bucket the Gram matrix and right side of its timed points'
    rows (the point's features crossed with the bucket's shape), and per target each admitted
    candidate's row there."""

    gram: np.ndarray  # (buckets, F, F)
    rhs: np.ndarray  # (buckets, F)
    rows: list[dict[int, np.ndarray]]
    fits: dict[tuple[tuple[int, ...], float], np.ndarray]  # (buckets left out, lam) -> coefficients


def _point_vocab(idents: set[str]) -> list[tuple[str, str | None]]:
    """The point features: a variant indicator each, a numeric tunable's log2, a text one's
    indicator per value."""
    parsed = [parse_point_name(i) for i in idents]
    values: dict[str, set[str]] = {}
    for _, point in parsed:
        for name, value in point.items():
            values.setdefault(name, set()).add(value)
    vocab: list[tuple[str, str | None]] = [("variant", v) for v in sorted({v for v, _ in parsed})]
    for name, seen in sorted(values.items()):
        numeric = all(v.replace(".", "", 1).isdigit() for v in seen)
        vocab += [(name, None)] if numeric else [(name, v) for v in sorted(seen)]
    return vocab


def _point_vector(vocab: list[tuple[str, str | None]], ident: str) -> np.ndarray:
    variant, point = parse_point_name(ident)
    out = []
    for name, value in vocab:
        got = variant if name == "variant" else point.get(name)
        out.append(math.log2(max(float(got), 1.0)) if value is None and got is not None
                   else float(got == value))
    return np.asarray(out)


def points(data: Data) -> Points:
    """The point model's design over every point the records timed (:class:`Points`)."""
    names = {p for timed in data.timed for p in timed} | {p for named in data.ident for p in named.values()}
    vocab = _point_vocab(names)
    vec = {p: _point_vector(vocab, p) for p in names}
    mat = np.asarray(list(vec.values()))
    mean, sd = mat.mean(axis=0), np.where(mat.std(axis=0) > 1e-9, mat.std(axis=0), 1.0)
    shape = np.concatenate([np.ones((len(data.keys), 1)), data.x], axis=1)

    def row(b: int, p: str) -> np.ndarray:
        return np.kron(shape[b], np.concatenate([[1.0], (vec[p] - mean) / sd]))

    size = shape.shape[1] * (len(vocab) + 1)
    gram, rhs = np.zeros((len(data.keys), size, size)), np.zeros((len(data.keys), size))
    for b, timed in enumerate(data.timed):
        if timed:
            phi = np.asarray([row(b, p) for p in timed])
            gram[b], rhs[b] = phi.T @ phi, phi.T @ np.asarray(list(timed.values()))
    rows = [{c: row(t, p) for c, p in named.items()} for t, named in enumerate(data.ident)]
    return Points(gram, rhs, rows, {})


def point_predict(data: Data, pts: Points, t: int, out: Sequence[int], lam: float) -> np.ndarray:
    """Per candidate the point model's log share on target ``t``, fitted without ``out`` (nan
    where not admitted)."""
    memo = (tuple(sorted(set(out))), lam)
    if memo not in pts.fits:
        if not pts.fits:
            pts.fits[(), 0.0] = np.concatenate([pts.gram.sum(axis=0), pts.rhs.sum(axis=0)[:, None]], axis=1)
        total = pts.fits[(), 0.0] - sum(np.concatenate([pts.gram[b], pts.rhs[b][:, None]], axis=1) for b in memo[0])
        pts.fits[memo] = np.linalg.solve(total[:, :-1] + lam * np.eye(len(total)), total[:, -1])
    theta = pts.fits[memo]
    pred = np.full(data.y.shape[0], np.nan)
    for c, row in pts.rows[t].items():
        pred[c] = row @ theta
    return pred


def rule_predict(data: Data, pts: Points, t: int, out: Sequence[int], rule: tuple[str, float, float]) -> np.ndarray:
    """Per candidate the prediction of ``rule``: ``("local", tau, lam)`` (:func:`predict`) or
    ``("point", lam, alpha)``: ``alpha`` of the point model blended with the ranked rule's."""
    kind, a, b = rule
    if kind == "local":
        return predict(data, t, out, a, b)[0]
    ranked = predict(data, t, out, 0.5, math.inf)[0]
    return ranked if b == 0 else b * point_predict(data, pts, t, out, a) + (1 - b) * ranked


def choose(data: Data, pts: Points, t: int, out: Sequence[int], rule: tuple[str, float, float]) -> int | None:
    """The candidate ``rule`` gives target ``t`` with the buckets of ``out`` left out (None: no
    row, the default): least prediction among the admitted candidates with a time on some bucket
    within reach, one of them with the target's plain fields (a winner's point), whose search is
    not all left out; ties to more evidence, then pool order."""
    pred = rule_predict(data, pts, t, out, rule)
    _, near = predict(data, t, out, 0.5, math.inf)  # the ranked rule's eligibility
    gone = set(out)
    best = None
    for c in data.admitted[t]:
        if data.variant[c] and data.sources[c] and data.sources[c] <= gone:
            continue
        if not near[c].any() or (data.variant[c] and not (near[c] & data.plain[t]).any()):
            continue
        rank = (pred[c], -int(near[c].sum()), c)
        if best is None or rank < best:
            best = rank
    return None if best is None else best[2]


def ratio_of(data: Data, t: int, c: int | None) -> float | None:
    """Fastest over the chosen point's time on target ``t``."""
    return data.default_ratio[t] if c is None else data.ratio[t][c]


def loo(data: Data, pts: Points, rule: tuple[str, float, float], targets: Sequence[int] | None = None,
        skip: int | None = None) -> list[float | None]:
    """The ratio of ``rule`` on each target (all buckets by default), each filled from the others
    (and never from ``skip``, an outer left-out bucket)."""
    targets = range(len(data.keys)) if targets is None else targets
    out = [] if skip is None else [skip]
    return [ratio_of(data, t, choose(data, pts, t, [t, *out], rule)) for t in targets]


def best(data: Data, t: int) -> float | None:
    """The ceiling of any rule on target ``t``: the best ratio of the admitted candidates timed
    there and the default."""
    got = [r for r in [*data.ratio[t].values(), data.default_ratio[t]] if r is not None]
    return max(got, default=None)


def objective(ratios: Sequence[float | None]) -> float:
    """What the inner leave-one-out maximizes: the mean log ratio, a loss over 10% counted twice."""
    logs = [math.log(r) for r in ratios if r is not None]
    return sum(x + min(0.0, x + math.log(LOSS)) for x in logs) / max(1, len(logs))


def nested(data: Data, pts: Points, grid: Sequence[tuple[str, float, float]]
           ) -> tuple[list[float | None], list[tuple[str, float, float]]]:
    """Per target the ratio of the rule of ``grid`` an inner leave-one-out on the other buckets
    alone picks, and the picks."""
    n = len(data.keys)
    ratios, picks = [], []
    for t in range(n):
        others = [u for u in range(n) if u != t]
        best = max(grid, key=lambda g: objective(loo(data, pts, g, targets=others, skip=t)))
        picks.append(best)
        ratios.append(ratio_of(data, t, choose(data, pts, t, [t], best)))
    return ratios, picks


def summary(ratios: Sequence[float | None]) -> str:
    """Geomean, min, how many scored, lose more than 10%, and unscored (the product's figures)."""
    return summarize_ratios(ratios).line()


def by_kind(data: Data, ratios: Sequence[float | None]) -> str:
    return "; ".join(f"{kind}: {summary([r for r, k in zip(ratios, data.kinds) if k == kind])}"
                     for kind in ("measured", "tuned") if kind in data.kinds)


def main(argv: Sequence[str] | None = None) -> int:
    """Print per bucket the ratios of the nearest, ranked and model rules, then the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("op")
    parser.add_argument("chip")
    parser.add_argument("--quiet", action="store_true", help="figures only, no per-bucket lines")
    args = parser.parse_args(argv)
    spec, chip, data = load(args.op, args.chip)
    path = record_path(ROOT, chip.name, spec.op)
    hashes = kernel_hashes(ROOT, spec, chip.rendering)
    product = {rule: {r.key: r.ratio for r in leave_one_out(spec, chip, path, hashes, rule=rule)}
               for rule in ("nearest", "rank")}
    columns = {name: [product[rule].get(k) for k in data.keys] for name, rule in (("nearest", "nearest"),
                                                                                   ("ranked", "rank"))}
    pts = points(data)
    columns["ranked*"] = loo(data, pts, ("local", 0.5, math.inf))  # this script's ranked rule: matches "ranked"
    columns["local"] = loo(data, pts, FIXED[0])
    columns["point"] = loo(data, pts, FIXED[1])
    columns["nested"], picks = nested(data, pts, LOCAL + POINT)
    columns["best"] = [best(data, t) for t in range(len(data.keys))]
    if not args.quiet:
        width = max(len(key_text(spec, k)) for k in data.keys)
        print(f"{'bucket':<{width}} {'kind':<8} " + " ".join(f"{n:>8}" for n in columns) + "  nested pick")
        for i, k in enumerate(data.keys):
            cells = " ".join(f"{'-' if (r := col[i]) is None else f'{r:.3f}':>8}" for col in columns.values())
            print(f"{key_text(spec, k):<{width}} {data.kinds[i]:<8} {cells}  {picks[i]}")
    print(f"{args.op} {args.chip}: {len(data.keys)} buckets, {data.y.shape[0]} candidates, "
          f"{data.x.shape[1]} shape features; local {FIXED[0][1:]}, point {FIXED[1][1:]}")
    for name, col in columns.items():
        print(f"  {name:<8} {by_kind(data, col)}")
    print("  each rule of the nested grid, fixed (local: tau, lam; point: lam, alpha):")
    for rule in LOCAL + POINT:
        print(f"    {rule[0]:<5} {rule[1]:<6} {rule[2]:<5} {by_kind(data, loo(data, pts, rule))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
