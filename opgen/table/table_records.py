"""The tuning records as the table reads them: read after those of the chip they inherit from,
keyed as the spec buckets their cases now (:func:`rekeyed`), and each key's winner in force
(:func:`held_winners`), fresh or stale (:func:`split_winners`), or held back for the measure step
(:func:`pending_winners`), each point completed by the tunables the spec added since where its
variant fixes them (:func:`completed`). :func:`once` and :func:`records_key` keep what is computed
from a records file while the file is unchanged.
Uses ``bucket_shapes``, ``case_checks``, ``errors``, ``fill_measured``, ``fits``, ``hardware``,
``keys``, ``records``, ``space``, ``spec``, ``spec_values``, ``table_rows``.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from ..errors import BudgetError, ExprError, RecordError, SpecError
from ..space.case_checks import failing_check
from ..space.space import constraint_failed, find_variant, fixed_values, is_legal, parse_point_name, point_id
from ..spec.hardware import ChipProfile, figures
from ..spec.keys import Key, key_of, key_text
from ..spec.spec import OpSpec
from ..spec.spec_values import value_kinds
from ..storage.records import MeasureRecord, Record, RecordFile, TrialRecord, WinnerRecord, read, read_paths
from .bucket_shapes import case_params, low_params, plain_fields
from .fill_measured import measured_choice
from .fits import _fits
from .table_rows import StaleWinner

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


def fresh_winners(spec: OpSpec, chip: ChipProfile, path: Path,
                  kernel_hashes: Mapping[str, str]) -> dict[Key, WinnerRecord]:
    """The winners in force at ``path`` that :func:`frozen_rows` freezes, by key (none without a file)."""
    if not any(p.exists() for p, _ in read_paths(path, chip)):
        return {}
    return split_winners(spec, chip, path, read_keyed(spec, chip, path).records, kernel_hashes)[0]


def read_keyed(spec: OpSpec, chip: ChipProfile, path: Path) -> RecordFile:
    """The records of ``spec`` on ``chip`` at ``path``, after those of the chip it inherits from
    (:func:`opgen.storage.records.read_paths`), keyed as the spec buckets their cases now."""
    return read_keyed_moved(spec, chip, path)[0]


def read_keyed_moved(spec: OpSpec, chip: ChipProfile, path: Path) -> tuple[RecordFile, dict[int, Key]]:
    """:func:`read_keyed`, and the key each record it re-keyed was stored under (by the ``id``
    of the record returned)."""
    found = [read(p, op=spec.op, chip=name) for p, name in read_paths(path, chip)]
    stored = tuple(r for f in found for r in f.records)
    keyed = completed(spec, chip, rekeyed(spec, stored))
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
                keys[case] = key_of(spec, case_params(spec, rec.case, "case"))
            except RecordError:
                keys[case] = None
        key = keys[case]
        out.append(rec if key is None or key == rec.key else dataclasses.replace(rec, key=key))
    return tuple(out)


def completed(spec: OpSpec, chip: ChipProfile, records: Iterable[Record]) -> tuple[Record, ...]:
    """``records`` with each point (a cross-check's fill point, a winner's re-measured point names)
    completed by the chip's tunables it lacks where its variant fixes them, at their value for the
    record's case: a tunable added for another variant changes nothing this one ran, so its
    records stay in force. A point that lacks a tunable its variant searches is left as it is
    (stale where a winner)."""
    names = spec.tunables_for(chip.backend)
    out = []
    for rec in records:
        new: dict[str, Any] = {"point": _completed(spec, names, rec.variant, rec.point, rec.case)}
        if hasattr(rec, "fill_point"):
            new["fill_point"] = _completed(spec, names, rec.fill_variant, rec.fill_point, rec.case)
        if hasattr(rec, "remeasured_ms") and new["point"] is not rec.point:
            new["remeasured_ms"] = {_completed_name(spec, names, name, rec.case): ms
                                    for name, ms in rec.remeasured_ms.items()}
        changed = {k: v for k, v in new.items() if v is not getattr(rec, k)}
        out.append(dataclasses.replace(rec, **changed) if changed else rec)
    return tuple(out)


def _completed_name(spec: OpSpec, names: Iterable[str], name: str, case: Mapping[str, Any]) -> str:
    """A point's name as records keep it (``Point.name``), with the tunables :func:`_completed`
    adds appended."""
    variant, values = parse_point_name(name)
    full = _completed(spec, names, variant, values, case)
    return name + "".join(f",{k}={v}" for k, v in full.items() if k not in values)


def _completed(spec: OpSpec, names: Iterable[str], variant: str, point: dict[str, Any],
               case: Mapping[str, Any]) -> dict[str, Any]:
    """``point`` with the tunables of ``names`` it lacks that ``variant`` fixes (``point`` itself
    where none is missing or the variant, the case or a fixed value does not evaluate)."""
    missing = [n for n in names if n not in point]
    if not missing:
        return point
    try:
        fixed = fixed_values(spec, find_variant(spec, variant), case_params(spec, case, "case"))
    except (SpecError, ExprError, RecordError):
        return point
    if not all(n in fixed for n in missing):
        return point
    return {**point, **{n: fixed[n] for n in missing}}


def pending_winners(spec: OpSpec, chip: ChipProfile, path: Path, records: Iterable[Record],
                    kernel_hashes: Mapping[str, str]) -> dict[Key, WinnerRecord]:
    """The winners held back from untuned keys the measure step had measured: a search that
    never faced the point measured fastest there (a search over some variants alone, say) found
    the best of what it searched, not the bucket's best. Such a winner, on its current kernel,
    is one more candidate of the measure step, on its own key too (:func:`opgen.table.fill_measured.fill_measured`). The
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
    key's measure runs found fastest, as the measured fill takes it (:func:`opgen.table.fill_measured.measured_choice`),
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
            measured_best = measured_choice(timed.get(rec.key, {}), latest.get(rec.key))
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
        params = case_params(spec, rec.case, _describe(path, rec))
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
        params = case_params(spec, rec.case, _describe(path, rec))
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


def _describe(path: Path, rec: WinnerRecord) -> str:
    return f"{path}: winner {rec.variant} for key {rec.key} (study {rec.study!r}, {rec.date})"


def _stale_reason(spec: OpSpec, chip: ChipProfile, rec: WinnerRecord, params: Mapping[str, Any],
                  kernel_hashes: Mapping[str, str]) -> str | None:
    current = kernel_hashes.get(rec.variant)
    if current is None:
        return f"variant {rec.variant} has no {chip.rendering} kernel now"
    if current != rec.kernel_hash:
        return f"kernel changed: tuned {rec.kernel_hash}, now {current}"
    problem = _case_problem(spec, rec.case, params)
    if problem is not None:
        return problem
    tunables = spec.tunables_for(chip.backend)
    if set(rec.point) != set(tunables):
        return f"its tunables {sorted(rec.point)} are not the spec's {sorted(tunables)}"
    return _point_problem(spec, chip, rec, params)


def _case_problem(spec: OpSpec, case: Mapping[str, Any], params: Mapping[str, Any]) -> str | None:
    """Why a winner's case is no call the op takes (a field it has no input for, a scalar outside
    its choices, a size below 1, a failed check), or None."""
    kinds = value_kinds(spec)
    unknown = sorted(set(case) - set(kinds))
    if unknown:
        return f"its case names {unknown}, no input of {spec.op}"
    for name, value in case.items():
        choices = spec.signature.scalars[name].choices if name in spec.signature.scalars else None
        if choices is not None and value not in choices:
            return f"its case's {name} {value!r} is not among its choices"
        if name in spec.dim_symbols() and not (isinstance(value, int) and value >= 1):
            return f"its case's {name} {value!r} is no size"
    failed = failing_check(spec, params)
    if failed is not None:
        return f"its case fails checks.{failed[0]} ({failed[1].rule.source})"
    return None


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
