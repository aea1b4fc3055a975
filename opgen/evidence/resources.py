"""``opgen resources``: what the compiler says of the kernels a frozen table launches, on a host
without the chip.

The kernels: each distinct choice of the chip's frozen table (variant and tunables, the tunables
its variant fixes taken at the shape) at the case its winner was measured on (a filled row runs
its source bucket's winner: that case), and the spec's default at each of those shapes; or, with
a case set, what the table runs on each of its cases. Each is recorded as the launches the
generated API makes (``opgen.evidence.launches``: constexprs, specialisation and launch options are a real
launch's), then:

- NVIDIA: compiled for the chip's target (``opgen.evidence.cuda_compile``: registers per thread, spill
  stores and loads, stack, shared memory, warps; cached on disk by Triton's compile key), and
  the blocks per multiprocessor those allow (:func:`occupancy`). Where the running Python's
  Triton lacks the NVIDIA backend (triton-ascend's), the compile step runs in a subprocess of a
  Python whose Triton has it (:func:`compile_python`).
- Ascend: the front end (``opgen.evidence.frontend``: TTIR -> Linalg, accepted or not) beside the spec's
  UB estimate; the compiler's UB figure (``required_ub_bits``) comes from BiShengIR, on an NPU.

:mod:`opgen.evidence.resource_checks` holds what is checked against the compiler beside: the
spill-free search and the spec's on-chip formula against the compiled shared memory. Uses ``table``, ``space``, ``spec``, ``records``, ``launches``,
``cuda_compile``, ``frontend``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import UnsupportedInput, UsageError
from ..render.kernels import kernel_hashes
from ..space.space import budget_parts, case_inputs, default_point, evaluate_params, find_variant, fixed_values
from ..spec.hardware import ChipProfile
from ..spec.spec import OpSpec
from ..storage.records import Budget, record_path
from ..table.table import FrozenTable, frozen_rows
from . import cuda_compile
from .cuda_compile import has_nvidia_backend, is_wgmma_fault_form
from .explain import explain
from .launches import record

REG_UNIT = 256
"""Registers are allocated a warp at a time, in units of this many (CUDA occupancy calculator, cc
7.0-9.0): a kernel of r registers per thread takes ceil(32 r / 256) * 256 per warp."""
CTA_RESERVED = 1024
"""Shared memory the system reserves per block (cc 8.0 and later), beside the kernel's own."""
CACHE = Path(".cache") / "opgen-resources"
"""Where the compiled figures are cached, under the project root (ignored by git)."""
PYTHON_ENV = "OPGEN_CUDA_PYTHON"
"""The environment variable naming a Python whose Triton has the NVIDIA backend."""


@dataclass(frozen=True)
class Entry:
    """One call to compile: a table's choice (``choice``), the spec's default at a choice's shape
    (``default``), what the table runs on a case of a case set (``case``) or a point of a
    variant's space drawn for the budget check (``sample``); the table rows it
    serves (choice) or at whose shape it stands (default); for a choice, the figures its winner
    record holds from the device."""

    role: str
    variant: str
    config: tuple[tuple[str, Any], ...]
    case: tuple[tuple[str, Any], ...]
    rows: int = 1
    record: Budget | None = None

    def job(self, spec: OpSpec, chip: ChipProfile) -> dict[str, Any]:
        """What the compile step takes: op, variant, config, case and the persistent grid's
        programs (the chip's cores times the point's occupancy, as the generated API launches)."""
        config = dict(self.config)
        return dict(op=spec.op, variant=self.variant, config=config, case=dict(self.case),
                    programs=chip.cores * int(config.get("occupancy", 1)))

    @property
    def same(self) -> tuple[Any, ...]:
        """What makes two entries one call."""
        return self.variant, self.config, self.case


def shape_params(spec: OpSpec, case: Mapping[str, Any]) -> dict[str, Any]:
    return evaluate_params(spec, case_inputs(spec, case))


def _at(spec: OpSpec, variant: str, config: Mapping[str, Any], params: Mapping[str, Any]) -> tuple:
    """The config as the generated API runs it at ``params``: the tunables the variant fixes taken there."""
    return tuple({**config, **fixed_values(spec, find_variant(spec, variant), params)}.items())


def table_entries(spec: OpSpec, chip: ChipProfile, table: FrozenTable) -> list[Entry]:
    """Each distinct choice of ``table`` at the case it was measured on (a tuned row's and a
    nearest fill's: its winner's, a measured fill's: the measure's), then the spec's default at
    each of those cases, in the order of the table's rows. A tuned row's entry holds its winner
    record's device figures (a filled row's winner record holds those of its source's case)."""
    choices: dict[tuple, Entry] = {}
    defaults: dict[tuple, Entry] = {}
    for row in table.rows:
        case_row = row.measured.case if row.measured is not None else row.winner.case
        case = tuple(case_row.items())
        params = shape_params(spec, case_row)
        record = row.winner.budget if row.source is None else None
        entry = Entry("choice", row.variant, _at(spec, row.variant, row.point, params), case, 1, record)
        held = choices.get(entry.same)
        choices[entry.same] = entry if held is None else replace(held, rows=held.rows + 1,
                                                                  record=held.record or record)
        point = default_point(spec, chip, params)
        entry = Entry("default", point.variant, point.values, case)
        held = defaults.get(entry.same)
        defaults[entry.same] = entry if held is None else replace(held, rows=held.rows + 1)
    return [*choices.values(), *defaults.values()]


def case_entries(root: Path, spec: OpSpec, chip: ChipProfile, table: FrozenTable,
                 rows: Iterable[Mapping[str, Any]]) -> list[Entry]:
    """What ``table`` runs on each case (its row for the case's key, or the spec's default), as
    ``opgen explain`` finds it; cases the op's checks refuse are left out."""
    out: dict[tuple, Entry] = {}
    for row in rows:
        found = explain(root, spec, chip, row, table)
        if "refused" in found:
            continue
        entry = Entry("case", found["variant"], tuple(found["config"].items()), tuple(row.items()))
        out.setdefault(entry.same, entry)
    return list(out.values())


def occupancy(chip: ChipProfile, regs: int, smem: int, warps: int) -> tuple[int, dict[str, int]]:
    """Blocks of a kernel one multiprocessor holds at once, and each limit: by registers (per
    warp, in units of :data:`REG_UNIT`), shared memory (with :data:`CTA_RESERVED` a block; none
    over the block's limit), threads, and the chip's block count."""
    per_warp = -(-regs * 32 // REG_UNIT) * REG_UNIT
    limits = {"regs": (chip.sm_registers // per_warp) // warps if per_warp else chip.sm_ctas,
              "smem": 0 if smem > chip.smem_bytes else chip.sm_smem_bytes // (smem + CTA_RESERVED),
              "threads": chip.sm_threads // (32 * warps), "ctas": chip.sm_ctas}
    return min(limits.values()), limits


# --- the compile step ---------------------------------------------------------------------------
def compile_python(root: Path, given: str | None = None) -> str | None:
    """The Python that compiles for NVIDIA: None where this one's Triton has the backend (the
    step runs in this process), else ``given``, ``$OPGEN_CUDA_PYTHON``, the project's
    ``.venv-descriptors`` or one beside this Python's venv (what ``scripts/descriptor_interpreter.sh``
    makes: upstream Triton 3.6 over the main venv's packages).

    Raises:
        UnsupportedInput: none of them exists.
    """
    if given is None and has_nvidia_backend():
        return None
    tried = [given] if given else [os.environ.get(PYTHON_ENV)] if os.environ.get(PYTHON_ENV) else []
    if not given:
        tried += [str(root / ".venv-descriptors" / "bin" / "python"),
                  str(Path(sys.prefix).parent / ".venv-descriptors" / "bin" / "python")]
    for path in tried:
        if Path(path).is_file():
            return path
    raise UnsupportedInput(f"no Python with Triton's NVIDIA backend: this one's Triton has none and none of "
                           f"{', '.join(tried)} exists; run scripts/descriptor_interpreter.sh (it makes "
                           f".venv-descriptors), or name one with --python or {PYTHON_ENV}")


def compile_jobs(root: Path, jobs: list[dict[str, Any]], cc: int, cache: Path, workers: int,
                 python: str | None, timeout: float | None = None) -> dict[str, Any]:
    """:func:`opgen.evidence.cuda_compile.compile_jobs` in this process (``python`` None) or in a
    subprocess of ``python``: ``{"target", "python", "results"}``.

    Raises:
        UnsupportedInput: the subprocess failed (its output's tail in the message).
    """
    if python is None:
        return {"target": cuda_compile.target_text(cc), "python": sys.executable,
                "results": cuda_compile.compile_jobs(root, jobs, cc, cache, workers, timeout)}
    with tempfile.TemporaryDirectory() as tmp:
        jobs_file, out_file = Path(tmp) / "jobs.json", Path(tmp) / "out.json"
        jobs_file.write_text(json.dumps(jobs))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # JIT kernels, compiled
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
        done = subprocess.run([python, "-m", "opgen.evidence.cuda_compile", str(jobs_file), str(out_file),
                               "--root", str(root), "--cc", str(cc), "--cache", str(cache), "--workers", str(workers),
                               *(["--timeout", str(timeout)] if timeout else [])],
                              cwd=root, env=env, stdout=subprocess.PIPE, stderr=None, text=True)
        if done.returncode or not out_file.is_file():
            raise UnsupportedInput(f"the compile step in {python} exited with {done.returncode}:\n"
                                   f"{done.stdout[-3000:]}")
        return json.loads(out_file.read_text())


def default_workers() -> int:
    """Processes for the compile step: the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cuda_resources(root: Path, spec: OpSpec, chip: ChipProfile, entries: list[Entry], workers: int,
                   python: str | None = None, cache: Path | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Every entry's kernels compiled for ``chip`` with their figures and occupancy (a kernel not
    compiled within ``timeout`` seconds: its error), and a summary."""
    if chip.compute_capability is None:
        raise UnsupportedInput(f"chip {chip.name}: no compute capability to compile for")
    python = compile_python(root, python)
    cache = cache or root / CACHE
    distinct: dict[tuple, dict[str, Any]] = {}
    for entry in entries:
        distinct.setdefault(entry.same, entry.job(spec, chip))
    answer = compile_jobs(root, list(distinct.values()), chip.compute_capability, cache, workers, python, timeout)
    results = dict(zip(distinct, answer["results"]))
    out = []
    for entry in entries:
        result = results[entry.same]
        item = _plain(entry)
        if "error" in result:
            item["error"] = result["error"]
        else:
            item["kernels"] = [_with_occupancy(chip, k) for k in result["kernels"]]
        out.append(item)
    return {"op": spec.op, "chip": chip.name, "target": answer["target"], "python": answer["python"],
            "cache": str(cache), "entries": out, "summary": summary(out)}


def _plain(entry: Entry) -> dict[str, Any]:
    out = {"role": entry.role, "variant": entry.variant, "config": dict(entry.config), "case": dict(entry.case),
           "rows": entry.rows}
    if entry.record is not None:
        out["record"] = entry.record.plain()
    return out


def _with_occupancy(chip: ChipProfile, kernel: dict[str, Any]) -> dict[str, Any]:
    if "error" in kernel:
        return kernel
    ctas, limits = occupancy(chip, kernel["regs"], kernel["smem"], kernel["num_warps"])
    return {**kernel, "ctas": ctas, "limits": limits}


def summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Distinct kernels (compiled now, from the cache, failed), those that spill, those of the
    wgmma fault form (``cuda_compile.is_wgmma_fault_form``), the most registers and shared memory,
    and the choices' agreement with the figures their winner records hold from the device (shared
    memory: the largest kernel's; registers)."""
    kernels: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    failed = [e for e in entries if "error" in e]
    for e in entries:
        for k in e.get("kernels", ()):
            kernels.setdefault(k["key"], (e, k))
    good = [(e, k) for e, k in kernels.values() if "error" not in k]
    spills = sorted(((e["variant"], k["name"], k["spill_stores"], k["spill_loads"]) for e, k in good
                     if k["spill_stores"] or k["spill_loads"]), key=lambda s: (-s[2], s[:2]))
    out: dict[str, Any] = {
        "kernels": len(kernels), "compiled": sum(not k["cached"] for _, k in kernels.values()),
        "cached": sum(bool(k["cached"]) for _, k in kernels.values()),
        "failed": len(kernels) - len(good) + len(failed), "spilling": len(spills),
        "spills": [dict(variant=v, kernel=n, stores=s, loads=lo) for v, n, s, lo in spills]}
    form = [dict(variant=e["variant"], kernel=k["name"], config=e["config"], wgmma=k["wgmma"],
                 wgmma_small=k["wgmma_small"]) for e, k in good if is_wgmma_fault_form(k)]
    out["wgmma_fault_form"] = {"kernels": len(form), "which": form}
    if good:
        e, k = max(good, key=lambda p: p[1]["regs"])
        out["max_regs"] = {"regs": k["regs"], "variant": e["variant"], "kernel": k["name"]}
        e, k = max(good, key=lambda p: p[1]["smem"])
        out["max_smem"] = {"smem": k["smem"], "variant": e["variant"], "kernel": k["name"]}
    agree = {"smem": [0, []], "regs": [0, []]}
    for e in entries:
        record, ks = e.get("record"), [k for k in e.get("kernels", ()) if "error" not in k]
        if record is None or not ks or len(ks) != len(e["kernels"]):
            continue
        for name, mine, theirs in (("smem", max(k["smem"] for k in ks), record.get("reported")),
                                   ("regs", max(k["regs"] for k in ks), record.get("regs"))):
            if theirs is None:
                continue
            if mine == theirs:
                agree[name][0] += 1
            else:
                agree[name][1].append({"variant": e["variant"], "config": e["config"], "case": e["case"],
                                       "compiled": mine, "record": theirs})
    out["records"] = {name: {"agree": n, "differ": differ} for name, (n, differ) in agree.items()}
    return out


# --- Ascend -------------------------------------------------------------------------------------
def npu_resources(root: Path, spec: OpSpec, chip: ChipProfile, entries: list[Entry]) -> dict[str, Any]:
    """Every entry's kernels through the Ascend front end (accepted or not), beside the spec's UB
    estimate: the compiler's own UB figure needs an NPU (BiShengIR)."""
    from .frontend import ascend_frontend  # imports triton: only for an Ascend chip

    out = []
    arch = chip.device_names[0] if chip.device_names else "Ascend910B3"
    for entry in entries:
        item = _plain(entry)
        params = shape_params(spec, dict(entry.case))
        parts = budget_parts(spec, find_variant(spec, entry.variant), dict(entry.config), params, chip)
        if parts is not None:
            item["budget"] = {"kind": parts[0], "limit": chip.budget(parts[0]), "estimate": parts[1],
                              "reported": None}
        try:
            launches = record(spec, "npu", entry.variant, dict(entry.config), dict(entry.case),
                              entry.job(spec, chip)["programs"])
        except Exception as exc:  # noqa: BLE001 - reported with the entry
            item["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
            out.append(item)
            continue
        item["kernels"] = []
        for launch in launches:
            values, options = launch.split()
            result = ascend_frontend(launch.kernel, values, arch=arch, options=options)
            item["kernels"].append({"name": launch.name, "accepted": result.accepted, "stage": result.stage,
                                    "message": result.message[:2000]})
        out.append(item)
    return {"op": spec.op, "chip": chip.name, "target": f"{arch}, triton-ascend front end (TTIR -> Linalg)",
            "entries": out, "note": "the compiler's UB figure (required_ub_bits) needs an NPU: BiShengIR "
                                    "reports it; the estimate is the spec's formula"}


# --- text ---------------------------------------------------------------------------------------
def values_text(pairs: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in pairs.items())


def kernel_text(report: Mapping[str, Any], name: str) -> str:
    return name.removeprefix(f"{report['op']}_")


def wgmma_text(kernel: Mapping[str, Any]) -> str:
    """A compiled kernel's warp-group dots and those with a dim of 16 or 32: ``n/small``."""
    return f"{kernel.get('wgmma', '?')}/{kernel.get('wgmma_small', '?')}"


def _head(e: Mapping[str, Any]) -> str:
    what = {"choice": f"choice ({e['rows']} rows)", "default": f"default ({e['rows']} rows' shape)",
            "case": "case", "sample": "sample"}[e["role"]]
    config = ",".join(f"{k}={v}" for k, v in e["config"].items())
    return f"{what}: {e['variant']}:{config}\n  at {values_text(e['case'])}"


def text(report: Mapping[str, Any]) -> str:
    """``report`` as lines for a person (kernels named without the op's prefix)."""
    lines = [f"{report['op']} on {report['chip']}: {report['target']}"]
    if "note" in report:  # Ascend
        lines.append(f"  {report['note']}")
        for e in report["entries"]:
            lines.append(_head(e))
            if "budget" in e:
                b = e["budget"]
                parts = ", ".join(f"{k or 'kernel'} {v}" for k, v in b["estimate"].items() if v or len(b["estimate"]) == 1)
                lines.append(f"  {b['kind']} estimate {parts} of {b['limit']}; compiler's figure: needs an NPU")
            if "error" in e:
                lines.append(f"  error: {e['error']}")
            for k in e.get("kernels", ()):
                verdict = "accepted" if k["accepted"] else f"refused ({k['stage']}): {k['message'][:300]}"
                lines.append(f"  {kernel_text(report, k['name']):<28} front end {verdict}")
        return "\n".join(lines)
    lines.append(f"  compiled by {report['python']}; figures cached in {report['cache']}")
    lines.append("  CTAs/SM: blocks a multiprocessor holds, the least of its limits by registers, shared "
                 "memory, threads and its block count (the limiting ones named); wgmma: warp-group dots/"
                 "those with an M, N or K of 16 or 32")
    header = (f"  {'kernel':<28} {'warps':>5} {'regs':>5} {'spill st':>8} {'spill ld':>8} {'stack':>6} "
              f"{'smem':>7} {'CTAs/SM':>7} {'wgmma':>7}  limited by")
    lines.append(header)
    for e in report["entries"]:
        lines.append(_head(e))
        if "error" in e:
            lines.append(f"  error: {e['error']}")
        for k in e.get("kernels", ()):
            if "error" in k:
                lines.append(f"  {kernel_text(report, k['name']):<28} error: {k['error'][:300]}")
                continue
            by = ", ".join(n for n, v in k["limits"].items() if v == k["ctas"])
            lines.append(f"  {kernel_text(report, k['name']):<28} {k['num_warps']:>5} {k['regs']:>5} {k['spill_stores']:>8} "
                         f"{k['spill_loads']:>8} {k['stack']:>6} {k['smem']:>7} {k['ctas']:>7} {wgmma_text(k):>7}  {by}")
        record = e.get("record")
        if record is not None and record.get("reported") is not None:
            lines.append(f"  recorded on the device: smem {record['reported']}, regs {record.get('regs')}, "
                         f"spills {record.get('spills')}")
    s = report["summary"]
    lines.append(f"{s['kernels']} distinct kernels: {s['compiled']} compiled, {s['cached']} from the cache, "
                 f"{s['failed']} failed; {s['spilling']} of them spill registers")
    for sp in s["spills"][:10]:
        lines.append(f"  spills: {sp['variant']} {kernel_text(report, sp['kernel'])}: {sp['stores']} B stored, {sp['loads']} B loaded")
    form = s["wgmma_fault_form"]
    lines.append(f"{form['kernels']} of them with the sm_90 wgmma fault form (triton-lang/triton#10486): at least "
                 f"two warp-group products, one with a dim of 16 or 32")
    for f in form["which"][:10]:
        lines.append(f"  wgmma fault form: {f['variant']} {kernel_text(report, f['kernel'])} ({wgmma_text(f)})")
    if "max_regs" in s:
        m, n = s["max_regs"], s["max_smem"]
        lines.append(f"most registers: {m['regs']} ({m['variant']} {kernel_text(report, m['kernel'])}); most shared "
                     f"memory: {n['smem']} ({n['variant']} {kernel_text(report, n['kernel'])})")
    for name, r in s["records"].items():
        if r["agree"] or r["differ"]:
            lines.append(f"{name} against the winner records' device figures: {r['agree']} agree, "
                         f"{len(r['differ'])} differ")
            for d in r["differ"][:10]:
                lines.append(f"  {d['variant']}:{','.join(f'{k}={v}' for k, v in d['config'].items())} at "
                             f"{values_text(d['case'])}: compiled {d['compiled']}, recorded {d['record']}")
    return "\n".join(lines)


def compiled_call(root: Path, result: dict[str, Any], spec: OpSpec, chip: ChipProfile, workers: int = 1,
                  python: str | None = None, cache: Path | None = None) -> dict[str, Any]:
    """An ``opgen explain`` answer with, under ``compiled``, what the compiler says of the kernels
    it runs at the call's own shape (the figures of :func:`cuda_resources`, from the cache where
    they are; an Ascend chip: the front end's verdicts); a refused call as it is."""
    if "refused" in result or chip.backend == "interpreter":
        return result
    entry = Entry("case", result["variant"], tuple(result["config"].items()), tuple(result["call"].items()))
    found = (npu_resources(root, spec, chip, [entry]) if chip.backend == "npu"
             else cuda_resources(root, spec, chip, [entry], workers, python, cache))
    (item,) = found["entries"]
    return {**result, "compiled": {"target": found["target"],
                                   **{k: item[k] for k in ("kernels", "error") if k in item}}}


# --- spill-free alternatives ----------------------------------------------------------------------
def resources(root: Path, spec: OpSpec, chip: ChipProfile, case_rows: list[dict[str, Any]] | None = None,
              workers: int | None = None, python: str | None = None, cache: Path | None = None,
              timeout: float | None = None) -> dict[str, Any]:
    """``opgen resources``: the kernels of the chip's frozen table (or of the table on
    ``case_rows``), compiled (NVIDIA) or through the front end (Ascend), as plain data.

    Raises:
        UsageError: a table without rows and no case set.
    """
    if chip.backend == "interpreter":
        raise UsageError("the interpreter has no compiler figures: name a device chip (h200, ascend910b3, ...)")
    table = frozen_rows(spec, chip, record_path(root, chip.name, spec.op), kernel_hashes(root, spec, chip.rendering))
    if case_rows is not None:
        entries = case_entries(root, spec, chip, table, case_rows)
    elif table.rows:
        entries = table_entries(spec, chip, table)
    else:
        raise UsageError(f"the {chip.name} table of {spec.op} has no rows (no records): name a case set with "
                         f"--cases (one of {', '.join(spec.cases)})")
    if chip.backend == "npu":
        return npu_resources(root, spec, chip, entries)
    return cuda_resources(root, spec, chip, entries, workers or default_workers(), python, cache, timeout)
