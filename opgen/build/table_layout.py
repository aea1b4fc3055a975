"""The frozen table as a person reads it: each distinct config once, named; the tuned rows with
the ranges their bucket indices stand for and what their winners measured; the filled bucket
combinations as a few ranges of bucket indices per plain-field value (computed here, at build
time, from the rows :func:`opgen.table.table.frozen_rows` fills).

Uses ``keys``, ``spec``, ``table_rows``.
"""
from __future__ import annotations

import hashlib
import itertools
import textwrap
from dataclasses import dataclass
from typing import Any

from ..spec.keys import bucket_range, key_text, sort_key, split_key_field
from ..spec.spec import OpSpec
from ..table.table_rows import FrozenTable, Row, comment_of

WIDTH = 100
"""The longest line a generated table may have."""


@dataclass(frozen=True)
class Fill:
    """Bucket combinations served by one config: the plain fields' values and, per bucketed
    field, the first and last bucket index (inclusive)."""

    plain: tuple[Any, ...]
    ranges: tuple[tuple[int, int], ...]
    config: str
    measured: bool = False  # filled from measurements on these buckets, not from the nearest


def config_names(rows: tuple[Row, ...]) -> dict[tuple[str, tuple], str]:
    """A name per distinct ``(variant, tunables)``: ``<variant>/<digest>``, the digest the first
    hex digits of a hash of the tunables (six, more where two configs would share them), so that a
    config keeps its name when a re-tune adds, drops or moves others."""
    idents = sorted({(row.variant, tuple(row.point.items())) for row in rows}, key=repr)
    digests = {ident: hashlib.sha256(repr(sorted(ident[1])).encode()).hexdigest() for ident in idents}
    width = 6
    while len({(v, digests[(v, p)][:width]) for v, p in idents}) < len(idents):
        width += 2
    return {ident: f"{ident[0]}/{digests[ident][:width]}" for ident in idents}


def fill_ranges(spec: OpSpec, rows: tuple[Row, ...], names: dict[tuple[str, tuple], str]) -> list[Fill]:
    """The filled rows as ranges: from the first filled combination not yet covered (in key
    order), a box grown along each bucketed field while every combination it takes in is filled
    with the same config, filled the same way (measured or nearest), or tuned (a tuned row wins
    over any range). No range takes in a combination the table leaves to the spec's default."""
    fields = list(spec.dispatch.key.values())
    bucketed = [i for i, f in enumerate(fields) if split_key_field(f)[1]]
    counts = [len(split_key_field(fields[i])[1]) + 1 for i in bucketed]
    groups: dict[tuple, tuple[dict[tuple, tuple[str, bool]], set[tuple]]] = {}
    for row in rows:
        plain = tuple(v for i, v in enumerate(row.key) if i not in bucketed)
        cells, tuned = groups.setdefault(plain, ({}, set()))
        index = tuple(row.key[i] for i in bucketed)
        if row.source is None:
            tuned.add(index)
        else:
            cells[index] = names[(row.variant, tuple(row.point.items()))], row.measured is not None
    out = []
    for plain in sorted(groups, key=sort_key):
        cells, tuned = groups[plain]
        covered: set[tuple] = set()
        for start in sorted(cells):
            if start in covered:
                continue
            cell, lo, hi = cells[start], list(start), list(start)
            for d in range(len(counts)):
                while hi[d] + 1 < counts[d]:
                    slab = [range(lo[e], hi[e] + 1) if e != d else (hi[d] + 1,) for e in range(len(counts))]
                    if not all(cells.get(c) == cell or c in tuned for c in itertools.product(*slab)):
                        break
                    hi[d] += 1
            covered.update(itertools.product(*(range(a, b + 1) for a, b in zip(lo, hi))))
            out.append(Fill(plain, tuple(zip(lo, hi)), *cell))
    return out


def _wrap(text: str, indent: int) -> list[str]:
    """``text`` as comment lines within :data:`WIDTH` at ``indent`` spaces."""
    return textwrap.wrap(text, WIDTH - indent - 2, break_on_hyphens=False)


def _pack(items: list[str], width: int) -> list[str]:
    """Comma-separated ``items`` over as few lines of at most ``width`` as keep each item whole."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) + 1 <= width:
            lines[-1] += ", " + item
        else:
            lines[-1:] = [lines[-1] + ","] if lines else []
            lines.append(item)
    return lines


def layout(spec: OpSpec, table: FrozenTable) -> dict[str, Any]:
    """The table template's context: ``configs`` (name, variant, tunables),
    ``tuned`` (key, config name, comment lines), ``fills`` (plain values, ranges, config name,
    comment lines), ``bucketed`` (key positions holding bucket indices), ``summary`` lines."""
    fields = list(spec.dispatch.key.items())
    bucketed = tuple(i for i, (_, f) in enumerate(fields) if split_key_field(f)[1])
    names = config_names(table.rows)
    configs = [(name, variant, dict(point))
               for (variant, point), name in sorted(names.items(), key=lambda kv: kv[1])]
    tuned = []
    stored = {key: old for key, old, what in table.moved if what == "tuned row"}
    for row in table.rows:
        if row.source is None:
            parts = key_text(spec, row.key).split(", ") + comment_of(row.winner).split(", ")
            if row.key in stored:
                parts.append(f"measured for key {stored[row.key]!r}")
            tuned.append((row.key, names[(row.variant, tuple(row.point.items()))], _pack(parts, WIDTH - 6)))
    fills = []
    for fill in fill_ranges(spec, table.rows, names):
        plain = iter(fill.plain)
        ranges = iter(fill.ranges)
        words = []
        for i, (name, field) in enumerate(fields):
            if i in bucketed:
                words.append(bucket_range(name, split_key_field(field)[1], *next(ranges)))
            else:
                words.append(f"{name}={next(plain)}")
        if fill.measured:
            words.append("measured fastest here")
        fills.append((fill.plain, fill.ranges, fill.config, _pack(words, WIDTH - 6)))
    return dict(configs=configs, tuned=tuned, fills=fills, bucketed=bucketed)


def wrap_comment(text: str, indent: int = 0) -> list[str]:
    """A docstring or comment paragraph within :data:`WIDTH`."""
    return _wrap(text, indent)
