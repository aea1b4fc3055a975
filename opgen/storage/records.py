"""Tuning records: JSON lines of measured trials, decided winners, their cross-checks and the
re-measures of the fill's candidates on untuned buckets (frozen by ``opgen.table.table``).

One file per op and chip, ``records/<chip>/<op>.jsonl``, tracked in git and read by ``opgen build``.
Each line is one record (schema version :data:`SCHEMA`, keys sorted, compact separators) carrying
its full key: op, chip, toolchain, the kernel's content hash, the dispatch key (``opgen.spec.keys``) and the case row.
Writers append under an exclusive ``flock`` with flush and fsync; readers skip blank lines and a torn
last line (counted), refuse a malformed line elsewhere and refuse a record of another op, chip or schema
(optuna ``journal/_file.py``; Kernel Tuner ``process_cache``). No clock, no device: dates come from
the caller. Uses ``errors``, ``hardware``, ``keys``, ``record_fields``.
"""
from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import stat
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Iterable

from ..errors import RecordError
from ..spec.hardware import ChipProfile, inherited
from ..spec.keys import Key
from .record_fields import (Budget, Conv, as_budget, as_date, as_int, as_num, as_scalar,
                            as_str, dict_of, one_of, optional, plain_value, tuple_of)

SCHEMA = 1
"""Version of the line format; a line of any other version is a foreign record."""

STATUSES = ("ok", "compile_error", "crash", "timeout", "wrong_result", "over_budget", "killed")
"""A trial's outcome; ``killed``: its worker was killed from outside (a signal it did not raise
itself), which says nothing of the point."""


# --- records ---------------------------------------------------------------------------------
FLUSHES = ("read", "write")
"""How the cache was flushed before each timed call: ``read`` (the default: the flush reads) or
``write`` (write-flush timing: the flush zero-fills, leaving dirty lines)."""

_COMMON: dict[str, Conv] = dict(
    op=as_str, chip=as_str, toolchain=dict_of(as_str), kernel_hash=as_str, key=tuple_of(as_scalar),
    case=dict_of(as_scalar), variant=as_str, point=dict_of(as_scalar), study=as_str, date=as_date,
    flush=one_of(*FLUSHES))
# Keys a line may lack, with the value such a line stands for.
_DEFAULTS: dict[str, Any] = {"flush": "write"}


@dataclass(frozen=True)
class _Record:
    """Fields every record carries; subclasses add theirs and name their converters."""

    op: str
    chip: str
    toolchain: dict[str, str]
    kernel_hash: str
    key: Key
    case: dict[str, Any]
    variant: str
    point: dict[str, Any]
    study: str
    date: str
    # The timing protocol's flush: times taken under the two do not compare (a writing flush
    # leaves dirty lines whose write-back the timed call pays). A line without it reads "write".
    flush: str = field(default="read", kw_only=True)

    KIND: ClassVar[str] = ""
    CONVERT: ClassVar[dict[str, Conv]] = {}
    DEFAULTS: ClassVar[dict[str, Any]] = _DEFAULTS

    def __post_init__(self) -> None:
        for name, conv in self.CONVERT.items():
            try:
                value = conv(getattr(self, name))
            except RecordError as exc:
                raise RecordError(f"{self.KIND} record: {name}: {exc.detail}") from None
            object.__setattr__(self, name, value)  # stored form: tuples, fresh dicts, floats

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object, with ``schema`` and ``kind``."""
        out = {f.name: plain_value(getattr(self, f.name)) for f in fields(self)}
        return {"schema": SCHEMA, "kind": self.KIND, **out}

    def line(self) -> str:
        """The record's line (no newline): keys sorted, compact separators, strict JSON."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, data: Any, where: str = "record") -> Any:
        """Build a record from a decoded line; RecordError naming ``where`` (``path:line``) if malformed."""
        try:
            wanted = {"schema": SCHEMA, "kind": cls.KIND}
            if not isinstance(data, dict) or {k: data.get(k) for k in wanted} != wanted:
                got = {k: data.get(k) for k in wanted} if isinstance(data, dict) else data
                raise RecordError(f"expected a JSON object with {wanted}, got {got!r}")
            names = {*wanted, *cls.CONVERT}
            data = {**{k: v for k, v in cls.DEFAULTS.items() if k in names}, **data}
            if set(data) != names:
                raise RecordError(f"{cls.KIND} record: missing keys {sorted(names - set(data))}, "
                                  f"unknown keys {sorted(set(data) - names)}")
            return cls(**{name: data[name] for name in cls.CONVERT})
        except RecordError as exc:
            raise RecordError(f"{where}: {exc.detail}") from None


@dataclass(frozen=True)
class TrialRecord(_Record):
    """One measured point: its status, timings, accuracy numbers and on-chip bytes."""

    trial: int
    status: str
    reason: str
    median_ms: float | None
    times_ms: tuple[float, ...]
    error: dict[str, float | None]
    budget: Budget | None

    KIND: ClassVar[str] = "trial"
    CONVERT: ClassVar[dict[str, Conv]] = dict(
        _COMMON, trial=as_int, status=one_of(*STATUSES), reason=as_str, median_ms=optional(as_num),
        times_ms=tuple_of(as_num), error=dict_of(optional(as_num)), budget=as_budget)

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.status == "ok") != (self.reason == ""):
            raise RecordError(f"trial record: reason: expected empty exactly when status is ok, "
                              f"got status {self.status!r} and reason {self.reason!r}")


@dataclass(frozen=True)
class WinnerRecord(_Record):
    """The point chosen for a dispatch key after the side-by-side re-measure of the best few.

    ``margin`` is the relative gap to the runner-up (None when there was none).
    """

    median_ms: float
    remeasured_ms: dict[str, float]
    margin: float | None
    error: dict[str, float | None]
    budget: Budget | None

    KIND: ClassVar[str] = "winner"
    CONVERT: ClassVar[dict[str, Conv]] = dict(
        _COMMON, median_ms=as_num, remeasured_ms=dict_of(as_num), margin=optional(as_num),
        error=dict_of(optional(as_num)), budget=as_budget)


@dataclass(frozen=True)
class CheckRecord(_Record):
    """A tuned winner (the common fields) re-measured beside another point on its key's case: the
    row the table would fill its key with from the other keys' winners alone (``opgen tune
    --cross-check``) or, with ``--cross-check-all``, another key's winner.

    ``fill_from`` says where that point came from (``from <key>``: the fill; ``winner of <key>``;
    None: the spec's default); a time is None when that point failed its re-measure. ``margin``
    is the loss that flags the table.
    """

    fill_variant: str
    fill_point: dict[str, Any]
    fill_kernel_hash: str
    fill_from: str | None
    own_ms: float | None
    fill_ms: float | None
    margin: float

    KIND: ClassVar[str] = "cross_check"
    CONVERT: ClassVar[dict[str, Conv]] = dict(
        _COMMON, fill_variant=as_str, fill_point=dict_of(as_scalar), fill_kernel_hash=as_str,
        fill_from=optional(as_str), own_ms=optional(as_num), fill_ms=optional(as_num), margin=as_num)

    @property
    def loss(self) -> float:
        """Relative time the fill loses to the own winner (inf when either failed)."""
        if self.own_ms is None or self.fill_ms is None:
            return float("inf")
        return self.fill_ms / self.own_ms - 1.0


@dataclass(frozen=True)
class MeasureRecord(_Record):
    """A candidate for an untuned bucket's fill (the common fields: a tuned winner's point, its
    kernel, the bucket's key and first case) re-measured there side by side with the other
    candidates of one run (``opgen tune --measure-fill``): the measured step of the table's fill.

    ``ms`` is the geomean over the bucket's cases (None: the point failed there, ``reason`` says
    how: the status and message of its first failing case); ``source`` names the key whose winner
    the point is; ``run`` names the run, whose records alone compare.
    """

    ms: float | None
    source: str
    run: str
    reason: str = field(default="", kw_only=True)  # "" where a line has none

    KIND: ClassVar[str] = "measure"
    CONVERT: ClassVar[dict[str, Conv]] = dict(_COMMON, ms=optional(as_num), source=as_str, run=as_str, reason=as_str)
    DEFAULTS: ClassVar[dict[str, Any]] = {**_DEFAULTS, "reason": ""}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ms is not None and self.reason:
            raise RecordError(f"measure record: reason: expected empty for a point that ran, got {self.reason!r}")


Record = TrialRecord | WinnerRecord | CheckRecord | MeasureRecord
_CLASSES: dict[str, type[_Record]] = {
    "trial": TrialRecord, "winner": WinnerRecord, "cross_check": CheckRecord, "measure": MeasureRecord}


def kernel_hash(text: str) -> str:
    """Identity of a rendered kernel module: its text without the leading ``#`` header lines.

    The header names spec and template hashes, which change on edits that leave the kernel alone.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    body = "\n".join(itertools.dropwhile(lambda s: s.startswith("#"), lines))
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


# --- files -----------------------------------------------------------------------------------
def record_path(root: Path, chip: str, op: str) -> Path:
    """Where the records of ``op`` on ``chip`` live: ``<root>/records/<chip>/<op>.jsonl``."""
    return root / "records" / chip / f"{op}.jsonl"


def read_paths(path: Path, chip: ChipProfile) -> tuple[tuple[Path, str], ...]:
    """The files read as ``chip``'s records at ``path``, each with the chip its records name:
    where ``path`` is ``chip``'s own file (``records/<chip>/<op>.jsonl``) and ``chip`` inherits
    another's (:func:`opgen.spec.hardware.inherited`), that chip's file of the op first, where it
    exists, then ``path``. Read in that order, a winner or measure of ``chip``'s own stands over
    the other chip's for its bucket, as a later record does; a bucket it never measured keeps the
    other chip's."""
    source = inherited(chip)
    own = ((path, chip.name),)
    if source is None or path.parent.name != chip.name:
        return own
    parent = path.parent.parent / source.name / path.name
    return (((parent, source.name),) if parent.exists() else ()) + own


@dataclass(frozen=True)
class RecordFile:
    """What :func:`read` found: the records in file order and how many torn last lines it skipped."""

    path: Path
    records: tuple[Record, ...]
    torn: int


class _DuplicateKey(Exception):
    """A JSON object of a records line names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def read(path: Path, *, op: str, chip: str) -> RecordFile:
    """Read a record file; a missing file has no records.

    Raises:
        RecordError: ``path:line`` on a malformed line (other than a torn last line) or a
            foreign record (another op, chip or schema version); ``path`` where it is no regular
            file (a folder, a FIFO, a device) or a link that loops or leads nowhere, which would
            otherwise read as no records.
    """
    try:
        found = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise RecordError(f"{path} is a link to nothing ({os.readlink(path)})") from None
        return RecordFile(path, (), 0)
    except OSError as exc:  # a loop of links, a file where a folder should be
        raise RecordError(f"{path}: {exc.strerror.lower()}") from None
    if not stat.S_ISREG(found.st_mode):
        raise RecordError(f"{path} is not a regular file")
    data = path.read_bytes()
    lines = data.split(b"\n")
    if not lines[-1]:
        lines.pop()  # the file ends with a newline (or is empty)
    out: list[Record] = []
    torn = 0
    for n, raw in enumerate(lines, 1):
        where = f"{path}:{n}"
        if not raw.strip():
            continue  # a blank line (one left by an editor at the end) holds no record
        try:
            out.append(from_line(raw, where, op=op, chip=chip))
        except NotJsonLine:
            if n == len(lines) and not data.endswith(b"\n"):
                torn = 1  # a writer died mid-line: skipped, counted, cut by the next append
                continue
            raise
    return RecordFile(path, tuple(out), torn)


class NotJsonLine(RecordError):
    """A records line that does not parse as JSON (a torn last line, where a file ends so)."""


def from_line(raw: bytes | str, where: str, *, op: str, chip: str) -> Record:
    """The record of one line.

    Raises:
        RecordError: ``where`` and the problem: a key given twice, not a JSON object, a foreign
            record (another op, chip or schema version) or a malformed one; NotJsonLine for a
            line that does not parse.
    """
    try:
        obj = json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise RecordError(f"{where}: key {exc.args[0]!r} given twice in one record (JSON keeps "
                          f"the last silently); fix or remove the line") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested past the parser's depth
        raise NotJsonLine(f"{where}: not a JSON line ({exc})") from None
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: expected a JSON object, got {obj!r}")
    found = {k: obj.get(k) for k in ("schema", "op", "chip")}
    if found != {"schema": SCHEMA, "op": op, "chip": chip}:
        raise RecordError(f"{where}: foreign record {found!r}; this file holds schema {SCHEMA}, "
                          f"op {op!r}, chip {chip!r}")
    cls = _CLASSES.get(obj.get("kind"))
    if cls is None:
        raise RecordError(f"{where}: kind: expected one of {list(_CLASSES)}, got {obj.get('kind')!r}")
    return cls.from_json(obj, where)


def append(path: Path, records: Iterable[Record]) -> int:
    """Append records, one line each, under an exclusive lock, then flush and fsync.

    A torn last line left by a killed writer is cut first, so it never becomes a malformed middle line.

    Returns:
        How many torn lines were dropped (0 or 1).

    Raises:
        RecordError: if a record's op or chip differs from the file's (``<chip>/<op>.jsonl``).
    """
    records = list(records)
    for rec in records:
        if (rec.op, rec.chip) != (path.stem, path.parent.name):
            raise RecordError(f"{path}: cannot append a record of op {rec.op!r}, chip {rec.chip!r}")
    if not records:
        return 0
    payload = "".join(rec.line() + "\n" for rec in records).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            dropped = _mend_tail(f)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return dropped


def append_missing(path: Path, records: Iterable[Record]) -> int:
    """Append, in order, the records whose line the file does not hold yet, under the same lock
    as :func:`append` (so exports from several places add each record once).

    Returns:
        How many records were appended.
    """
    records = list(records)
    for rec in records:
        if (rec.op, rec.chip) != (path.stem, path.parent.name):
            raise RecordError(f"{path}: cannot append a record of op {rec.op!r}, chip {rec.chip!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            _mend_tail(f)
            f.seek(0)
            held = set(f.read().decode("utf-8").splitlines())
            new = [line for line in dict.fromkeys(rec.line() for rec in records) if line not in held]
            f.seek(0, os.SEEK_END)
            f.write("".join(line + "\n" for line in new).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return len(new)


def _mend_tail(f: BinaryIO) -> int:
    """Under the lock: end the file with a newline, cutting a torn (non-JSON) last line."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return 0
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return 0
    f.seek(0)  # rare (after a crash): read it all
    data = f.read()
    start = data.rfind(b"\n") + 1
    try:
        json.loads(data[start:])
    except ValueError:
        os.ftruncate(f.fileno(), start)
        return 1
    f.write(b"\n")
    return 0


# --- winners ---------------------------------------------------------------------------------
def latest_measure_runs(records: Iterable[Record]) -> dict[Key, tuple[MeasureRecord, ...]]:
    """For each key measured, the measure records of its latest run (the run of its last measure
    record in file order), in file order: only the records of one run compare."""
    by_key: dict[Key, list[MeasureRecord]] = {}
    for rec in records:
        if isinstance(rec, MeasureRecord):
            by_key.setdefault(rec.key, []).append(rec)
    return {key: tuple(r for r in recs if r.run == recs[-1].run) for key, recs in by_key.items()}


def latest_winners(records: Iterable[Record]) -> dict[Key, WinnerRecord]:
    """For each key, the last winner in file order."""
    out: dict[Key, WinnerRecord] = {}
    for rec in records:
        if isinstance(rec, WinnerRecord):
            out[rec.key] = rec
    return out
