"""What ``opgen resources`` checks against the compiler, beside its tables: the spill-free search
(:func:`spill_free`: the points nearest a spilling choice that compile without spills) and the
budget check (:func:`check_budget`: the spec's on-chip formula against the compiled shared memory
on a sample of each variant's points). Uses ``errors``, ``kernels``, ``records``, ``resources``,
``space``, ``spec``, ``table``.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import UsageError
from ..render.kernels import kernel_hashes
from ..space.space import budget_bytes, find_variant, is_legal, points, variants_for
from ..spec.hardware import ChipProfile
from ..spec.spec import OpSpec
from ..storage.records import record_path
from ..table.table import frozen_rows
from .resources import (Entry, cuda_resources, default_workers, kernel_text, shape_params, table_entries,
                        values_text)


def spills(entry: Mapping[str, Any]) -> int:
    """Spill bytes (stores and loads) a thread of a compiled entry's kernels, summed."""
    return sum(k.get("spill_stores", 0) + k.get("spill_loads", 0) for k in entry.get("kernels", ()))


def nearest_points(spec: OpSpec, chip: ChipProfile, variant: str, config: Mapping[str, Any],
                   case: Mapping[str, Any], count: int, seed: int, keep: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Up to ``count`` points of ``variant``'s space at ``case`` (the tuner's: domains, fixed
    tunables, constraints, budget) other than ``config``, those differing from it in the fewest
    tunables first (ties in a draw seeded by ``seed``), each holding the tunables of ``keep`` at
    ``config``'s values."""
    held = {n: config[n] for n in keep}
    found, _ = points(spec, find_variant(spec, variant), chip, shape_params(spec, case))
    rng = random.Random(seed)
    ranked = []
    for point in found:
        values = dict(point.config)
        if values == dict(config) or any(values.get(n) != v for n, v in held.items()):
            continue
        ranked.append((sum(values.get(n) != v for n, v in config.items()), rng.random(), values))
    ranked.sort(key=lambda t: t[:2])
    return [values for _, _, values in ranked[:count]]


def spill_free(root: Path, spec: OpSpec, chip: ChipProfile, report: Mapping[str, Any], count: int, seed: int = 0,
               keep: Iterable[str] = (), workers: int = 1, python: str | None = None, cache: Path | None = None,
               timeout: float | None = None) -> list[dict[str, Any]]:
    """For each choice of a :func:`cuda_resources` report whose kernels spill: ``count`` points
    of its space nearest it (:func:`nearest_points`), compiled at its case, and the nearest of
    those whose kernels spill nothing (None where none of them does)."""
    keep = tuple(keep)
    spilling = [e for e in report["entries"] if e["role"] == "choice" and spills(e)]
    tried = [[Entry("alternative", e["variant"], tuple(c.items()), tuple(e["case"].items()))
              for c in nearest_points(spec, chip, e["variant"], e["config"], e["case"], count, seed, keep)]
             for e in spilling]
    compiled = cuda_resources(root, spec, chip, [a for t in tried for a in t], workers, python, cache, timeout)
    figures = iter(compiled["entries"])
    out = []
    for e, alternatives in zip(spilling, tried):
        found = [next(figures) for _ in alternatives]
        clean = [f for f in found if "error" not in f and not any("error" in k for k in f["kernels"])
                 and spills(f) == 0]
        best = clean[0] if clean else None
        out.append({"variant": e["variant"], "config": e["config"], "case": e["case"], "spills": spills(e),
                    "regs": max(k["regs"] for k in e["kernels"]), "tried": len(found), "spill_free": len(clean),
                    "nearest": None if best is None else {
                        "changed": {n: v for n, v in best["config"].items() if e["config"].get(n) != v},
                        "regs": max(k["regs"] for k in best["kernels"])}})
    return out


def spill_free_text(found: list[Mapping[str, Any]], keep: Iterable[str] = ()) -> str:
    """:func:`spill_free`'s answer as lines for a person."""
    held = f", {', '.join(keep)} held" if keep else ""
    lines = [f"choices whose kernels spill, and the nearest points of their space that spill nothing{held}:"]
    for f in found:
        lines.append(f"  {f['variant']} at {values_text(f['case'])}: {f['spills']} B spilled a thread, "
                     f"{f['regs']} registers at most")
        near = f["nearest"]
        if near is None:
            lines.append(f"    none of the {f['tried']} nearest points compiles without spills")
        else:
            lines.append(f"    nearest without spills: {values_text(near['changed'])} ({near['regs']} registers at most); "
                         f"{f['spill_free']} of the {f['tried']} nearest points spill nothing")
    if not found:
        lines.append("  none: no choice spills")
    return "\n".join(lines)


# --- the budget model against the compiler ------------------------------------------------------
def sample_entries(spec: OpSpec, chip: ChipProfile, rows: list[Mapping[str, Any]], sample: int, seed: int,
                   variants: Iterable[str] | None = None) -> list[Entry]:
    """``sample`` distinct points of each variant of the chip's rendering (of ``variants``), drawn
    with ``seed``: a case of ``rows`` where the variant is legal, then a point of its space there
    (the tuner's: domains, the tunables the variant fixes, constraints, within the budget); fewer
    where the space holds fewer."""
    wanted = None if variants is None else set(variants)
    out: list[Entry] = []
    for variant in variants_for(spec, chip.rendering):
        if wanted is not None and variant.name not in wanted:
            continue
        legal = []
        for row in rows:
            params = shape_params(spec, row)
            if is_legal(spec, variant, params):
                legal.append((row, params))
        rng = random.Random(f"{seed}:{variant.name}")
        spaces: dict[int, tuple] = {}
        drawn: dict[tuple, Entry] = {}
        for _ in range(4 * sample if legal else 0):
            if len(drawn) == sample:
                break
            i = rng.randrange(len(legal))
            if i not in spaces:
                spaces[i] = points(spec, variant, chip, legal[i][1])[0]
            if spaces[i]:
                entry = Entry("sample", variant.name, rng.choice(spaces[i]).values, tuple(legal[i][0].items()))
                drawn.setdefault(entry.same, entry)
        out.extend(drawn.values())
    return out


def check_budget(root: Path, spec: OpSpec, chip: ChipProfile, rows: list[Mapping[str, Any]], sample: int,
                 seed: int, variants: Iterable[str] | None = None, choices: bool = True, workers: int | None = None,
                 python: str | None = None, cache: Path | None = None, timeout: float | None = None) -> dict[str, Any]:
    """The spec's on-chip formula against the compiled shared memory (the largest of a point's
    kernels) on the frozen table's choices (``choices``) and :func:`sample_entries`' points: each
    point's estimate and figure, and the underestimates (a figure above its estimate)."""
    if chip.backend != "cuda":
        raise UsageError("--check-budget compares the formula with the compiled shared memory: an NVIDIA chip")
    wanted = None if variants is None else set(variants)
    entries = []
    if choices:
        table = frozen_rows(spec, chip, record_path(root, chip.name, spec.op), kernel_hashes(root, spec, chip.rendering))
        entries = [e for e in table_entries(spec, chip, table)
                   if e.role == "choice" and (wanted is None or e.variant in wanted)]
    entries += sample_entries(spec, chip, rows, sample, seed, variants)
    report = cuda_resources(root, spec, chip, entries, workers or default_workers(), python, cache, timeout)
    checked = budget_against_compiled(spec, chip, report)
    return {"op": spec.op, "chip": chip.name, "target": report["target"], "sample": sample, "seed": seed,
            "choices": choices, "cases": len(rows), "points": checked,
            "underestimates": [p for p in checked if p["compiled"] > p["estimate"]],
            "failed": [e for e in report["entries"] if "error" in e or any("error" in k for k in e["kernels"])],
            "summary": report["summary"]}


def budget_against_compiled(spec: OpSpec, chip: ChipProfile, report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """For each entry of a :func:`cuda_resources` answer whose kernels all compiled: the spec's
    estimate of its on-chip bytes at its case and the compiled shared memory of its largest kernel."""
    out = []
    for e in report["entries"]:
        used = budget_bytes(spec, find_variant(spec, e["variant"]), e["config"], shape_params(spec, e["case"]), chip)
        kernels = [k for k in e.get("kernels", ()) if "error" not in k]
        if used is None or not kernels or len(kernels) != len(e["kernels"]):
            continue
        largest = max(kernels, key=lambda k: k["smem"])
        out.append({"role": e["role"], "variant": e["variant"], "config": e["config"], "case": e["case"],
                    "kind": used[0], "estimate": used[1], "compiled": largest["smem"], "kernel": largest["name"]})
    return out


def check_text(report: Mapping[str, Any]) -> str:
    """:func:`check_budget`'s answer as lines for a person: per variant, the points checked, the
    underestimates and the largest figure over its estimate; then each underestimate."""
    head = "the frozen table's choices and " if report["choices"] else ""
    lines = [f"{report['op']} on {report['chip']} ({report['target']}): the spec's budget formula against the "
             f"compiled shared memory (the largest kernel's), on {head}{report['sample']} points a variant drawn "
             f"with seed {report['seed']} from its space at {report['cases']} cases",
             f"  {'variant':<32} {'points':>6} {'under':>5} {'compiled / estimate':>20}"]
    by: dict[str, list[dict[str, Any]]] = {}
    for p in report["points"]:
        by.setdefault(p["variant"], []).append(p)
    for variant, ps in by.items():
        worst = max(p["compiled"] / p["estimate"] if p["estimate"] else float("inf") for p in ps)
        lines.append(f"  {variant:<32} {len(ps):>6} {sum(p['compiled'] > p['estimate'] for p in ps):>5} "
                     f"{'max ' + format(worst, '.2f'):>20}")
    under = report["underestimates"]
    lines.append(f"{len(report['points'])} points checked, {len(under)} underestimated, "
                 f"{len(report['failed'])} failed to compile")
    for p in under:
        config = ",".join(f"{k}={v}" for k, v in p["config"].items())
        lines.append(f"  {p['role']} {p['variant']}:{config} at {values_text(p['case'])}: estimate {p['estimate']}, "
                     f"compiled {p['compiled']} ({kernel_text(report, p['kernel'])})")
    for e in report["failed"]:
        lines.append(f"  failed: {e['variant']} at {values_text(e['case'])}: "
                     f"{e.get('error') or next(k['error'] for k in e['kernels'] if 'error' in k)}"[:400])
    return "\n".join(lines)
