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


Settings = Mapping[str, tuple[Any, Any]]
"""``--set``'s tunables: name to (the choice's value it replaces, or :data:`ANY`; the value searched)."""
ANY = object()
"""A setting's ``from``: whatever the choice holds."""


def parse_search(spec: OpSpec, chip: ChipProfile, keep: str | None, settings: str | None,
                 twins: str | None) -> tuple[tuple[str, ...], dict[str, tuple[Any, Any]], tuple[tuple[str, str], ...]]:
    """``--keep``, ``--set`` and ``--twins`` as :func:`spill_free` takes them: the tunables held, the
    settings (``NAME=VALUE``: every choice searched with VALUE; ``NAME=FROM:TO``: those holding FROM
    searched with TO; each a value of the tunable's domain on the chip) and the pairs of options
    of one variant axis whose variants are searched as one space (``split:rowsplit``).

    Raises:
        UsageError: a name that is no tunable (or axis option) of the op, or a value out of its domain.
    """
    names = spec.tunables_for(chip.backend)
    held = tuple(n for n in (keep or "").split(",") if n)
    unknown = sorted(set(held) - set(names))
    if unknown:
        raise UsageError(f"--keep {','.join(unknown)}: no tunable of {spec.op} on {chip.backend}")
    found: dict[str, tuple[Any, Any]] = {}
    for item in (settings or "").split(","):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise UsageError(f"--set {item}: expected NAME=VALUE or NAME=FROM:TO, NAME a tunable of {spec.op} on "
                             f"{chip.backend} ({', '.join(names)})")
        domain = list(dict.fromkeys(spec.tunables[name].domain[chip.rendering]))
        texts = value.split(":") if ":" in value else ["", value]
        picked = [next((v for v in domain if str(v).lower() == t.lower()), None) if t else ANY for t in texts]
        if len(texts) != 2 or picked[1] is ANY or None in picked:
            raise UsageError(f"--set {item}: {name}'s values on {chip.backend} are {', '.join(map(str, domain))}")
        found[name] = (picked[0], picked[1])
    pairs = []
    options = {o: a for a, opts in spec.variants.axes.items() for o in opts}
    for item in (twins or "").split(","):
        if not item:
            continue
        pair = tuple(item.split(":"))
        if len(pair) != 2 or any(o not in options for o in pair) or options[pair[0]] != options[pair[1]]:
            raise UsageError(f"--twins {item}: expected A:B, two options of one variant axis of {spec.op} "
                             f"({', '.join(options)})")
        pairs.append(pair)
    return held, found, tuple(pairs)


def searched(config: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """``config`` with ``settings`` applied (a setting with a ``from`` only where it holds it)."""
    out = dict(config)
    for name, (was, value) in settings.items():
        if name in out and (was is ANY or (type(out[name]) is type(was) and out[name] == was)):
            out[name] = value
    return out


def twin_variants(spec: OpSpec, chip: ChipProfile, variant: str, twins: Iterable[tuple[str, str]]) -> list[str]:
    """``variant`` and the variants of the chip's rendering it makes with an option of a pair of
    ``twins`` replaced by the other (``split_static_separate`` and ``rowsplit_static_separate``)."""
    options = find_variant(spec, variant).options
    known = {v.name for v in variants_for(spec, chip.rendering)}
    out = [variant]
    for a, b in twins:
        for i, (axis, option) in enumerate(options):
            other = {a: b, b: a}.get(option)
            if other is not None:
                name = "_".join(o for _, o in (*options[:i], (axis, other), *options[i + 1:]))
                if name in known and name not in out:
                    out.append(name)
    return out


def nearest_points(spec: OpSpec, chip: ChipProfile, variant: str, config: Mapping[str, Any],
                   case: Mapping[str, Any], count: int, seed: int, keep: Iterable[str] = (),
                   variants: Iterable[str] = ()) -> list[tuple[str, dict[str, Any]]]:
    """Up to ``count`` points (variant, config) of the spaces of ``variant`` and ``variants`` at
    ``case`` (the tuner's: domains, fixed tunables, constraints, budget) other than ``config``,
    those differing from it in the fewest tunables first (another variant: one more; ties in a
    draw seeded by ``seed``), each holding the tunables of ``keep`` at ``config``'s values."""
    held = {n: config[n] for n in keep}
    params = shape_params(spec, case)
    rng = random.Random(seed)
    ranked = []
    for name in dict.fromkeys((variant, *variants)):
        found, _ = points(spec, find_variant(spec, name), chip, params)
        for point in found:
            values = dict(point.config)
            if (name == variant and values == dict(config)) or any(values.get(n) != v for n, v in held.items()):
                continue
            apart = sum(values.get(n) != v for n, v in config.items()) + (name != variant)
            ranked.append((apart, rng.random(), name, values))
    ranked.sort(key=lambda t: t[:2])
    return [(name, values) for _, _, name, values in ranked[:count]]


def _clean(entry: Mapping[str, Any]) -> bool:
    return "error" not in entry and not any("error" in k for k in entry["kernels"]) and spills(entry) == 0


def _figures(op: str, entry: Mapping[str, Any]) -> dict[str, list[int]]:
    """Each kernel's registers and spill bytes (stores and loads), by name without the op's prefix."""
    return {k["name"].removeprefix(f"{op}_"): [k.get("regs", 0), k.get("spill_stores", 0) + k.get("spill_loads", 0)]
            for k in entry.get("kernels", ())}


def _compiled(root: Path, spec: OpSpec, chip: ChipProfile, entries: list[Entry], workers: int, python: str | None,
              cache: Path | None, timeout: float | None) -> list[dict[str, Any]]:
    """:func:`cuda_resources`' entries for ``entries`` (none to compile: none)."""
    return cuda_resources(root, spec, chip, entries, workers, python, cache, timeout)["entries"] if entries else []


def spill_free(root: Path, spec: OpSpec, chip: ChipProfile, report: Mapping[str, Any], count: int, seed: int = 0,
               keep: Iterable[str] = (), workers: int = 1, python: str | None = None, cache: Path | None = None,
               timeout: float | None = None, settings: Settings | None = None,
               twins: Iterable[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """For each choice of a :func:`cuda_resources` report whose kernels spill, or that ``settings``
    change: the choice as set (compiled; the answer where it spills nothing), else ``count``
    points of its space (and its ``twins``' spaces) nearest it (:func:`nearest_points`, the set
    tunables held with ``keep``), compiled at its case, and the nearest of those whose kernels
    spill nothing (None where none of them does)."""
    settings, keep, twins = settings or {}, tuple(keep), tuple(twins)
    chosen = [(e, searched(e["config"], settings)) for e in report["entries"] if e["role"] == "choice"]
    chosen = [(e, c) for e, c in chosen if spills(e) or c != e["config"]]
    as_set = [Entry("alternative", e["variant"], tuple(c.items()), tuple(e["case"].items()))
              for e, c in chosen if c != e["config"]]
    set_figures = iter(_compiled(root, spec, chip, as_set, workers, python, cache, timeout))
    firsts = [next(set_figures) if c != e["config"] else None for e, c in chosen]
    held = (*keep, *(n for n in settings if n not in keep))
    tried = [[] if first is not None and _clean(first) else
             [Entry("alternative", v, tuple(p.items()), tuple(e["case"].items()))
              for v, p in nearest_points(spec, chip, e["variant"], c, e["case"], count, seed, held,
                                         twin_variants(spec, chip, e["variant"], twins))]
             for (e, c), first in zip(chosen, firsts)]
    figures = iter(_compiled(root, spec, chip, [a for t in tried for a in t], workers, python, cache, timeout))
    out = []
    for (e, c), first, alternatives in zip(chosen, firsts, tried):
        found = [f for f in (first,) if f is not None] + [next(figures) for _ in alternatives]
        clean = [f for f in found if _clean(f)]
        best = clean[0] if clean else None
        out.append({"variant": e["variant"], "config": e["config"], "case": e["case"], "spills": spills(e),
                    "regs": max(k["regs"] for k in e["kernels"]), "kernels": _figures(spec.op, e),
                    "set": {n: v for n, v in c.items() if e["config"].get(n) != v},
                    "tried": len(found), "spill_free": len(clean), "nearest": None if best is None else {
                        "variant": best["variant"], "kernels": _figures(spec.op, best),
                        "changed": {n: v for n, v in best["config"].items() if e["config"].get(n) != v},
                        "regs": max(k["regs"] for k in best["kernels"])}})
    return out


def _kernels_text(kernels: Mapping[str, list[int]]) -> str:
    return ", ".join(f"{n} {r} regs {s} B" for n, (r, s) in kernels.items())


def spill_free_text(found: list[Mapping[str, Any]], keep: Iterable[str] = ()) -> str:
    """:func:`spill_free`'s answer as lines for a person."""
    held = f", {', '.join(keep)} held" if keep else ""
    lines = [f"choices whose kernels spill (or that --set changes), and the nearest points of their space that "
             f"spill nothing{held}:"]
    for f in found:
        lines.append(f"  {f['variant']} at {values_text(f['case'])}: {f['spills']} B spilled a thread, "
                     f"{f['regs']} registers at most ({_kernels_text(f.get('kernels', {}))})"
                     + (f"; searched with {values_text(f['set'])}" if f.get("set") else ""))
        near = f["nearest"]
        if near is None:
            lines.append(f"    none of the {f['tried']} nearest points compiles without spills")
        else:
            other = f"{near['variant']} " if near.get("variant", f["variant"]) != f["variant"] else ""
            lines.append(f"    nearest without spills: {other}{values_text(near['changed'])} ({near['regs']} registers "
                         f"at most: {_kernels_text(near.get('kernels', {}))}); {f['spill_free']} of the "
                         f"{f['tried']} nearest points spill nothing")
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
