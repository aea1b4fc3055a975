"""Tuning records: JSON lines of measured trials and decided winners, and the rows frozen from them.

One file per op and chip, ``records/<chip>/<op>.jsonl``, tracked in git and read by ``opgen build``.
Each line is one record (schema version :data:`SCHEMA`, keys sorted, compact separators) carrying
its full key: op, chip, toolchain, the kernel's content hash, the dispatch key and the case row.
Writers append under an exclusive ``flock`` with flush and fsync; readers skip a torn last line and
count it, refuse a malformed line elsewhere and refuse a record of another op, chip or schema
(optuna ``journal/_file.py``; Kernel Tuner ``process_cache``). No clock, no device: dates come from
the caller. Uses ``errors``, ``expr``, ``hardware``, ``spec``, ``space``.
"""
from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO, Callable, ClassVar, Iterable, Mapping, NamedTuple

from .errors import BudgetError, ExprError, RecordError, SpecError
from .expr import is_finite_number
from .hardware import ChipProfile
from .space import budget_bytes, case_inputs, find_variant, is_legal
from .spec import KeyField, OpSpec

SCHEMA = 1
"""Version of the line format; a line of any other version is a foreign record."""

STATUSES = ("ok", "compile_error", "crash", "timeout", "wrong_result", "over_budget")
BUDGET_KINDS = ("ub_bytes", "smem_bytes")
Key = tuple[Any, ...]
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


# --- field converters: check a JSON (or Python) value, return its stored form -----------------
Conv = Callable[[Any], Any]


def _check(test: Callable[[Any], bool], expected: str, out: Conv = lambda v: v) -> Conv:
    """A converter: ``out(v)`` if ``test(v)``, else a RecordError saying what was expected."""
    def convert(v: Any) -> Any:
        if not test(v):
            raise RecordError(f"expected {expected}, got {v!r}")
        return out(v)
    return convert


def _opt(conv: Conv) -> Conv:
    return lambda v: None if v is None else conv(v)


def _one_of(*choices: str) -> Conv:
    return _check(lambda v: v in choices, f"one of {list(choices)}")


def _tuple_of(conv: Conv) -> Conv:
    return _check(lambda v: isinstance(v, (list, tuple)), "a list", lambda v: tuple(map(conv, v)))


def _dict_of(conv: Conv) -> Conv:
    return _check(lambda v: isinstance(v, Mapping) and all(isinstance(k, str) for k in v),
                  "an object with string keys", lambda v: {k: conv(x) for k, x in v.items()})


_str = _check(lambda v: isinstance(v, str), "a string")
_int = _check(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
_num = _check(is_finite_number, "a finite number", float)
_scalar = _check(lambda v: isinstance(v, (str, bool, int)) or is_finite_number(v),
                 "a string, boolean or finite number")
_date = _check(lambda v: isinstance(v, str) and bool(_DATE.match(v)), "a date YYYY-MM-DD")


@dataclass(frozen=True)
class Budget:
    """On-chip bytes of a point: the spec's estimate and, where the toolchain reports it, the real figure."""

    kind: str
    estimate: int
    reported: int | None = None

    def __post_init__(self) -> None:
        _one_of(*BUDGET_KINDS)(self.kind)
        _int(self.estimate)
        _opt(_int)(self.reported)


_budget = _check(
    lambda v: v is None or isinstance(v, Budget)
    or (isinstance(v, Mapping) and set(v) == {"kind", "estimate", "reported"}),
    "null or an object with keys estimate, kind, reported",
    lambda v: v if v is None or isinstance(v, Budget) else Budget(**v))


def _plain(v: Any) -> Any:
    """The JSON form of a stored field value."""
    if isinstance(v, Budget):
        return {"kind": v.kind, "estimate": v.estimate, "reported": v.reported}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


# --- records ---------------------------------------------------------------------------------
_COMMON: dict[str, Conv] = dict(
    op=_str, chip=_str, toolchain=_dict_of(_str), kernel_hash=_str, key=_tuple_of(_scalar),
    case=_dict_of(_scalar), variant=_str, point=_dict_of(_scalar), study=_str, date=_date)


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

    KIND: ClassVar[str] = ""
    CONVERT: ClassVar[dict[str, Conv]] = {}

    def __post_init__(self) -> None:
        for name, conv in self.CONVERT.items():
            try:
                value = conv(getattr(self, name))
            except RecordError as exc:
                raise RecordError(f"{self.KIND} record: {name}: {exc}") from None
            object.__setattr__(self, name, value)  # stored form: tuples, fresh dicts, floats

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object, with ``schema`` and ``kind``."""
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
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
            if set(data) != names:
                raise RecordError(f"{cls.KIND} record: missing keys {sorted(names - set(data))}, "
                                  f"unknown keys {sorted(set(data) - names)}")
            return cls(**{name: data[name] for name in cls.CONVERT})
        except RecordError as exc:
            raise RecordError(f"{where}: {exc}") from None


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
        _COMMON, trial=_int, status=_one_of(*STATUSES), reason=_str, median_ms=_opt(_num),
        times_ms=_tuple_of(_num), error=_dict_of(_opt(_num)), budget=_budget)

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
        _COMMON, median_ms=_num, remeasured_ms=_dict_of(_num), margin=_opt(_num),
        error=_dict_of(_opt(_num)), budget=_budget)


Record = TrialRecord | WinnerRecord
_CLASSES: dict[str, type[_Record]] = {"trial": TrialRecord, "winner": WinnerRecord}


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


@dataclass(frozen=True)
class RecordFile:
    """What :func:`read` found: the records in file order and how many torn last lines it skipped."""

    path: Path
    records: tuple[Record, ...]
    torn: int


def read(path: Path, *, op: str, chip: str) -> RecordFile:
    """Read a record file; a missing file has no records.

    Raises:
        RecordError: ``path:line`` on a malformed line (other than a torn last line) or a
            foreign record (another op, chip or schema version).
    """
    if not path.exists():
        return RecordFile(path, (), 0)
    data = path.read_bytes()
    lines = data.split(b"\n")
    if not lines[-1]:
        lines.pop()  # the file ends with a newline (or is empty)
    out: list[Record] = []
    torn = 0
    for n, raw in enumerate(lines, 1):
        where = f"{path}:{n}"
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            if n == len(lines) and not data.endswith(b"\n"):
                torn = 1  # a writer died mid-line: skipped, counted, cut by the next append
                continue
            raise RecordError(f"{where}: not a JSON line ({exc})") from None
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: expected a JSON object, got {obj!r}")
        found = {k: obj.get(k) for k in ("schema", "op", "chip")}
        if found != {"schema": SCHEMA, "op": op, "chip": chip}:
            raise RecordError(f"{where}: foreign record {found!r}; this file holds schema {SCHEMA}, "
                              f"op {op!r}, chip {chip!r}")
        cls = _CLASSES.get(obj.get("kind"))
        if cls is None:
            raise RecordError(f"{where}: kind: expected one of {list(_CLASSES)}, got {obj.get('kind')!r}")
        out.append(cls.from_json(obj, where))
    return RecordFile(path, tuple(out), torn)


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


# --- keys and winners ------------------------------------------------------------------------
def bucket_index(value: Any, edges: tuple[int, ...]) -> int:
    """Index of the first edge >= value; ``len(edges)`` past the last (the generated ``_bucket``)."""
    return next((i for i, edge in enumerate(edges) if value <= edge), len(edges))


def _field(field: Any) -> tuple[Any, tuple[int, ...] | None]:
    return (field.expr, field.buckets) if isinstance(field, KeyField) else (field, None)


def key_of(spec: OpSpec, params: Mapping[str, Any]) -> Key:
    """The dispatch key of one shape's params, in ``spec.dispatch.key`` order."""
    out = []
    for field in spec.dispatch.key.values():
        expr, edges = _field(field)
        value = expr.evaluate(params)
        out.append(value if edges is None else bucket_index(value, edges))
    return tuple(out)


def sort_key(key: Key) -> tuple[tuple[str, Any], ...]:
    """A total order over keys of mixed element types (bool, int, str) that never compares types."""
    return tuple((type(v).__name__, v) for v in key)


def latest_winners(records: Iterable[Record]) -> dict[Key, WinnerRecord]:
    """For each key, the last winner in file order."""
    out: dict[Key, WinnerRecord] = {}
    for rec in records:
        if isinstance(rec, WinnerRecord):
            out[rec.key] = rec
    return out


# --- freezing --------------------------------------------------------------------------------
class Row(NamedTuple):
    """One table row: the key, the chosen variant, its tunables in declaration order, a comment."""

    key: Key
    variant: str
    point: dict[str, Any]
    comment: str


@dataclass(frozen=True)
class StaleWinner:
    """A latest winner that is not frozen, and why (its kernel or the spec changed since tuning)."""

    record: WinnerRecord
    reason: str


@dataclass(frozen=True)
class FrozenTable:
    """Rows sorted by key (filled rows included), stale winners sorted by key, torn lines skipped."""

    rows: tuple[Row, ...]
    stale: tuple[StaleWinner, ...]
    filled: int
    torn: int


def _params(spec: OpSpec, case: Mapping[str, Any], where: str,
            override: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Params of a case row, with ``override`` replacing inputs or params by name."""
    override = override or {}
    try:
        env = {**case_inputs(spec, case), **override}
        for name, expr in spec.params.items():
            env[name] = override[name] if name in override else expr.evaluate(env)
    except (SpecError, ExprError) as exc:
        raise RecordError(f"{where}: case {dict(case)} does not evaluate: {exc}") from None
    return env


def _describe(path: Path, rec: WinnerRecord) -> str:
    return f"{path}: winner {rec.variant} for key {rec.key} (study {rec.study!r}, {rec.date})"


def _stale_reason(spec: OpSpec, chip: ChipProfile, rec: WinnerRecord, params: Mapping[str, Any],
                  kernel_hashes: Mapping[str, str]) -> str | None:
    current = kernel_hashes.get(rec.variant)
    if current is None:
        return f"variant {rec.variant} has no {chip.rendering} kernel now"
    if current != rec.kernel_hash:
        return f"kernel changed: tuned {rec.kernel_hash}, now {current}"
    key = key_of(spec, params)
    if key != rec.key:
        return f"the spec's dispatch key of its case is now {key}"
    tunables = spec.tunables_for(chip.backend)
    if set(rec.point) != set(tunables):
        return f"its tunables {sorted(rec.point)} are not the spec's {sorted(tunables)}"
    return None


def _fits(spec: OpSpec, chip: ChipProfile, variant_name: str, point: Mapping[str, Any],
          params: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether the variant is legal for ``params``, and whether the point fits the chip's budget."""
    variant = find_variant(spec, variant_name)
    used = budget_bytes(spec, variant, point, params, chip)
    return is_legal(spec, variant, params), used is None or used[1] <= chip.budget(used[0])


def _comment(rec: WinnerRecord) -> str:
    parts = [f"median {rec.median_ms:.4f} ms"]
    if rec.budget is not None:
        reported = "" if rec.budget.reported is None else f" (reported {rec.budget.reported})"
        parts.append(f"{rec.budget.kind} {rec.budget.estimate}{reported}")
    return ", ".join(parts + [f"tuned {rec.date}"])


def frozen_rows(spec: OpSpec, chip: ChipProfile, path: Path, kernel_hashes: Mapping[str, str],
                *, fill: bool = True) -> FrozenTable:
    """The table rows frozen from the records at ``path`` (none without a file).

    Each key's latest winner is frozen unless stale: its variant has no kernel in ``kernel_hashes``
    (variant name -> hash of the chip's rendering) or another hash, the spec now gives its case
    another key, or the spec's tunables changed. Stale winners are listed, never silently dropped.

    Args:
        fill: also fill untuned bucket combinations from the nearest tuned rows (:func:`fill_nearest`).

    Raises:
        RecordError: a malformed or foreign record, or a fresh winner illegal for its own case.
        BudgetError: a fresh winner over the chip's budget.
    """
    records = read(path, op=spec.op, chip=chip.name)
    fresh: dict[Key, WinnerRecord] = {}
    old: list[StaleWinner] = []
    for key, rec in latest_winners(records.records).items():
        params = _params(spec, rec.case, _describe(path, rec))
        reason = _stale_reason(spec, chip, rec, params, kernel_hashes)
        if reason is not None:
            old.append(StaleWinner(rec, reason))
            continue
        legal, fits = _fits(spec, chip, rec.variant, rec.point, params)
        if not legal:
            raise RecordError(f"{_describe(path, rec)} is not legal for its case {rec.case}")
        if not fits:
            raise BudgetError(f"{_describe(path, rec)} exceeds {chip.name}'s budget")
        fresh[key] = rec
    tunables = spec.tunables_for(chip.backend)
    rows = [Row(k, r.variant, {n: r.point[n] for n in tunables}, _comment(r)) for k, r in fresh.items()]
    filled = fill_nearest(spec, chip, fresh) if fill else []
    rows = sorted(rows + filled, key=lambda r: sort_key(r.key))
    old.sort(key=lambda s: sort_key(s.record.key))
    return FrozenTable(tuple(rows), tuple(old), len(filled), records.torn)


def stale(spec: OpSpec, chip: ChipProfile, path: Path,
          kernel_hashes: Mapping[str, str]) -> list[StaleWinner]:
    """The latest winners at ``path`` that :func:`frozen_rows` does not freeze, sorted by key."""
    return list(frozen_rows(spec, chip, path, kernel_hashes, fill=False).stale)


# --- nearest-bucket fill ---------------------------------------------------------------------
def _input_deps(spec: OpSpec, names: Iterable[str]) -> set[str]:
    """The inputs that ``names`` (inputs or params) are computed from."""
    out: set[str] = set()
    for name in names:
        out |= _input_deps(spec, spec.params[name].names) if name in spec.params else {name}
    return out


def _free_fields(spec: OpSpec) -> dict[int, str | None]:
    """Bucketed key positions that a fill may change: position -> plain name, or None.

    A plain-name field (``K``) is moved to a representative value of the target bucket. Another
    formula (``B * H * NT``) may change only if one of its inputs is read by no variant's ``when``:
    the target bucket is then reached through that input, which legality does not see.
    """
    when_inputs = _input_deps(spec, {n for options in spec.variants.axes.values()
                                     for o in options.values() for n in o.when.names})
    out: dict[int, str | None] = {}
    for i, field in enumerate(spec.dispatch.key.values()):
        expr, edges = _field(field)
        if not edges:
            continue
        if expr.names == (expr.source.strip(),):
            out[i] = expr.names[0]
        elif _input_deps(spec, expr.names) - when_inputs:
            out[i] = None
    return out


def fill_nearest(spec: OpSpec, chip: ChipProfile, tuned: Mapping[Key, WinnerRecord]) -> list[Row]:
    """Rows for untuned keys that differ from tuned ones only in bucketed fields.

    For each assignment of the categorical fields among ``tuned``, every combination of bucket
    indices without a row takes the nearest tuned row of that assignment (L1 distance over bucket
    indices, ties to the smaller buckets, then key order) whose variant is legal and within budget
    on a representative shape of the target: the source case with each moved plain-name field set
    to the bucket's upper edge (last edge + 1 past the last). A key with no such row stays
    unfilled (it takes the spec's default). Comments start ``from <source key>``.
    """
    fields_ = list(spec.dispatch.key.values())
    bucketed = [i for i, f in enumerate(fields_) if _field(f)[1]]
    if not bucketed or not tuned:
        return []
    free = _free_fields(spec)
    groups: dict[Key, list[Key]] = {}
    for key in tuned:
        groups.setdefault(tuple(v for i, v in enumerate(key) if i not in bucketed), []).append(key)
    counts = [len(_field(fields_[i])[1]) + 1 for i in bucketed]
    tunables = spec.tunables_for(chip.backend)
    rows: list[Row] = []
    for cat in sorted(groups, key=sort_key):
        for combo in itertools.product(*(range(n) for n in counts)):
            slots, rest = dict(zip(bucketed, combo)), iter(cat)
            target = tuple(slots[i] if i in slots else next(rest) for i in range(len(fields_)))
            if target in tuned:
                continue
            for src in sorted(groups[cat], key=_nearest(bucketed, target)):
                rec = tuned[src]
                if _fill_fits(spec, chip, rec, src, target, bucketed, free):
                    point = {n: rec.point[n] for n in tunables}
                    rows.append(Row(target, rec.variant, point, f"from {src!r}, {_comment(rec)}"))
                    break
    return rows


def _nearest(bucketed: list[int], target: Key) -> Callable[[Key], tuple[Any, ...]]:
    """Sort key of candidate source keys: L1 distance, then smaller buckets, then key order."""
    def order(src: Key) -> tuple[Any, ...]:
        dist = sum(abs(src[i] - target[i]) for i in bucketed)
        return dist, tuple(src[i] for i in bucketed), sort_key(src)
    return order


def _fill_fits(spec: OpSpec, chip: ChipProfile, rec: WinnerRecord, src: Key, target: Key,
               bucketed: list[int], free: Mapping[int, str | None]) -> bool:
    moved = [i for i in bucketed if src[i] != target[i]]
    if any(i not in free for i in moved):
        return False
    fields_ = list(spec.dispatch.key.values())
    override = {}
    for i in moved:
        name, edges = free[i], _field(fields_[i])[1]
        if name is not None:
            override[name] = edges[target[i]] if target[i] < len(edges) else edges[-1] + 1
    params = _params(spec, rec.case, f"fill of {target} from {src}", override)
    got = key_of(spec, params)
    unmoved = [i for i in range(len(target)) if not (i in moved and free[i] is None)]
    if any(got[i] != target[i] for i in unmoved):
        return False  # the representative shape lands on another key: it cannot stand for it
    legal, fits = _fits(spec, chip, rec.variant, rec.point, params)
    return legal and fits
