"""What ``opgen report`` shows of one op on one chip, as values read from the committed files alone
(no device): the benchmark runs that ``benchmarks/runs.yaml`` names (their ``opgen bench --json``
files), the on-chip budget of every frozen choice (the spec, the records, ``opgen explain``), the
tuning history of each study (the records' trials in file order, or an optuna storage) and the
tests that name the op (a static reading of ``tests/``).
Uses ``compare``, ``errors``, ``explain``, ``hardware``, ``kernels``, ``keys``, ``records``,
``spec``, ``storage``, ``table``, ``table_records``.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from ..errors import OpgenError, UsageError
from ..render.kernels import kernel_hashes
from ..spec.hardware import ChipProfile
from ..spec.keys import key_text
from ..spec.spec import OpSpec
from ..storage.records import TrialRecord, record_path
from ..storage.storage import open_storage, shown
from ..table.table import FrozenTable, frozen_rows
from ..table.table_records import read_keyed
from .compare import CaseResult, case_id, generated_hash, read_shards
from .explain import explain

RUNS = Path("benchmarks") / "runs.yaml"
"""The index of the committed benchmark runs and tuning campaigns, per chip and op."""

GOOD = 1.2
"""The speed-up a case should reach; the page counts the cases at or above it."""


# --- benchmark runs --------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchRun:
    """One benchmark table of the op against a baseline: its cases' results joined from the
    ``--json`` files of its shards, what it measured and how to run it again."""

    baseline: str
    cases: str
    commit: str | None
    command: str | None
    files: tuple[str, ...]
    table: str | None
    generated: str
    toolchain: dict[str, str]
    results: tuple[CaseResult, ...]
    where: str | None = None  # the formula the run's cases passed (``opgen bench --where``)

    @property
    def case_set(self) -> str:
        """The case set, with the formula that kept part of it."""
        return self.cases if self.where is None else f"{self.cases} where {self.where}"

    @property
    def speedups(self) -> list[float]:
        return [r.speedup for r in self.results]

    @property
    def geomean(self) -> float:
        return math.exp(sum(math.log(s) for s in self.speedups) / len(self.speedups))

    @property
    def worst(self) -> CaseResult:
        return min(self.results, key=lambda r: r.speedup)

    @property
    def good(self) -> int:
        """Cases at or above :data:`GOOD`."""
        return sum(s >= GOOD for s in self.speedups)

    @property
    def error_no_worse(self) -> int:
        """Cases whose error against the float64 golden is no larger than the baseline's."""
        return sum(r.ours_err <= r.base_err for r in self.results)


def runs_index(root: Path) -> dict[str, Any]:
    """``benchmarks/runs.yaml`` as data (empty without the file).

    Raises:
        OpgenError: naming the file for YAML that is not a mapping of chips.
    """
    path = root / RUNS
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise OpgenError(f"{path}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise OpgenError(f"{path}: expected a mapping chip -> op -> {{bench, tuning}}")
    return data


def _entries(root: Path, chip: str, op: str, part: str) -> list[dict[str, Any]]:
    """The ``part`` list (``bench`` or ``tuning``) of ``op`` on ``chip`` in the index."""
    found = (runs_index(root).get(chip) or {}).get(op) or {}
    entries = found.get(part) or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise OpgenError(f"{root / RUNS}: {chip}.{op}.{part}: expected a list of mappings")
    return entries


def bench_runs(root: Path, spec: OpSpec, chip: ChipProfile) -> list[BenchRun]:
    """The benchmark runs of ``spec`` on ``chip`` that the index names, each joined from its JSON
    files in the case set's order.

    Raises:
        OpgenError: naming the index or a JSON file that lacks a field, holds another op, baseline
            or case set, or whose shards do not join (:func:`opgen.evidence.compare.read_shards`).
    """
    out = []
    for i, entry in enumerate(_entries(root, chip.name, spec.op, "bench")):
        where = f"{root / RUNS}: {chip.name}.{spec.op}.bench[{i}]"
        missing = [k for k in ("baseline", "cases", "json") if not entry.get(k)]
        if missing:
            raise OpgenError(f"{where}: missing {', '.join(missing)}")
        if entry["baseline"] not in spec.baselines or entry["cases"] not in spec.cases:
            raise OpgenError(f"{where}: baseline {entry['baseline']!r} and case set {entry['cases']!r} must be "
                             f"among the spec's ({sorted(spec.baselines)}; {sorted(spec.cases)})")
        files = [root / "benchmarks" / f for f in entry["json"]]
        for f in files:
            head = _json_head(f)
            for name in ("op", "baseline", "cases", "where"):
                want = spec.op if name == "op" else entry.get(name)
                if name in head and head[name] != want:
                    raise OpgenError(f"{f}: {name} {head[name]!r}, but {where} says {want!r}")
        rows = spec.expand_cases(entry["cases"], where=entry.get("where"))
        results, toolchain, generated = read_shards(rows, files)
        out.append(BenchRun(entry["baseline"], entry["cases"], _text(entry.get("commit")),
                            _text(entry.get("command")), tuple(entry["json"]), entry.get("table"),
                            generated, toolchain, tuple(results), entry.get("where")))
    return out


def _json_head(path: Path) -> dict[str, Any]:
    """The fields of a bench JSON file other than its results (none for a file that is no JSON
    object: :func:`opgen.evidence.compare.read_shards` names that problem)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if k != "results"} if isinstance(data, dict) else {}


def _text(value: Any) -> str | None:
    return None if value is None else " ".join(str(value).split())


def tuning_campaigns(root: Path, chip: ChipProfile, spec: OpSpec) -> list[tuple[str, str | None]]:
    """The index's campaigns behind the records: (commit, command or None), oldest first."""
    return [(str(e.get("commit")), _text(e.get("command"))) for e in _entries(root, chip.name, spec.op, "tuning")]


# --- budget headroom -------------------------------------------------------------------------
@dataclass(frozen=True)
class Headroom:
    """The on-chip estimate of one frozen choice against the chip's budget, at one case: a tuned
    row at the case it was tuned on, or the row (filled, or the spec's default) a benchmark case
    runs where its bucket has no tuned row."""

    case: dict[str, Any]
    bucket: str
    row: str
    variant: str
    config: dict[str, Any]
    kind: str
    limit: int
    estimate: dict[str, int]
    reported: int | None = None
    flags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The case (and its true flags that not every entry shares) and the variant."""
        flags = "".join(f" +{f.removesuffix('_given')}" for f in self.flags)
        return f"{case_id(self.case)}{flags} {self.variant}"

    @property
    def worst(self) -> int:
        """The largest kernel's estimate, in bytes."""
        return max(self.estimate.values())

    @property
    def used(self) -> float:
        """The largest kernel's estimate as a fraction of the budget."""
        return self.worst / self.limit


def headroom(root: Path, spec: OpSpec, chip: ChipProfile, table: FrozenTable,
             cases: Iterable[Mapping[str, Any]], hashes: Mapping[str, str]) -> list[Headroom]:
    """Each tuned row of ``table`` (frozen with the kernel ``hashes``) at its winner's case, then
    each of ``cases`` whose bucket has no tuned row (what the table fills it with, or the spec's
    default), once per bucket."""
    out: list[Headroom] = []
    seen: set[tuple] = set()
    tuned = [r.winner.case for r in table.rows if r.source is None]
    order = {name: i for i, name in enumerate(_case_order(spec))}
    for case in [*tuned, *cases]:
        result = explain(root, spec, chip, case, table=table, hashes=hashes)
        if "refused" in result or "budget" not in result or tuple(result["key"]) in seen:
            continue
        seen.add(tuple(result["key"]))
        budget = result["budget"]
        compiler = (result.get("winner") or {}).get("compiler") or {}
        case = dict(sorted(case.items(), key=lambda kv: order.get(kv[0], len(order))))
        out.append(Headroom(case, result["bucket"], result["row"], result["variant"], result["config"],
                            budget["kind"], budget["limit"], dict(budget["estimate"]),
                            compiler.get("reported") if result["row"] == "tuned" else None))
    flags = [{k for k, v in e.case.items() if v is True} for e in out]
    common = set.intersection(*flags) if flags else set()
    return [dataclasses.replace(e, flags=tuple(sorted(f - common))) for e, f in zip(out, flags)]


def _case_order(spec: OpSpec) -> list[str]:
    """The order of a case row's names as the spec's case sets write them (the order of the case
    ids of ``opgen bench``), then the dims."""
    first = [list(rows[0]) for rows in spec.cases.values() if rows]
    return list(dict.fromkeys([*(first[0] if first else []), *spec.dim_symbols()]))


# --- tuning history --------------------------------------------------------------------------
@dataclass(frozen=True)
class Study:
    """One study's trials in the order it measured them: each one's median (None where the point
    failed, timed out or was refused) and status."""

    name: str
    variant: str
    bucket: str
    current: bool
    medians: tuple[float | None, ...]
    statuses: tuple[str, ...] = field(default=())

    @property
    def best_so_far(self) -> list[float | None]:
        """The lowest median up to each trial (None before the first measured one)."""
        out: list[float | None] = []
        best: float | None = None
        for m in self.medians:
            if m is not None and (best is None or m < best):
                best = m
            out.append(best)
        return out

    @property
    def best(self) -> float | None:
        return self.best_so_far[-1] if self.medians else None


def studies_from_records(spec: OpSpec, chip: ChipProfile, path: Path,
                         hashes: Mapping[str, str]) -> list[Study]:
    """The studies of the records at ``path``, rebuilt from their trial records: trials of the
    search (trial number >= 0) in file order, one series per study and flush (times of the two
    flushes do not compare). ``current``: the study measured the variant's current kernel."""
    found: dict[tuple[str, str], list[TrialRecord]] = {}
    for rec in read_keyed(spec, chip, path).records:  # keyed as the spec buckets their cases now
        if isinstance(rec, TrialRecord) and rec.trial >= 0:
            found.setdefault((rec.study, rec.flush), []).append(rec)
    return [_study(spec, f"{name} ({flush}-flush)", trials, hashes)
            for (name, flush), trials in found.items()]


def _study(spec: OpSpec, name: str, trials: list[TrialRecord], hashes: Mapping[str, str]) -> Study:
    first = trials[0]
    return Study(name, first.variant, key_text(spec, first.key), hashes.get(first.variant) == first.kernel_hash,
                 tuple(t.median_ms if t.status == "ok" else None for t in trials),
                 tuple(t.status for t in trials))


def studies_from_storage(spec: OpSpec, chip: ChipProfile, storage: str,
                         hashes: Mapping[str, str]) -> list[Study]:
    """The studies of ``spec`` on ``chip`` in an optuna storage (an RDB URL or a journal file, as
    ``opgen tune --storage`` takes it): complete trials' values in trial-number order, others None;
    ``current`` where the study's name carries the variant's current kernel hash.

    Raises:
        UsageError: for a storage that cannot be opened.
    """
    import optuna

    try:
        handle = open_storage(storage)
        names = optuna.study.get_all_study_names(handle)
    except Exception as exc:  # optuna raises many kinds for a bad URL or file
        raise UsageError(f"--storage {shown(storage)}: cannot read it as an optuna storage ({exc})") from None
    out = []
    for name in sorted(names):
        parts = name.split("|")
        if len(parts) < 4 or parts[0] != spec.op or parts[3] != chip.name:
            continue
        trials = sorted(optuna.load_study(study_name=name, storage=handle).trials, key=lambda t: t.number)
        done = optuna.trial.TrialState.COMPLETE
        kernel = next((p.removeprefix("kernel=") for p in parts if p.startswith("kernel=")), None)
        out.append(Study(name, parts[1], parts[2], kernel is not None and hashes.get(parts[1]) == kernel,
                         tuple(t.value if t.state == done and t.value is not None else None for t in trials),
                         tuple(t.state.name.lower() for t in trials)))
    return out


# --- tests -----------------------------------------------------------------------------------
def tests_naming(root: Path, op: str) -> dict[str, list[str]]:
    """Per test file under ``tests/``, its test functions that name ``op``: the function (its
    decorators and body) holds a string naming it, or uses a module-level name (an import, a
    constant, a helper, a fixture of that file) whose definition names it, directly or through
    other such names; every function of a file whose name names it. A parametrized function
    counts once; fixtures of ``conftest.py`` are not followed."""
    out: dict[str, list[str]] = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        defs: dict[str, ast.AST] = {}
        for node in tree.body:
            for name in _bound(node):
                defs[name] = node
        memo: dict[str, bool] = {}

        def names_op(node: ast.AST, stack: frozenset[str] = frozenset()) -> bool:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and op in sub.value:
                    return True
                if isinstance(sub, ast.alias) and op in sub.name:
                    return True
                if isinstance(sub, ast.ImportFrom) and op in (sub.module or ""):
                    return True
            for name in _used(node) & set(defs) - stack:
                if name not in memo:
                    memo[name] = names_op(defs[name], stack | {name})
                if memo[name]:
                    return True
            return False

        tests = [(n, None) for n in tree.body if _is_test(n)]
        tests += [(m, n.name) for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")
                  for m in n.body if _is_test(m)]
        hits = [f"{cls}.{fn.name}" if cls else fn.name for fn, cls in tests
                if op in path.name or names_op(fn, frozenset({fn.name}))]
        if hits:
            out[path.relative_to(root).as_posix()] = hits
    return out


def _is_test(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")


def _bound(node: ast.AST) -> list[str]:
    """The module-level names a statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _used(node: ast.AST) -> set[str]:
    """The names a definition reads, its arguments included (pytest passes fixtures by name)."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names |= {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
    return names


# --- all of it -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReviewData:
    """Everything the page shows, as values."""

    spec: OpSpec
    chip: ChipProfile
    records: Path
    table: FrozenTable
    runs: list[BenchRun]
    campaigns: list[tuple[str, str | None]]
    headroom: list[Headroom]
    studies: list[Study]
    storage: str | None
    tests: dict[str, list[str]]
    generated_now: str


def gather(root: Path, spec: OpSpec, chip: ChipProfile, storage: str | None = None) -> ReviewData:
    """Read what the page shows of ``spec`` on ``chip``.

    Raises:
        UsageError: when the project holds neither records nor benchmark runs of the op on the chip.
    """
    if storage and "://" not in storage and not Path(storage).is_file():
        raise UsageError(f"--storage {storage}: no such journal file (or give an RDB URL)")
    path = record_path(root, chip.name, spec.op)
    runs = bench_runs(root, spec, chip)
    if not path.exists() and not runs and storage is None:
        raise UsageError(f"nothing to report for {spec.op} on {chip.name}: no {path.relative_to(root)} "
                         f"and no benchmark run of it in {RUNS}")
    hashes = kernel_hashes(root, spec, chip.rendering)
    # the storage first: one that cannot be read is named before the table is frozen
    studies = studies_from_storage(spec, chip, storage, hashes) if storage else studies_from_records(spec, chip, path, hashes)
    table = frozen_rows(spec, chip, path, hashes)
    cases = [row for run in runs for row in spec.expand_cases(run.cases, where=run.where)]
    return ReviewData(spec, chip, path, table, runs, tuning_campaigns(root, chip, spec),
                      headroom(root, spec, chip, table, cases, hashes), studies, storage,
                      tests_naming(root, spec.op), generated_hash(root, spec.op))
