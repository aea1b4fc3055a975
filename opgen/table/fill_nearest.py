"""The nearest fill: an untuned bucket takes the point of the nearest tuned (or measured) bucket
that is legal and fits there (:func:`fill_nearest`); what the table would give a tuned key from
the others alone (:func:`leave_one_out_fill`, the cross-check's rival).
Uses ``bucket_shapes``, ``fits``, ``hardware``, ``keys``, ``records``, ``space``, ``spec``,
``table_rows``.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterable, Mapping

from ..space.space import clamped, default_point
from ..spec.hardware import ChipProfile
from ..spec.keys import Key, sort_key, split_key_field
from ..spec.spec import OpSpec
from ..storage.records import WinnerRecord
from .bucket_shapes import bucket_corner, free_fields
from .fits import legal_across, point_fits
from .table_rows import FrozenTable, Row

def leave_one_out_fill(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord], key: Key,
                       params: Mapping[str, Any], keep: frozenset[Key] = frozenset()
                       ) -> tuple[str, dict[str, Any], str | None]:
    """What the table would give ``key`` from the other tuned keys alone (and the kept buckets of
    ``keep``, :func:`fill_nearest`): the nearest fill's variant, point and source (``from <key>``),
    or with none the spec's default for ``params`` (source None)."""
    others = {k: w for k, w in tuned.items() if k != key}
    row = next(iter(fill_nearest(spec, chip, others, only=key, keep=keep - {key})), None)
    if row is not None:
        return row.variant, row.point, f"from {row.source!r}"
    point = default_point(spec, chip, params)
    return point.variant, dict(point.config), None


def fill_nearest(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
                 only: Key | None = None, keep: frozenset[Key] = frozenset()) -> list[Row]:
    """Rows for untuned keys that differ from tuned ones only in bucketed fields (with ``only``,
    the row of that key alone, if it gets one), but for the keys of ``keep`` (measured buckets
    where the spec's default ran fastest, left to it).

    For each assignment of the categorical fields among ``tuned`` (with every value any source
    has of a field of the spec's ``dispatch.fill_across``), every combination of bucket indices
    without a row takes the nearest tuned row of that assignment (L1 distance over bucket indices,
    then rows of the same crossed values, ties to the larger buckets, then key order; a row that
    differs in a crossed field fills the target of its own bucket indices alone, before any
    row a step away) whose variant is legal and within budget
    on a representative shape of the target: the target's call nearest the source case
    (:func:`opgen.table.bucket_shapes.bucket_corner`: a moved plain-name field at its bucket's upper
    edge, one past the last edge in the last bucket), and legal on the target's smallest call
    (:func:`legal_across`), at most the spec's ``dispatch.fill_distance`` away. A key of
    ``keep`` nearer than any such row stands for the default: the target stays unfilled, as does
    a key with no such row (both take the spec's default). Each row names its source key.
    """
    return _rows_of(spec, chip, tuned, _nearest_sources(spec, chip, tuned, only, keep))


def _rows_of(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
             pairs: Iterable[tuple[Key, Key, Mapping[str, Any] | None]]) -> list[Row]:
    """The rows of the nearest fill's (target, source, point) triples whose source is a row of
    ``tuned`` (the others leave their target to the default)."""
    tunables = spec.tunables_for(chip.backend)
    return [Row(target, tuned[src].variant, {n: point[n] for n in tunables}, tuned[src], src)
            for target, src, point in pairs if src in tuned and point is not None]


def stand_ins(measured: Iterable[Row]) -> dict[Key, WinnerRecord]:
    """Measured rows as sources of the nearest fill, beside the tuned winners: each its winner's
    record moved to the measured key and case, with the time measured there as its median."""
    return {r.key: dataclasses.replace(r.winner, key=r.key, case=r.measured.case, point=dict(r.point),
                                       median_ms=r.measured.ms)
            for r in measured}


def nearest_rows(spec: OpSpec, chip: ChipProfile, sources: Mapping[Key, WinnerRecord],
                 keep: frozenset[Key]) -> tuple[list[Row], int]:
    """The rows of the nearest fill from ``sources`` (:func:`fill_nearest`), and how many buckets
    it left to the default because a bucket of ``keep`` is nearer than any row (one pass for both)."""
    pairs = list(_nearest_sources(spec, chip, sources, None, keep))
    return _rows_of(spec, chip, sources, pairs), sum(1 for _, src, _ in pairs if src not in sources)


def default_source(spec: OpSpec, chip: ChipProfile, table: FrozenTable, key: Key) -> Key | None:
    """The measured bucket kept at the spec's default (``table.kept``) that leaves the untuned,
    unfilled ``key`` to the default too, being nearer than any row that could fill it; None if no
    such bucket does."""
    sources = {**{r.key: r.winner for r in table.rows if r.source is None},
               **stand_ins(r for r in table.rows if r.measured is not None)}
    return next((src for _, src, _ in _nearest_sources(spec, chip, sources, key, frozenset(table.kept))
                 if src not in sources), None)


def fill_targets(spec: OpSpec, sources: Iterable[Key], only: Key | None) -> Iterable[Key]:
    """The keys a fill decides from ``sources``: every combination of bucket indices for each
    assignment of the unbucketed fields among the sources (a field of the spec's
    ``dispatch.fill_across`` taking every value any source has), in key order; with ``only``,
    that key alone if it is one of them."""
    fields_ = list(spec.dispatch.key.values())
    bucketed = [i for i, f in enumerate(fields_) if split_key_field(f)[1]]
    if not bucketed:
        return
    sources = list(sources)
    across = [i for i, name in enumerate(spec.dispatch.key) if name in spec.dispatch.fill_across]
    plain = [i for i in range(len(fields_)) if i not in bucketed]
    seen = {i: sorted({key[i] for key in sources}, key=repr) for i in across}
    cats = {combo for key in sources for combo in itertools.product(*(seen[i] if i in across else [key[i]]
                                                                       for i in plain))}
    counts = [len(split_key_field(fields_[i])[1]) + 1 for i in bucketed]
    if only is not None:  # one key: no walk over the others
        if tuple(only[i] for i in plain) in cats and all(0 <= only[i] < n for i, n in zip(bucketed, counts)):
            yield only
        return
    for cat in sorted(cats, key=sort_key):
        for combo in itertools.product(*(range(n) for n in counts)):
            slots, rest = dict(zip(bucketed, combo)), iter(cat)
            yield tuple(slots[i] if i in slots else next(rest) for i in range(len(fields_)))


def _nearest_sources(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord], only: Key | None,
                     keep: frozenset[Key]) -> Iterable[tuple[Key, Key, dict[str, Any] | None]]:
    """(target, source, point) for each key the nearest fill decides (:func:`fill_nearest`): a key
    of ``tuned`` whose row fills it, with the source's point (its tiles clamped to the target's
    dims, :func:`_fill_point`), or a key of ``keep`` that leaves it to the default (point None)."""
    fields_ = list(spec.dispatch.key.values())
    bucketed = [i for i, f in enumerate(fields_) if split_key_field(f)[1]]
    if not bucketed or not tuned:
        return
    free = free_fields(spec)
    across = [i for i, name in enumerate(spec.dispatch.key) if name in spec.dispatch.fill_across]
    plain = [i for i in range(len(fields_)) if i not in bucketed]
    sources = [*tuned, *(k for k in keep if k not in tuned)]
    groups: dict[Key, list[Key]] = {}  # by the unbucketed fields a fill may not cross
    for key in sources:
        groups.setdefault(tuple(key[i] for i in plain if i not in across), []).append(key)
    reach = spec.dispatch.fill_distance

    for target in fill_targets(spec, sources, only):
        if target in tuned or target in keep:
            continue
        order = nearest_order(bucketed, target, across)
        for src in sorted(groups[tuple(target[i] for i in plain if i not in across)], key=order):
            dist, crossed = order(src)[:2]
            if reach is not None and dist + crossed > reach:
                continue  # farther than the spec allows (each crossed field counts 1)
            if crossed and dist:
                continue  # a crossed row fills its own buckets alone
            if src not in tuned:  # the default ran fastest on the nearest measured bucket
                yield target, src, None
                break
            point = _fill_point(spec, chip, tuned[src], src, target, bucketed, free, across)
            if point is not None:
                yield target, src, point
                break


def nearest_order(bucketed: list[int], target: Key, across: Iterable[int] = ()) -> Callable[[Key], tuple[Any, ...]]:
    """Sort key of candidate source keys: L1 distance over bucket indices, then how many of the
    unbucketed fields at ``across`` (positions the fill may cross) differ, then larger buckets,
    then key order.

    Larger first: tiles tuned for larger dims cover a smaller shape (masked), while tiles tuned
    for smaller dims split a larger one into more programs that read the shared operands again.
    In the H200 records of commit 59c9b50, K=V=96 ran within 0-6% of its own winner with the
    K=V=128 winners and lost 71-81% with the K=V=64 one, its nearer-below neighbour at the same
    distance.
    """
    def order(src: Key) -> tuple[Any, ...]:
        dist = sum(abs(src[i] - target[i]) for i in bucketed)
        return dist, sum(1 for i in across if src[i] != target[i]), tuple(-src[i] for i in bucketed), sort_key(src)
    return order


def _fill_point(spec: OpSpec, chip: ChipProfile, rec: WinnerRecord, src: Key, target: Key,
                bucketed: list[int], free: Mapping[int, str | None], across: Iterable[int]) -> dict[str, Any] | None:
    """The source's point as it may stand for the target bucket, or None: the fields that differ
    are ones a fill may move (:func:`opgen.table.bucket_shapes.free_fields`, and among the spec's
    ``dispatch.fill_moves`` where it names some) or cross (positions
    ``across``, the spec's ``dispatch.fill_across``: the source's case takes the target's value);
    its tiles are clamped to the target's largest call (:func:`clamped`: BV 128 tuned at V = 96
    runs BV 64 at V <= 64), and the point is legal and within budget on the target's call nearest
    the source's case, and legal on its smallest."""
    moves = spec.dispatch.fill_moves
    names = list(spec.dispatch.key)
    if any(i not in free or (moves and names[i] not in moves) for i in bucketed if src[i] != target[i]):
        return None
    crossed = {names[i]: target[i] for i in across if src[i] != target[i]}
    if crossed:
        rec = dataclasses.replace(rec, case={**rec.case, **crossed})
    where = f"fill of {target} from {src}"
    params = bucket_corner(spec, rec.case, where, target, "case")
    if params is None:
        return None  # no call of the spec lands on the target near the source's case
    point = clamped(spec, chip, rec.variant, rec.point, bucket_corner(spec, rec.case, where, target, "high") or params)
    if point is None or not (point_fits(spec, chip, rec.variant, point, params)
                             and legal_across(spec, rec.variant, rec.case, where, target)):
        return None
    return point
