"""The fill rules scored on the records: the leave-one-out, the gate a table ships with, and their
printing.

:func:`leave_one_out` scores a rule on the records alone: each measured bucket filled from the
others, its point looked up among the times of that bucket's own runs (fastest over the point's,
as the measured fill weighs runs); each tuned bucket likewise where the rule's point has a time
there. ``python -m opgen.table.fill_score <op> <chip>`` prints it for the nearest fill
(:func:`opgen.table.table.leave_one_out_fill`) and for the ranked rule (:mod:`opgen.table.fill_rank`). On the
H200 records of chunk_gla_fwd_o_gk at commit 8ed2e5b the rule's point runs at 0.966 of the
fastest measured candidate's speed on the measured buckets (geomean over 71; min 0.846; 7 lose
more than 10%; 3 chose a point their runs never timed), the nearest fill's at 0.920 (min 0.692; 28 of 73). Narrowing a tile instead of
dropping its candidate (``clamp``) picked 3 narrowed points, none of them timed where it was picked.

:func:`fill_gate` scores the spec's own ``dispatch.fill_rule`` and names the buckets it loses
(``opgen records`` prints it, :mod:`opgen.build.freeze` writes its line into the table). No device, no
clock.
Uses ``fill_evidence``, ``fill_measured``, ``fill_nearest``, ``fill_rank``, ``hardware``, ``kernels``,
``keys``, ``records``, ``space``, ``spec``, ``table_records``.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from ..render.kernels import kernel_hashes
from ..space.space import carried, point_id
from ..spec.hardware import ChipProfile, profile
from ..spec.keys import Key, key_text, sort_key
from ..spec.spec import OpSpec, load_spec
from ..storage.records import Record, WinnerRecord, record_path
from .fill_evidence import DEFAULT, Bucket, Candidate, Evidence, candidates, measured_buckets, tuned_shares
from .fill_measured import fill_measured
from .fill_nearest import leave_one_out_fill, stand_ins
from .fill_rank import RankParams, distance, rank_fill
from .table_records import once, read_keyed, records_key, split_winners

__all__ = ["LOSS", "LooRow", "LooSummary", "summarize", "summarize_ratios", "leave_one_out", "FillGate",
           "fill_gate", "gate_report", "loo_report", "main"]

LOSS = 1.1  # a rule loses a bucket where the fastest ran more than this much faster than its point


class LooRow(NamedTuple):
    """One bucket filled from the others: where the rule took its point from, the point, and the
    fastest time there over the point's (None: the records hold no time of it there)."""

    key: Key
    kind: str
    source: str
    variant: str | None
    point: dict[str, Any] | None
    ratio: float | None
    how: str


class LooSummary(NamedTuple):
    """Geometric mean and least of the scored ratios, how many were scored, how many lose more
    than :data:`LOSS`, and how many buckets had no time for the rule's point."""

    geomean: float
    least: float
    scored: int
    over: int
    unscored: int

    def line(self) -> str:
        if not self.scored:
            return f"no bucket scored, {self.unscored} without a time for the rule's point"
        return (f"geomean {self.geomean:.3f}, min {self.least:.3f} over {self.scored} buckets; "
                f"{self.over} lose more than {LOSS - 1:.0%}; {self.unscored} unscored")


def summarize(rows: Iterable[LooRow]) -> LooSummary:
    """The figures of a leave-one-out (:class:`LooSummary`)."""
    return summarize_ratios(r.ratio for r in rows)


def summarize_ratios(ratios: Iterable[float | None]) -> LooSummary:
    """:func:`summarize` of the ratios alone (None: a bucket without a time for the rule's point)."""
    every = list(ratios)
    got = [r for r in every if r is not None]
    if not got:
        return LooSummary(0.0, 0.0, 0, 0, len(every))
    return LooSummary(math.exp(sum(map(math.log, got)) / len(got)), min(got), len(got),
                      sum(1 for r in got if r < 1 / LOSS), len(every) - len(got))


def _score(spec: OpSpec, chip: ChipProfile, bucket: Bucket, variant: str, point: Mapping[str, Any]
           ) -> tuple[float | None, str]:
    """The fastest time on ``bucket`` over the time of ``point`` carried there, and its source."""
    moved = carried(spec, variant, point, bucket.params)
    ident = None if moved is None else point_id(variant, moved)
    share = bucket.shares.get(ident) if ident is not None else None
    if share is None:
        return None, "not timed there"
    return 1.0 / share, bucket.how[ident]


class _Records(NamedTuple):
    records: tuple[Record, ...]
    tuned: dict[Key, WinnerRecord]
    pending: dict[Key, WinnerRecord]
    hashes: dict[str, str]


def _read(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str]) -> _Records:

    records = read_keyed(spec, chip, path).records
    tuned, _, pending = split_winners(spec, chip, path, records, kernel_hashes)
    return _Records(records, tuned, pending, dict(kernel_hashes))


def leave_one_out(spec: OpSpec, chip: ChipProfile, records_path: Path, kernel_hashes: Mapping[str, str],
                  *, rule: str = "rank", rank: RankParams = RankParams(), kinds: Sequence[str] = ("measured", "tuned")
                  ) -> list[LooRow]:
    """Each measured bucket, and each tuned bucket, filled from the others by ``rule`` and scored
    on the times the records hold there (:func:`_score`), in key order.

    ``rule``: ``"rank"`` (:func:`rank_fill`: the measured buckets' evidence but the target's, and
    the tuned buckets' where ``rank.tuned``; a winner of the target alone is no candidate) or
    ``"nearest"`` (the table's nearest fill, :func:`opgen.table.table.leave_one_out_fill`, from the tuned
    rows, the other measured rows as stand-ins, but those of a tuned target's own winner, and the
    buckets kept at the default). A measured
    bucket's time is each of its runs' fastest over the point's, geometric mean over its runs (as
    the measured fill weighs them); a tuned bucket's is the first of its side-by-side re-measure,
    cross-checks and trials that timed the point (:func:`tuned_shares`).
    """

    got = _read(spec, chip, records_path, kernel_hashes)
    measured = measured_buckets(spec, chip, got.records, got.hashes, skip=got.tuned)
    tuned = tuned_shares(spec, chip, got.records, got.hashes, got.tuned)
    targets = {**(measured if "measured" in kinds else {}), **(tuned if "tuned" in kinds else {})}
    pool = candidates(spec, chip, {**got.pending, **got.tuned})
    evidence = Evidence(pool, {**measured, **(tuned if rank.tuned > 0 else {})})
    if rule == "nearest":
        fill = fill_measured(spec, chip, got.tuned, got.records, got.hashes, got.pending)
        sources = {**got.tuned, **stand_ins(fill.rows)}
        won_by = {row.key: row.source for row in fill.rows}  # a measured row's point: that key's winner
        keep = frozenset(fill.kept)
    rows = []
    for key in sorted(targets, key=sort_key):
        bucket = targets[key]
        if rule == "nearest":
            # a tuned key's own winner stands in no measured row either
            mine = {k: w for k, w in sources.items() if won_by.get(k) != key}
            variant, point, source = leave_one_out_fill(spec, chip, mine, key, bucket.params, keep=keep)
            source = source or DEFAULT
        else:
            choice = rank_fill(spec, chip, evidence, key, bucket.case, rank, exclude=[key])
            if choice is None:  # no row: the bucket runs the spec's default
                variant, point = Candidate("", {}, ()).at(spec, chip, bucket.params) or (None, None)
                source = f"{DEFAULT} (no candidate qualifies)"
            else:
                variant, point, source = choice.variant, choice.point, choice.source
            if variant is None:
                rows.append(LooRow(key, bucket.kind, source, None, None, None, "no point"))
                continue
        ratio, how = _score(spec, chip, bucket, variant, point)
        rows.append(LooRow(key, bucket.kind, source, variant, point, ratio, how))
    return rows


class FillGate(NamedTuple):
    """The spec's fill rule scored on the records (:func:`leave_one_out`), as a table ships it:
    the figures per kind of bucket, and each bucket the rule would serve more than :data:`LOSS`
    slower than the fastest point timed there, with the untuned buckets around it that the rule
    fills (one bucket step away, the same plain fields: the buckets to measure)."""

    rule: str
    summaries: dict[str, LooSummary]
    losses: tuple[tuple[LooRow, tuple[Key, ...]], ...]

    @property
    def worst(self) -> LooRow | None:
        return min((row for row, _ in self.losses), key=lambda r: (r.ratio, sort_key(r.key)), default=None)

    def line(self) -> str:
        """One paragraph for the table's docstring."""
        parts = [f"{kind} buckets: {s.line()}" for kind, s in self.summaries.items() if s.scored or s.unscored]
        text = (f"Fill rule: {self.rule}. Each bucket the records timed, filled from the others "
                f"(leave-one-out), against the fastest point timed there: " + ("; ".join(parts) or "none") + ".")
        if self.losses:
            text += (f" FLAGGED: {len(self.losses)} over the {LOSS - 1:.0%} margin, worst "
                     f"{self.worst.ratio:.3f} at {self.worst.key!r} (`opgen records` names the buckets to measure).")
        return text


def fill_gate(spec: OpSpec, chip: ChipProfile, records_path: Path, kernel_hashes: Mapping[str, str],
              filled: Iterable[Key] = ()) -> FillGate:
    """The spec's ``dispatch.fill_rule`` scored by :func:`leave_one_out` on every measured and
    tuned bucket; for each one it loses, the keys of ``filled`` (the table's rule-filled buckets)
    one bucket step from it with its plain fields, to measure (computed once a process for the same
    records, chip figures, kernels and filled keys: a chip that inherits its records shares it)."""

    filled = list(filled)
    memo = (id(spec), records_key(records_path, chip), tuple(sorted(kernel_hashes.items())), tuple(filled))
    return once(_GATES, memo, spec, lambda: _fill_gate(spec, chip, records_path, kernel_hashes, filled))


# (id(spec), records_key, kernel hashes, filled keys) -> (spec, gate): a gate takes seconds (a
# leave-one-out over every bucket)
_GATES: dict[tuple[Any, ...], tuple[OpSpec, FillGate]] = {}


def _fill_gate(spec: OpSpec, chip: ChipProfile, records_path: Path, kernel_hashes: Mapping[str, str],
               filled: list[Key]) -> FillGate:
    """:func:`fill_gate`, uncached."""
    rule = spec.dispatch.fill_rule
    rows = leave_one_out(spec, chip, records_path, kernel_hashes, rule="rank" if rule == "ranked" else "nearest")
    strict = RankParams(plain_cost=None, cross_cost=None)
    losses = []
    for row in rows:
        if row.ratio is not None and row.ratio < 1 / LOSS:
            around = tuple(sorted((k for k in filled if distance(spec, row.key, k, strict) == 1), key=sort_key))
            losses.append((row, around))
    summaries = {kind: summarize(r for r in rows if r.kind == kind) for kind in ("measured", "tuned")}
    return FillGate(rule, summaries, tuple(losses))


def gate_report(spec: OpSpec, gate: FillGate, op: str, chip: str) -> list[str]:
    """Lines for ``opgen records``: the rule's figures, then each bucket it loses as an error,
    with the buckets around it to measure."""
    lines = [gate.line()]
    for row, around in gate.losses:
        lines.append(f"ERROR: {key_text(spec, row.key)} ({row.kind}): the {gate.rule} fill's point runs at "
                     f"{row.ratio:.3f} of the fastest timed there ({row.source})")
        if around:
            lines.append(f"  measure the {len(around)} filled buckets around it (`opgen tune {op} --chip {chip} "
                         f"--cases SET --trials 0 --measure-fill` on cases there): "
                         + "; ".join(key_text(spec, k) for k in around[:6]) + (" ..." if len(around) > 6 else ""))
    return lines


def loo_report(spec: OpSpec, results: Mapping[str, Sequence[LooRow]]) -> str:
    """Per bucket its key text, kind and each rule's ratio (fastest over its point's time; ``-``
    where the records hold no time of it there), then a line per rule: where its point came from,
    and how the time was taken; last, each rule's figures per kind of bucket (:class:`LooSummary`)."""
    names = list(results)
    by_key: dict[Key, dict[str, LooRow]] = {}
    for name, rows in results.items():
        for row in rows:
            by_key.setdefault(row.key, {})[name] = row
    width = max((len(key_text(spec, key)) for key in by_key), default=6)
    lines = [f"{'bucket':<{width}} {'kind':<8} " + " ".join(f"{n:>8}" for n in names)]
    for key in sorted(by_key, key=sort_key):
        rows = by_key[key]
        ratios = " ".join(f"{'-' if (r := rows.get(n)) is None or r.ratio is None else f'{r.ratio:.3f}':>8}"
                          for n in names)
        lines.append(f"{key_text(spec, key):<{width}} {next(iter(rows.values())).kind:<8} {ratios}")
        lines.extend(f"    {n}: {rows[n].source} ({rows[n].how})" for n in names if n in rows)
    lines.append(f"fastest over the rule's point (a bucket lost: under {1 / LOSS:.3f}):")
    for name, rows in results.items():
        for kind in ("measured", "tuned"):
            part = [r for r in rows if r.kind == kind]
            if part:
                lines.append(f"  {name:<8} {kind:<8} {summarize(part).line()}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opgen.table.fill_score <op> <chip>``: the leave-one-out table of the nearest fill and
    of the ranked rule on the op's records (run from the repository root)."""

    parser = argparse.ArgumentParser(prog="python -m opgen.table.fill_score", description=main.__doc__)
    parser.add_argument("op")
    parser.add_argument("chip")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    defaults = RankParams()
    parser.add_argument("--tau", type=float, default=defaults.tau)
    parser.add_argument("--cross-cost", type=float, default=defaults.cross_cost)
    parser.add_argument("--plain-cost", type=float, default=defaults.plain_cost,
                        help="distance of another differing plain key field (negative: such evidence does not count)")
    parser.add_argument("--min-evidence", type=int, default=defaults.min_evidence)
    parser.add_argument("--weight", action="append", default=[], metavar="FIELD=W",
                        help="distance of one bucket step of a bucketed key field (1 by default)")
    parser.add_argument("--any-category", action="store_true",
                        help="no evidence in the target's own plain fields needed")
    parser.add_argument("--clamp", action="store_true", help="narrow a tile wider than the target's dims")
    parser.add_argument("--tuned-evidence", type=float, default=defaults.tuned, metavar="W",
                        help="weight of tuned buckets' times as evidence (0: none)")
    parser.add_argument("--reach", type=float, default=None)
    args = parser.parse_args(argv)
    rank = RankParams(tau=args.tau, cross_cost=args.cross_cost,
                      plain_cost=None if args.plain_cost is not None and args.plain_cost < 0 else args.plain_cost,
                      weights=tuple((n, float(w)) for n, w in (item.split("=", 1) for item in args.weight)),
                      min_evidence=args.min_evidence, own=not args.any_category, clamp=args.clamp,
                      tuned=args.tuned_evidence, reach=args.reach)
    spec = load_spec(args.root / "specs" / f"{args.op}.yaml", args.root)
    chip = profile(args.chip)
    hashes = kernel_hashes(args.root, spec, chip.rendering)
    path = record_path(args.root, chip.name, spec.op)
    results = {rule: leave_one_out(spec, chip, path, hashes, rule=rule, rank=rank) for rule in ("nearest", "rank")}
    print(loo_report(spec, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
