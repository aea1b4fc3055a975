"""The rows of the dispatch table and what the table says of them: a :class:`Row` per bucket (where
it comes from, what its record measured), the winners not frozen (:class:`StaleWinner`), what the
records' cross-checks say (:class:`CrossChecked`), the toolchains the measured rows were timed under
(:class:`Toolchains`), and the whole :class:`FrozenTable` that ``opgen.table.table.frozen_rows`` returns.
Uses ``keys``, ``records``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple

from ..spec.keys import Key, sort_key
from ..storage.records import CheckRecord, MeasureRecord, WinnerRecord

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
    ranked: Any = None  # the ranked fill's choice (opgen.table.fill_rank.Choice): its evidence


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


def measured_kind(row: Row) -> str:
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
        counts.setdefault(toolchain_text(rec.toolchain), [0, 0])[MEASURED_ROWS.index(measured_kind(row))] += 1
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
        rows = [measured_kind(r) for r in self.rows if measured_by(r) is not None]
        moved = [what for _, _, what in self.moved]
        parts = " and ".join(f"{moved.count(what)} of the {rows.count(what)} {what}s" for what in MEASURED_ROWS
                             if what in moved)
        return (f"Re-keyed: {parts} were measured for another key than the spec's dispatch key gives their case "
                "now (its fields or bucket edges changed since): each stands for the bucket its case falls in now "
                "(a tuned row's comment names the key it was measured for; `opgen records` lists them all).")


def comment_of(rec: WinnerRecord) -> str:
    """What a winner measured, for a person: median, flush, on-chip bytes, spills, date."""
    parts = [f"median {rec.median_ms:.4f} ms" + (" (writing flush)" if rec.flush == "write" else "")]
    if rec.budget is not None:
        reported = "" if rec.budget.reported is None else f" (reported {rec.budget.reported})"
        parts.append(f"{rec.budget.kind} {rec.budget.estimate}{reported}")
        if rec.budget.spills:
            parts.append(f"{rec.budget.spills} registers spilled")
    return ", ".join(parts + [f"tuned {rec.date}"])
