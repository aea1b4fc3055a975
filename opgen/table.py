"""The dispatch table frozen from the tuning records: one row per tuned bucket, the others filled.

``frozen_rows`` keys the records by where the spec buckets their cases now, then takes each
bucket's winner in force (the latest one that met the one before it, or on a measured bucket the
point measured fastest there, :func:`held_winners`) whose
kernel (content hash) and tunables still match (else it is a stale winner, reported in the
table, never frozen), then fills each untuned bucket that the records measured the winners' points
on with the fastest of them there (:func:`fill_measured`; where the spec's default measured
faster, the bucket keeps it), and every other bucket of the dispatch key from the nearest tuned or
measured bucket whose point is legal and fits there;
``cross_checked`` finds which tuned rows have a current leave-one-out check in the records. Read
by ``opgen build`` (``freeze``) and the tuner's cross-check.
Uses ``bucket_shapes``, ``errors``, ``fill_rank``, ``fits``, ``hardware``, ``keys``,
``measure_fill``, ``records``, ``space``, ``spec``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from .bucket_shapes import (bucket_corner, case_params as _params, edge_params, free_fields, low_params,
                            plain_fields)
from .errors import BudgetError, ExprError, RecordError, SpecError
from .fits import _fits, legal_across, point_fits, serves_bucket
from .hardware import ChipProfile, figures
from .keys import Key, key_of, key_text, sort_key, split_key_field
from .records import (CheckRecord, MeasureRecord, Record, RecordFile, TrialRecord, WinnerRecord, latest_measure_runs,
                      read, read_paths)
from .space import (carried_clamped, clamped, constraint_failed, find_variant, fixed_values, is_legal,
                    parse_point_name, point_id)
from .spec import OpSpec

__all__ = ["Row", "StaleWinner", "CrossChecked", "FrozenTable", "checked_frozen_winner", "cross_checked",
           "frozen_rows", "fresh_winners", "read_keyed", "rekeyed", "split_winners", "stale", "fill_nearest",
           "fill_measured", "filled_rows", "leave_one_out_fill", "MeasuredFill", "point_fits", "default_source",
           "pending_winners", "Winners", "once", "records_key", "Toolchains", "toolchain_text", "measured_by",
           "MEASURED_ROWS"]


class Row(NamedTuple):
    """One table row: the key, the chosen variant and its tunables in declaration order, the
    winner record they come from, the tuned key it was filled from (None: tuned here) and, for a
    measured fill, the measure record that made the point the fastest there."""

    key: Key
    variant: str
    point: dict[str, Any]
    winner: WinnerRecord
    source: Key | None = None
    measured: MeasureRecord | None = None
    ranked: Any = None  # the ranked fill's choice (opgen.fill_rank.Choice): its evidence


    @property
    def comment(self) -> str:
        """Where the row comes from and what its winner measured, for a person."""
        how = "" if self.source is None else f"from {self.source!r}, "
        if self.measured is not None:
            how = f"measured fastest here ({self.measured.ms:.4f} ms, run {self.measured.run}), {how}"
        return how + comment_of(self.winner)


@dataclass(frozen=True)
class StaleWinner:
    """A winner in force that is not frozen, and why (its kernel or the spec changed since tuning)."""

    record: WinnerRecord
    reason: str


@dataclass(frozen=True)
class CrossChecked:
    """What the records' cross-checks say of the frozen table: how many tuned rows have a current
    check (same winner, same kernels, same fill as the table would now give), and the worst."""

    current: tuple[CheckRecord, ...]
    tuned: int

    @property
    def checked(self) -> int:
        return len(self.current)

    @property
    def worst(self) -> CheckRecord | None:
        return max(self.current, key=lambda r: (r.loss, sort_key(r.key)), default=None)

    @property
    def flagged(self) -> bool:
        return self.worst is not None and self.worst.loss > self.worst.margin

    def line(self) -> str:
        """One line for the table's docstring."""
        text = (f"Cross-check: {self.checked} of {self.tuned} tuned rows checked against their "
                "leave-one-out fill")
        if self.worst is None:
            return text + "."
        w = self.worst
        verdict = "FLAGGED" if self.flagged else "ok"
        text = f"{text}; worst loss {w.loss:.1%} at {w.key!r} (margin {w.margin:.0%}): {verdict}."
        over = sorted((r for r in self.current if r.loss > r.margin), key=lambda r: (-r.loss, sort_key(r.key)))
        if len(over) > 1:
            text += f" Over the margin ({len(over)} rows): " + ", ".join(f"{r.key!r} {r.loss:.1%}" for r in over) + "."
        return text


def toolchain_text(toolchain: Mapping[str, str]) -> str:
    """A records' toolchain for a person: ``cuda 13.0, torch 2.11.0, triton 3.6.0``."""
    return ", ".join(f"{tool} {version}" for tool, version in sorted(toolchain.items())) or "no toolchain named"


def measured_by(row: Row) -> WinnerRecord | MeasureRecord | None:
    """The record that timed ``row``'s point on its own bucket: a tuned row's winner, a measured
    fill's measure record; None for the other fills (their point was timed on another bucket)."""
    if row.measured is not None:
        return row.measured
    return row.winner if row.source is None else None


MEASURED_ROWS = ("tuned row", "measured fill")
"""The kinds of row :func:`measured_by` finds a record of."""


def _measured_kind(row: Row) -> str:
    return MEASURED_ROWS[row.measured is not None]


@dataclass(frozen=True)
class Toolchains:
    """The toolchains the table's measured rows (tuned rows and measured fills) were timed under:
    per toolchain (:func:`toolchain_text`), its rows of each kind of :data:`MEASURED_ROWS`, the
    latest measurement's toolchain first (by date, then in the order the records were read); and,
    in key order, the rows timed under another than that one: their times and ranking may not
    hold under it, so they are to be measured again."""

    counts: tuple[tuple[str, tuple[int, int]], ...] = ()
    other: tuple[tuple[Key, str], ...] = ()  # (key, toolchain text) of each row of another toolchain

    def lines(self) -> list[str]:
        """What the table's docstring and ``opgen records`` say: the toolchains with their rows,
        then the :meth:`warning` where they mix."""
        if not self.counts:
            return []
        each = [(tools, " and ".join(f"{n} {what}s" for n, what in zip(rows, MEASURED_ROWS) if n))
                for tools, rows in self.counts]
        if len(each) == 1:
            return [f"Measured under {each[0][0]}: {each[0][1]}."]
        (tools, rows), *older = each
        return [f"Measured under {len(each)} toolchains: {tools} (the latest measurement's): {rows}; "
                + "; ".join(f"{t}: {r}" for t, r in older) + ".", self.warning()]

    def warning(self) -> str | None:
        """A line naming the rows timed under another toolchain than the latest (None: none are)."""
        if not self.other:
            return None
        return (f"MIXED TOOLCHAINS: {len(self.other)} rows were timed under another toolchain than the latest "
                f"({self.counts[0][0]}); measure their buckets again under it (`opgen tune` on cases of those "
                "buckets, `--trials 0 --measure-fill --remeasure` for the measured fills): "
                + ", ".join(f"{key!r} ({tools})" for key, tools in self.other) + ".")


def toolchains_of(rows: Iterable[Row], order: Mapping[int, int]) -> Toolchains:
    """The :class:`Toolchains` of ``rows`` (in key order); ``order``: each record's position in
    the records read, by ``id`` (of two records of one date, the later is the later measurement)."""
    timed = [(row, rec) for row in rows if (rec := measured_by(row)) is not None]
    if not timed:
        return Toolchains()
    latest = toolchain_text(max(timed, key=lambda t: (t[1].date, order.get(id(t[1]), -1)))[1].toolchain)
    counts: dict[str, list[int]] = {}
    for row, rec in timed:
        counts.setdefault(toolchain_text(rec.toolchain), [0, 0])[MEASURED_ROWS.index(_measured_kind(row))] += 1
    ranked = sorted(counts.items(), key=lambda kv: (kv[0] != latest, kv[0]))
    other = tuple((row.key, text) for row, rec in timed if (text := toolchain_text(rec.toolchain)) != latest)
    return Toolchains(tuple((text, tuple(rows)) for text, rows in ranked), other)


@dataclass(frozen=True)
class FrozenTable:
    """Rows sorted by key (filled rows included), stale winners sorted by key, torn lines skipped,
    and the table's cross-check."""

    rows: tuple[Row, ...]
    stale: tuple[StaleWinner, ...]
    filled: int
    torn: int
    checks: CrossChecked
    measured: int = 0  # of the filled rows, those filled from measurements on their bucket
    kept: tuple[Key, ...] = ()  # untuned buckets left to the spec's default, measured fastest there (key order)
    pending: tuple[Key, ...] = ()  # measured buckets whose winner waits for the measure step (key order)
    defaulted: int = 0  # unmeasured buckets left to the spec's default by a nearer kept bucket
    toolchains: Toolchains = Toolchains()  # what the measured rows were timed under
    # (key, the key its record was measured for, its kind of MEASURED_ROWS): the measured rows
    # whose record holds another key than its case gives now (the spec's dispatch key changed)
    moved: tuple[tuple[Key, Key, str], ...] = ()

    def rekeyed_line(self) -> str | None:
        """What the docstring says of the measured rows frozen under another key than their
        record holds (None: there are none)."""
        if not self.moved:
            return None
        rows = [_measured_kind(r) for r in self.rows if measured_by(r) is not None]
        moved = [what for _, _, what in self.moved]
        parts = " and ".join(f"{moved.count(what)} of the {rows.count(what)} {what}s" for what in MEASURED_ROWS
                             if what in moved)
        return (f"Re-keyed: {parts} were measured for another key than the spec's dispatch key gives their case "
                "now (its fields or bucket edges changed since): each stands for the bucket its case falls in now "
                "(a tuned row's comment names the key it was measured for; `opgen records` lists them all).")


def _describe(path: Path, rec: WinnerRecord) -> str:
    return f"{path}: winner {rec.variant} for key {rec.key} (study {rec.study!r}, {rec.date})"


def _stale_reason(spec: OpSpec, chip: ChipProfile, rec: WinnerRecord, params: Mapping[str, Any],
                  kernel_hashes: Mapping[str, str]) -> str | None:
    current = kernel_hashes.get(rec.variant)
    if current is None:
        return f"variant {rec.variant} has no {chip.rendering} kernel now"
    if current != rec.kernel_hash:
        return f"kernel changed: tuned {rec.kernel_hash}, now {current}"
    tunables = spec.tunables_for(chip.backend)
    if set(rec.point) != set(tunables):
        return f"its tunables {sorted(rec.point)} are not the spec's {sorted(tunables)}"
    return _point_problem(spec, chip, rec, params)


def _point_problem(spec: OpSpec, chip: ChipProfile, rec: WinnerRecord, params: Mapping[str, Any]) -> str | None:
    """Why a winner's point is no point of the spec's space for its case now (a value outside its
    tunable's domain or of another type, a violated constraint), or its median no time; None if
    it holds. The budget is checked apart (over it, the build fails)."""
    variant = find_variant(spec, rec.variant)
    try:
        fixed = fixed_values(spec, variant, params)
    except (SpecError, ExprError) as exc:
        return f"its variant's fixed tunables do not evaluate for its case: {exc}"
    for name in spec.tunables_for(chip.backend):
        value = rec.point[name]
        allowed = [fixed[name]] if name in fixed else list(spec.tunables[name].domain[chip.rendering])
        if not any(type(value) is type(a) and value == a for a in allowed):
            what = f"the value {variant.name} fixes, {allowed[0]!r}" if name in fixed else f"its domain {allowed}"
            return f"{name} {value!r} is not in {what}"
    failed = constraint_failed(spec, rec.variant, rec.point, params)
    if failed is not None:
        return f"its point violates the constraint {failed}"
    if not rec.median_ms > 0:
        return f"its median {rec.median_ms:g} ms is not a time"
    return None


def comment_of(rec: WinnerRecord) -> str:
    """What a winner measured, for a person: median, flush, on-chip bytes, spills, date."""
    parts = [f"median {rec.median_ms:.4f} ms" + (" (writing flush)" if rec.flush == "write" else "")]
    if rec.budget is not None:
        reported = "" if rec.budget.reported is None else f" (reported {rec.budget.reported})"
        parts.append(f"{rec.budget.kind} {rec.budget.estimate}{reported}")
        if rec.budget.spills:
            parts.append(f"{rec.budget.spills} registers spilled")
    return ", ".join(parts + [f"tuned {rec.date}"])


def frozen_rows(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str],
                *, fill: bool = True) -> FrozenTable:
    """The table rows frozen from the records at ``path`` (none without a file).

    Records are keyed by where the spec buckets their cases now (:func:`rekeyed`). Each key's
    winner in force (:func:`held_winners`) is frozen unless stale: its variant has no kernel in
    ``kernel_hashes`` (variant name -> hash of the chip's rendering) or another hash, or the
    spec's tunables changed. Stale winners are listed, never silently dropped.

    Args:
        fill: also fill untuned bucket combinations: from measurements on them where the records
            hold some (:func:`fill_measured`), else from the nearest tuned rows (:func:`fill_nearest`).

    Raises:
        RecordError: a malformed or foreign record, or a fresh winner illegal for its own case.
        BudgetError: a fresh winner over the chip's budget.
    """
    memo = (id(spec), records_key(path, chip), tuple(sorted(kernel_hashes.items())), fill)
    return once(_TABLES, memo, spec, lambda: _frozen_rows(spec, chip, path, kernel_hashes, fill))


# (id(spec), records_key, kernel hashes, fill) -> (spec, table): a table takes seconds to freeze
# and is read several times a run
_TABLES: dict[tuple[Any, ...], tuple[OpSpec, FrozenTable]] = {}


def once(cache: dict[tuple[Any, ...], tuple[OpSpec, Any]], memo: tuple[Any, ...], spec: OpSpec,
         compute: Callable[[], Any]) -> Any:
    """``compute()``'s value, computed once for ``memo`` (whose first item is ``id(spec)``) while
    ``cache`` holds it: the spec is held beside the value so that its id stays its own, and the
    cache is emptied when it would pass 17 entries."""
    if memo not in cache:
        if len(cache) > 16:
            cache.clear()
        cache[memo] = (spec, compute())
    return cache[memo][1]


def records_key(path: Path, chip: ChipProfile) -> tuple[Any, ...]:
    """What a table frozen from ``path`` on ``chip`` depends on besides the spec and kernels: the
    chip's figures and each records file read that exists, with its content's digest. A chip that
    reads only the records it inherits gets its parent's key, so the table is frozen once."""
    read = tuple((str(p), name, digest) for p, name in read_paths(path, chip)
                 if (digest := _content(p)) is not None)
    return tuple(sorted(figures(chip).items())), read or (str(path),)


def _content(path: Path) -> str | None:
    """A digest of the records file (None where there is none)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _frozen_rows(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str],
                 fill: bool) -> FrozenTable:
    """:func:`frozen_rows`, uncached."""
    records, stored = _read_keyed(spec, chip, path)
    fresh, old, pending = split_winners(spec, chip, path, records.records, kernel_hashes)
    tunables = spec.tunables_for(chip.backend)
    rows = [Row(k, r.variant, {n: r.point[n] for n in tunables}, r) for k, r in fresh.items()]
    by_measure = fill_measured(spec, chip, fresh, records.records, kernel_hashes, pending) if fill \
        else MeasuredFill([], {})
    if not fill:
        filled, defaulted = [], 0
    elif spec.dispatch.fill_rule == "ranked":
        filled, defaulted = _filled_ranked(spec, chip, fresh, pending, by_measure, records.records, kernel_hashes)
    else:
        filled, defaulted = _filled(spec, chip, fresh, by_measure)
    measured = [r for r in filled if r.measured is not None]
    rows = sorted(rows + filled, key=lambda r: sort_key(r.key))
    old.sort(key=lambda s: sort_key(s.record.key))
    checks = cross_checked(spec, chip, records.records, fresh, kernel_hashes) if fill \
        else CrossChecked((), len(fresh))
    order = {id(rec): i for i, rec in enumerate(records.records)}
    moved = tuple((r.key, stored[id(rec)], _measured_kind(r))
                  for r in rows if (rec := measured_by(r)) is not None and id(rec) in stored)
    return FrozenTable(tuple(rows), tuple(old), len(filled), records.torn, checks, len(measured),
                       tuple(by_measure.kept), tuple(sorted(pending, key=sort_key)), defaulted,
                       toolchains_of(rows, order), moved)


def cross_checked(spec: OpSpec, chip: ChipProfile, records: Iterable[Record],
                  fresh: Mapping[Key, WinnerRecord], kernel_hashes: Mapping[str, str]) -> CrossChecked:
    """The latest current cross-check of each fresh winner: one that measured this winner, on
    the current kernels, against the fill the table would give its key from the other winners now
    (a check of another point, from ``--cross-check-all``, counts once the fill rule picks it)."""
    fills: dict[Key, tuple[str, dict[str, Any]]] = {}
    latest: dict[Key, CheckRecord] = {}
    for rec in records:
        if not isinstance(rec, CheckRecord) or not checked_frozen_winner(rec, fresh):
            continue
        won = fresh[rec.key]
        if rec.key not in fills:
            params = _params(spec, won.case, f"cross-check of {rec.key}")
            fills[rec.key] = leave_one_out_fill(spec, chip, fresh, rec.key, params)[:2]
        variant, point = fills[rec.key]
        same_kernel = rec.fill_kernel_hash == kernel_hashes.get(variant)
        if (rec.fill_variant, rec.fill_point) == (variant, point) and same_kernel:
            latest[rec.key] = rec
    return CrossChecked(tuple(sorted(latest.values(), key=lambda r: sort_key(r.key))), len(fresh))


def checked_frozen_winner(rec: CheckRecord, fresh: Mapping[Key, WinnerRecord]) -> bool:
    """Whether a cross-check measured its key's frozen winner (same point, same kernel)."""
    won = fresh.get(rec.key)
    return won is not None and (rec.variant, rec.point, rec.kernel_hash) == (
        won.variant, won.point, won.kernel_hash)


def leave_one_out_fill(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord], key: Key,
                       params: Mapping[str, Any], keep: frozenset[Key] = frozenset()
                       ) -> tuple[str, dict[str, Any], str | None]:
    """What the table would give ``key`` from the other tuned keys alone (and the kept buckets of
    ``keep``, :func:`fill_nearest`): the nearest fill's variant, point and source (``from <key>``),
    or with none the spec's default for ``params`` (source None)."""
    from .space import default_point

    others = {k: w for k, w in tuned.items() if k != key}
    row = next(iter(fill_nearest(spec, chip, others, only=key, keep=keep - {key})), None)
    if row is not None:
        return row.variant, row.point, f"from {row.source!r}"
    point = default_point(spec, chip, params)
    return point.variant, dict(point.config), None


def fresh_winners(spec: OpSpec, chip: ChipProfile, path: Path,
                  kernel_hashes: Mapping[str, str]) -> dict[Key, WinnerRecord]:
    """The winners in force at ``path`` that :func:`frozen_rows` freezes, by key (none without a file)."""
    if not any(p.exists() for p, _ in read_paths(path, chip)):
        return {}
    return split_winners(spec, chip, path, read_keyed(spec, chip, path).records, kernel_hashes)[0]


def read_keyed(spec: OpSpec, chip: ChipProfile, path: Path) -> RecordFile:
    """The records of ``spec`` on ``chip`` at ``path``, after those of the chip it inherits from
    (:func:`opgen.records.read_paths`), keyed as the spec buckets their cases now."""
    return _read_keyed(spec, chip, path)[0]


def _read_keyed(spec: OpSpec, chip: ChipProfile, path: Path) -> tuple[RecordFile, dict[int, Key]]:
    """:func:`read_keyed`, and the key each record it re-keyed was stored under (by the ``id``
    of the record returned)."""
    found = [read(p, op=spec.op, chip=name) for p, name in read_paths(path, chip)]
    stored = tuple(r for f in found for r in f.records)
    keyed = rekeyed(spec, stored)
    moved = {id(new): old.key for old, new in zip(stored, keyed) if new is not old}
    return RecordFile(path, keyed, sum(f.torn for f in found)), moved


def rekeyed(spec: OpSpec, records: Iterable[Record]) -> tuple[Record, ...]:
    """``records`` keyed as the spec buckets their cases now: a winner tuned before the dispatch
    edges moved stands for the bucket its case falls in now (a case the spec no longer
    evaluates keeps its stored key)."""
    keys: dict[tuple, Key | None] = {}
    out = []
    for rec in records:
        case = tuple(sorted(rec.case.items(), key=lambda kv: kv[0]))
        if case not in keys:
            try:
                keys[case] = key_of(spec, _params(spec, rec.case, "case"))
            except RecordError:
                keys[case] = None
        key = keys[case]
        out.append(rec if key is None or key == rec.key else dataclasses.replace(rec, key=key))
    return tuple(out)


def pending_winners(spec: OpSpec, chip: ChipProfile, path: Path, records: Iterable[Record],
                    kernel_hashes: Mapping[str, str]) -> dict[Key, WinnerRecord]:
    """The winners held back from untuned keys the measure step had measured: a search that
    never faced the point measured fastest there (a search over some variants alone, say) found
    the best of what it searched, not the bucket's best. Such a winner, on its current kernel,
    is one more candidate of the measure step, on its own key too (:func:`fill_measured`). The
    ``pending`` of :func:`split_winners`, which finds it in the same pass as the others."""
    return split_winners(spec, chip, path, records, kernel_hashes).pending


def held_winners(spec: OpSpec, chip: ChipProfile, path: Path, records: Iterable[Record],
                 kernel_hashes: Mapping[str, str]) -> tuple[dict[Key, WinnerRecord], dict[Key, WinnerRecord]]:
    """Each key's winner in force, and the winners held back for the measure step.

    In force: the last winner in file order, except that a winner of another point which never
    faced the fresh winner in force before it (no trial of that point on the key since, and not
    among its side-by-side re-measures) leaves that one in force. A campaign cut short, or run
    without its journal, cannot replace a row with a point it never measured against it.
    Neither can it replace a measured fill: a key's first winner that never faced the point its
    key's measure runs found fastest, as the measured fill takes it (:func:`_measured_choice`),
    is held back (:func:`pending_winners`)."""
    held: dict[Key, WinnerRecord] = {}
    pending: dict[Key, WinnerRecord] = {}
    faced: dict[Key, set[str]] = {}
    timed: dict[Key, dict[str, list[tuple[str, float]]]] = {}  # per key and measure run: (point, ms)
    latest: dict[Key, str] = {}  # per key: its latest measure run
    for rec in records:
        if isinstance(rec, TrialRecord):
            faced.setdefault(rec.key, set()).add(point_id(rec.variant, rec.point))
        elif isinstance(rec, MeasureRecord):
            latest[rec.key] = rec.run
            runs = timed.setdefault(rec.key, {}).setdefault(rec.run, [])
            if rec.ms is not None and kernel_hashes.get(rec.variant) == rec.kernel_hash:
                runs.append((point_id(rec.variant, rec.point), rec.ms))
        elif isinstance(rec, WinnerRecord):
            cur = held.get(rec.key)
            mine = point_id(cur.variant, cur.point) if cur is not None else None
            met = faced.get(rec.key, set()) | {point_id(*parse_point_name(n)) for n in rec.remeasured_ms}
            measured_best = _measured_choice(timed.get(rec.key, {}), latest.get(rec.key))
            if cur is None and measured_best not in met | {"", point_id(rec.variant, rec.point)}:
                pending[rec.key] = rec
            elif (cur is None or mine == point_id(rec.variant, rec.point) or mine in met
                    or not _current(spec, chip, path, cur, kernel_hashes)):
                held[rec.key] = rec
                pending.pop(rec.key, None)
            faced[rec.key] = set()
    return held, pending


def _current(spec: OpSpec, chip: ChipProfile, path: Path, rec: WinnerRecord,
             kernel_hashes: Mapping[str, str]) -> bool:
    """Whether a winner is not stale (a case the spec no longer evaluates makes it stale too)."""
    try:
        params = _params(spec, rec.case, _describe(path, rec))
    except RecordError:
        return False
    return _stale_reason(spec, chip, rec, params, kernel_hashes) is None


class Winners(NamedTuple):
    """What :func:`split_winners` finds: the fresh winners in force, the stale ones (with why),
    and the winners held back for the measure step (:func:`pending_winners`)."""

    fresh: dict[Key, WinnerRecord]
    stale: list[StaleWinner]
    pending: dict[Key, WinnerRecord]


def split_winners(spec: OpSpec, chip: ChipProfile, path: Path, records: Iterable[Record],
                  kernel_hashes: Mapping[str, str]) -> Winners:
    """Each key's winner in force (:func:`held_winners`) among ``records`` (read from ``path``),
    fresh or stale (with its reason), and the winners held back (:func:`pending_winners`), from
    one pass over the records."""
    fresh: dict[Key, WinnerRecord] = {}
    old: list[StaleWinner] = []
    held, pending = held_winners(spec, chip, path, records, kernel_hashes)
    for key, rec in held.items():
        params = _params(spec, rec.case, _describe(path, rec))
        reason = _stale_reason(spec, chip, rec, params, kernel_hashes)
        if reason is not None:
            old.append(StaleWinner(rec, reason))
            continue
        legal, fits = _fits(spec, chip, rec.variant, rec.point, params)
        if not legal:
            raise RecordError(f"{_describe(path, rec)} is not legal for its case {rec.case}")
        low = low_params(spec, rec.case, _describe(path, rec))
        if low is not None and not is_legal(spec, find_variant(spec, rec.variant), low):
            call = {n: low[n] for n in plain_fields(spec).values()}
            raise RecordError(f"{_describe(path, rec)} is not legal for {call}, a call of its bucket "
                              f"({key_text(spec, key)}): the dispatch key needs a field that parts "
                              "the shapes its variant takes from the others")
        if not fits:
            raise BudgetError(f"{_describe(path, rec)} exceeds {chip.name}'s budget")
        fresh[key] = rec
    return Winners(fresh, old, {key: rec for key, rec in pending.items()
                                if _current(spec, chip, path, rec, kernel_hashes)})


def stale(spec: OpSpec, chip: ChipProfile, path: Path,
          kernel_hashes: Mapping[str, str]) -> list[StaleWinner]:
    """The winners in force at ``path`` that :func:`frozen_rows` does not freeze, sorted by key."""
    return list(frozen_rows(spec, chip, path, kernel_hashes, fill=False).stale)


# --- measured fill ---------------------------------------------------------------------------
class MeasuredFill(NamedTuple):
    """What the measure records decide (:func:`fill_measured`): the rows of the buckets a tuned
    point ran fastest on, and the buckets left to the spec's default, with the record of each."""

    rows: list[Row]
    kept: dict[Key, MeasureRecord]


def fill_measured(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
                  records: Iterable[Record], kernel_hashes: Mapping[str, str],
                  pending: Mapping[Key, WinnerRecord] | None = None) -> MeasuredFill:
    """What the measure records (``opgen tune --measure-fill``) decide for untuned keys: a row of
    the point of the key's latest run that ran fastest there over all its runs (its times over
    each run's fastest, geometric mean, :func:`run_shares`), among the points of ``tuned`` and
    ``pending`` winners (:func:`pending_winners`, which are no tuned keys),
    carried to the measured case as the measure step carries them (:func:`opgen.space.carried`),
    measured on their current kernel, that may stand for the key's whole bucket
    (:func:`serves_bucket`). Equal times go to the winner
    nearest the key (the nearest fill's order). A key whose run holds no such point (its
    winners replaced since, or every one failed there) is left to :func:`fill_nearest`. A key
    where the spec's default (measured on its current kernel, and still the default at the
    measured case) ran faster than every such point gets no row: it is kept at the default."""
    from .measure_fill import DEFAULT_SOURCE
    from .space import default_point

    bucketed = [i for i, f in enumerate(spec.dispatch.key.values()) if split_key_field(f)[1]]
    tunables = spec.tunables_for(chip.backend)
    records = tuple(records)
    runs = {key: recs for key, recs in latest_measure_runs(records).items() if key not in tuned}
    shares = run_shares(records, kernel_hashes)
    sources = {**(pending or {}), **tuned}
    out = MeasuredFill([], {})
    holders_at: dict[tuple, dict[str, list[Key]]] = {}  # per measured case
    for key in sorted(runs, key=sort_key):
        latest = {(r.source == DEFAULT_SOURCE, point_id(r.variant, r.point)): r for r in runs[key]}
        order = _nearest(bucketed, key)
        ranked, current = [], 0
        for (is_default, ident), rec in latest.items():
            try:
                params = _params(spec, rec.case, f"measured fill of {key}")
            except RecordError:
                continue  # a case the spec no longer evaluates
            if is_default:
                if (rec.ms is not None and kernel_hashes.get(rec.variant) == rec.kernel_hash
                        and default_point(spec, chip, params).ident == ident
                        and point_fits(spec, chip, rec.variant, rec.point, params)):
                    ranked.append(((shares[key][True, ident], 1, ()), None, rec))  # a tie goes to a tuned point
                continue
            case = tuple(sorted(rec.case.items()))
            if case not in holders_at:
                largest = edge_params(spec, rec.case, f"measured fill of {key}")
                holders_at[case] = _carried_holders(spec, chip, sources, tunables, params, largest)
            owners = [k for k in holders_at[case].get(ident, ()) if sources[k].kernel_hash == rec.kernel_hash]
            if not owners:
                continue
            current += 1
            src = min(owners, key=lambda k: (_plain_mismatch(bucketed, k, key), order(k)))
            if rec.ms is not None and serves_bucket(spec, chip, rec.variant, rec.point, rec.case):
                score = shares[key][False, ident]
                ranked.append(((score, 0, (_plain_mismatch(bucketed, src, key), order(src))), src, rec))
        if not (ranked and current):  # a run whose tuned points are all stale compares nothing now
            continue
        _, src, rec = min(ranked, key=lambda t: t[0])
        if src is None:
            out.kept[key] = rec
        else:
            out.rows.append(Row(key, rec.variant, {n: rec.point[n] for n in tunables}, sources[src], src, rec))
    return out


def _measured_choice(runs: Mapping[str, list[tuple[str, float]]], last: str | None) -> str:
    """The point the measure runs of a key found fastest, as the measured fill takes it: of the
    last run's points, the least share of each run's fastest over all runs (:func:`_shares`);
    "" with no run, or none that ran."""
    shares = _shares(runs)
    ran = {ident for ident, _ in runs.get(last, ())} if last is not None else set()
    return min(sorted(ran), key=lambda ident: shares[ident], default="")


def _shares(runs: Mapping[str, list[tuple[Any, float]]]) -> dict[Any, float]:
    """Each point's time over the fastest of its run, as a geometric mean over the runs that
    timed it (1.0: the fastest of every run it ran in)."""
    logs: dict[Any, list[float]] = {}
    for timed in runs.values():
        if not timed:
            continue
        fastest = min(ms for _, ms in timed)
        for ident, ms in dict(timed).items():
            logs.setdefault(ident, []).append(math.log(ms / fastest))
    return {ident: math.exp(sum(v) / len(v)) for ident, v in logs.items()}


def run_shares(records: Iterable[Record],
               kernel_hashes: Mapping[str, str]) -> dict[Key, dict[tuple[bool, str], float]]:
    """Per measured key, each point's time over the fastest of its run (1.0: the fastest), as a
    geometric mean over every run of the key that timed it on its current kernel: (is the spec's
    default, point identity) -> share. One run's ranking is its times'; over several, a point
    wins on all of them, not on the last alone (runs of one case have differed by 0.6% against 12%
    in ranking two points)."""
    from .measure_fill import DEFAULT_SOURCE, current_measures

    out: dict[Key, dict[tuple[bool, str], float]] = {}
    for key, recs in current_measures(records, kernel_hashes).items():
        runs: dict[str, list[tuple[tuple[bool, str], float]]] = {}
        for rec in recs:
            if rec.ms is not None:
                runs.setdefault(rec.run, []).append(((rec.source == DEFAULT_SOURCE, point_id(rec.variant, rec.point)),
                                                     rec.ms))
        out[key] = _shares(runs)
    return out


def _carried_holders(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord], tunables: Iterable[str],
                     params: Mapping[str, Any], largest: Mapping[str, Any]) -> dict[str, list[Key]]:
    """The tuned keys by the identity of their winner's point carried to ``params``, its tiles
    clamped to ``largest`` (:func:`opgen.space.carried_clamped`), in key order: the points the
    measure step ran there."""
    holders: dict[str, list[Key]] = {}
    for key in sorted(tuned, key=sort_key):
        rec = tuned[key]
        config = carried_clamped(spec, chip, rec.variant, {n: rec.point[n] for n in tunables}, params, largest)
        if config is not None:
            holders.setdefault(point_id(rec.variant, config), []).append(key)
    return holders


def filled_rows(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
                measured: MeasuredFill) -> list[Row]:
    """The rows the table fills: the measured buckets (``measured``, :func:`fill_measured`), then
    the nearest fill from the tuned and measured buckets (:func:`fill_nearest`), which leaves the
    buckets kept at the default alone."""
    return _filled(spec, chip, tuned, measured)[0]


def _filled(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
            measured: MeasuredFill) -> tuple[list[Row], int]:
    """:func:`filled_rows`, and how many buckets the nearest fill left to the default because a
    bucket kept at it is nearer than any row (one pass of the nearest fill for both)."""
    sources = {**tuned, **stand_ins(measured.rows)}
    pairs = list(_nearest_sources(spec, chip, sources, None, frozenset(measured.kept)))
    return measured.rows + _rows_of(spec, chip, sources, pairs), sum(1 for _, src, _ in pairs if src not in sources)


def _filled_ranked(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord],
                   pending: Mapping[Key, WinnerRecord], measured: MeasuredFill, records: Iterable[Record],
                   kernel_hashes: Mapping[str, str]) -> tuple[list[Row], int]:
    """The measured rows, then for every other untuned bucket of the nearest fill's categories
    the ranked fill's choice (:func:`opgen.fill_rank.fill_ranked`), and how many of those
    buckets it left to the spec's default."""
    from .fill_rank import fill_ranked, gather

    evidence = gather(spec, chip, tuple(records), kernel_hashes, tuned, pending)
    winners = {**pending, **tuned}
    tunables = spec.tunables_for(chip.backend)
    taken = {*tuned, *(r.key for r in measured.rows), *measured.kept}
    rows, defaulted = list(measured.rows), 0
    for target in fill_targets(spec, [*taken], None):
        if target in taken:
            continue
        choice = fill_ranked(spec, chip, evidence, target)
        if choice is None or not choice.candidate.variant:
            defaulted += 1
            continue
        src = choice.candidate.sources[0]
        rows.append(Row(target, choice.variant, {n: choice.point[n] for n in tunables}, winners[src], src,
                        ranked=choice))
    return rows, defaulted


def stand_ins(measured: Iterable[Row]) -> dict[Key, WinnerRecord]:
    """Measured rows as sources of the nearest fill, beside the tuned winners: each its winner's
    record moved to the measured key and case, with the time measured there as its median."""
    return {r.key: dataclasses.replace(r.winner, key=r.key, case=r.measured.case, point=dict(r.point),
                                       median_ms=r.measured.ms)
            for r in measured}


def _plain_mismatch(bucketed: list[int], src: Key, target: Key) -> int:
    """How many plain (unbucketed) key fields differ between two keys."""
    return sum(1 for i, (a, b) in enumerate(zip(src, target)) if i not in bucketed and a != b)


# --- nearest-bucket fill ---------------------------------------------------------------------
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
    (:func:`opgen.bucket_shapes.bucket_corner`: a moved plain-name field at its bucket's upper
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
        order = _nearest(bucketed, target, across)
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


def _nearest(bucketed: list[int], target: Key, across: Iterable[int] = ()) -> Callable[[Key], tuple[Any, ...]]:
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
    are ones a fill may move (:func:`opgen.bucket_shapes.free_fields`, and among the spec's
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

    return None
