"""``opgen explain``: why one call's shape runs the kernel it runs on a chip, and what the frozen
table promises for it: the dispatch key and the shapes its bucket stands for, the variant and
config, whether the row was tuned there (its measured median, date and cross-check), filled with
the tuned point measured fastest there or from another tuned or measured bucket, or the spec's
default; the on-chip estimate against the chip's budget and the compiler's figure where a record
holds one. From the spec and the records alone, no device (``--compile`` adds the compiler's
figures at the call's shape, ``opgen.evidence.resources.compiled_call``).
Uses ``case_checks``, ``cuda_compile``, ``errors``, ``fill_score``, ``hardware``, ``kernels``, ``keys``,
``records``, ``space``, ``spec``, ``spec_values``, ``table``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError
from ..render.kernels import kernel_hashes
from ..space.case_checks import failing_check
from ..space.space import budget_parts, case_inputs, default_point, evaluate_params, find_variant, fixed_values
from ..spec.hardware import ChipProfile
from ..spec.keys import key_of, key_text
from ..spec.spec import DTYPES, OpSpec
from ..spec.spec_values import value_kinds
from ..storage.records import read_paths, record_path
from ..table.fill_score import leave_one_out, summarize
from ..table.table import FrozenTable, Row, default_source, frozen_rows
from .cuda_compile import is_wgmma_fault_form


def parse_values(spec: OpSpec, items: list[str], complete: bool = True) -> dict[str, Any]:
    """``NAME=VALUE`` words as a case row: dims as ints, scalars by their declared type, ``dtype``
    as a dtype name, ``<tensor>_given`` as a bool; with ``complete``, every dim must be given.

    Raises:
        UsageError: naming a word that is not ``NAME=VALUE``, an unknown name, a name given
            twice, a value of the wrong kind or a dim no tensor can have.
    """
    kinds = value_kinds(spec)
    dims = set(spec.dim_symbols())
    row: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in kinds:
            raise UsageError(f"{item!r}: expected NAME=VALUE with NAME among {', '.join(sorted(kinds))}")
        if name in row:
            raise UsageError(f"{name} given twice ({name}={row[name]} and {item})")
        row[name] = _value(name, kinds[name], text)
        if name == "dtype" and row[name] not in spec.call_dtypes():
            raise UsageError(f"dtype={text}: a call of {spec.op} has a dtype among {', '.join(spec.call_dtypes())}")
        if name in dims and not 0 <= row[name] <= MAX_DIM:
            shown = text if len(text) <= 24 else f"an int of {len(text.lstrip('+-'))} digits"
            raise UsageError(f"{name}={shown}: a tensor's size is an int in [0, 2**63 - 1]")
    missing = [d for d in spec.dim_symbols() if d not in row]
    if missing and complete:
        raise UsageError(f"give every dim of {spec.op}: missing {', '.join(missing)}")
    return row


MAX_DIM = 2 ** 63 - 1
"""The largest size of a tensor's dim (torch sizes are 64-bit)."""
FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32, the bound of a float scalar the generated API takes."""


def _value(name: str, kind: str, text: str) -> Any:
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            return {"true": True, "1": True, "false": False, "0": False}[text.lower()]
    except (ValueError, KeyError):
        raise UsageError(f"{name}={text}: expected a {kind}") from None
    if text not in DTYPES:
        raise UsageError(f"{name}={text}: expected a dtype among {', '.join(sorted(DTYPES))}")
    return text


def explain(root: Path, spec: OpSpec, chip: ChipProfile, row: Mapping[str, Any],
            table: FrozenTable | None = None, hashes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the frozen table of ``chip`` runs for the call ``row`` describes, as plain data
    (``table``: that table when the caller has it already, else frozen from the records;
    ``hashes``: the kernel hashes it was frozen with, else those of the templates under ``root``)."""
    out: dict[str, Any] = {"op": spec.op, "chip": chip.name, "call": dict(row)}
    refused = _argument_refusal(spec, row)
    if refused is not None:
        return {**out, "refused": refused}
    params = evaluate_params(spec, case_inputs(spec, row))
    refused = _refusal(spec, params)
    if refused is not None:
        return {**out, "refused": refused}
    key = key_of(spec, params)
    hashes = kernel_hashes(root, spec, chip.rendering) if hashes is None else hashes
    if table is None:
        table = frozen_rows(spec, chip, record_path(root, chip.name, spec.op), hashes)
    found = next((r for r in table.rows if r.key == key), None)
    out |= {"key": list(key), "bucket": key_text(spec, key)}
    if found is None:
        variant, config, said = _default_row(root, spec, chip, table, key, params, hashes)
    else:
        variant, config, said = _frozen_row(root, spec, chip, table, found, params, hashes)
    out |= said
    out |= {"variant": variant, "config": config}
    parts = budget_parts(spec, find_variant(spec, variant), config, params, chip)
    if parts is not None:
        kind, used = parts
        out["budget"] = {"kind": kind, "limit": chip.budget(kind), "estimate": used}
    return out


def _default_row(root: Path, spec: OpSpec, chip: ChipProfile, table: FrozenTable, key: tuple,
                 params: Mapping[str, Any], hashes: Mapping[str, str]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The variant and config of a bucket the table has no row for, and why the default runs."""
    point = default_point(spec, chip, params)
    out: dict[str, Any] = {}
    ranked = spec.dispatch.fill_rule == "ranked"
    near = None if key in table.kept or ranked else default_source(spec, chip, table, key)
    if key in table.kept:
        why = "the spec's default, measured faster here than every tuned point"
    elif ranked:
        why = ("the spec's default: the ranked fill found it nearest the fastest on the buckets around, "
               "or no tuned point timed in this bucket's own dtype and flags may serve it")
        out["rule"] = _rule(root, spec, chip, hashes)
    elif near is None:
        why = "no tuned row in the table: the spec's default choice"
    else:
        out["default_from"] = key_text(spec, near)
        why = f"the spec's default, measured fastest on the nearest measured bucket, {out['default_from']}"
    return point.variant, dict(point.config), {**out, "row": "default", "why": why}


def _frozen_row(root: Path, spec: OpSpec, chip: ChipProfile, table: FrozenTable, found: Row,
                params: Mapping[str, Any], hashes: Mapping[str, str]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The variant and config of the table's row for the call, its winner, and where a filled row
    came from."""
    # the tunables its variant fixes are taken at the call, as the generated API takes them
    variant = found.variant
    config = {**found.point, **fixed_values(spec, find_variant(spec, variant), params)}
    w = found.winner
    out: dict[str, Any] = {
        "row": "tuned" if found.source is None else "filled",
        "winner": {"bucket": key_text(spec, w.key), "chip": w.chip, "median_ms": w.median_ms, "date": w.date,
                   "study": w.study, "flush": w.flush,
                   "compiler": None if w.budget is None else {
                       "kind": w.budget.kind, "reported": w.budget.reported,
                       "regs": w.budget.regs, "spills": w.budget.spills}}}
    if found.source is not None:
        out["filled_from"] = key_text(spec, found.source)
        out["filled_by"] = "measured" if found.measured is not None else "ranked" if found.ranked else (
            "nearest measured" if any(r.key == found.source and r.measured is not None for r in table.rows)
            else "nearest")
        if found.ranked is not None:
            c = found.ranked
            near = min(c.evidence, key=lambda e: e[1])
            out["ranked"] = {"buckets": len(c.evidence), "predicted": 1 / c.predicted,
                             "nearest": key_text(spec, near[0]), "nearest_ratio": 1 / near[2]}
        if found.measured is None:
            out["rule"] = _rule(root, spec, chip, hashes)
        if found.measured is not None:
            out["measured"] = {"ms": found.measured.ms, "run": found.measured.run, "chip": found.measured.chip}
        narrowed = {n: [w.point[n], v] for n, v in found.point.items() if w.point.get(n) != v}
        if narrowed:
            out["clamped"] = narrowed  # tiles lowered to the bucket's largest call
    check = next((c for c in table.checks.current if c.key == found.key), None)
    if check is not None:
        out["cross_check"] = {"loss": check.loss, "margin": check.margin}
    return variant, config, out


def _rule(root: Path, spec: OpSpec, chip: ChipProfile, hashes: Mapping[str, str]) -> dict[str, Any]:
    """The fill rule of the spec and its loss stated from the records: each measured bucket
    filled from the others (:func:`opgen.table.fill_score.leave_one_out`)."""
    rule = spec.dispatch.fill_rule
    path = record_path(root, chip.name, spec.op)
    stamp = tuple(p.stat().st_mtime_ns for p, _ in read_paths(path, chip) if p.exists())
    memo = (id(spec), chip.name, str(path), stamp, tuple(sorted(hashes.items())))
    if memo not in _RULES:
        rows = leave_one_out(spec, chip, path, hashes, rule="rank" if rule == "ranked" else "nearest",
                             kinds=("measured",))
        s = summarize(rows)
        _RULES[memo] = (spec, {"name": rule, "geomean": s.geomean, "min": s.least, "scored": s.scored,
                               "over": s.over, "unscored": s.unscored, "line": s.line()})
    return dict(_RULES[memo][1])


# (id(spec), chip, records path, its mtime, kernel hashes) -> (spec, the rule's figures): a
# leave-one-out takes seconds, and a page explains many calls
_RULES: dict[tuple[Any, ...], tuple[OpSpec, dict[str, Any]]] = {}


def _argument_refusal(spec: OpSpec, row: Mapping[str, Any]) -> str | None:
    """What the generated API raises on the call's scalars before its checks run (a value off the
    scalar's choices, a float no float32 holds), or None."""
    for name, arg in spec.signature.scalars.items():
        value = row.get(name, arg.default)
        if arg.type == "float" and not abs(value) <= FLOAT32_MAX:  # nan too
            return f"ValueError: {name} must be a finite float32 value (the kernels take it in float32), got {value:.6g}"
        if arg.choices is not None and value not in arg.choices:
            return f"ValueError: {name} must be one of {', '.join(map(str, arg.choices))}, got {value}"
    return None


def _refusal(spec: OpSpec, params: Mapping[str, Any]) -> str | None:
    """The message of the first check the call fails (the generated API raises it), or None."""
    failed = failing_check(spec, params)
    if failed is None:
        return None
    _, check, _ = failed
    try:
        return f"{check.error}: {check.message.format(**params)}"
    except (KeyError, ValueError, IndexError):
        return f"{check.error}: {check.message}"


def text(result: Mapping[str, Any]) -> str:
    """``result`` as lines for a person."""
    call = " ".join(f"{k}={v}" for k, v in result["call"].items())
    lines = [f"{result['op']} on {result['chip']}: {call}"]
    if "refused" in result:
        return "\n".join(lines + [f"  refused by the op's checks: {result['refused']}"])
    lines.append(f"  bucket  {result['bucket']}  (key {tuple(result['key'])})")
    config = ", ".join(f"{k}={v}" for k, v in result["config"].items())
    lines.append(f"  runs    {result['variant']}: {config}")
    if result["row"] == "default":
        lines.append(f"  row     {result['why']}")
    else:
        w = result["winner"]
        where = {"measured": "measured fastest in this bucket; the winner of",
                 "nearest measured": "filled from the measured bucket",
                 "ranked": "ranked fill: the point of the winner of"}.get(result.get("filled_by"),
                                                                          "filled from the tuned bucket")
        where = f"{where} {result['filled_from']}" if result["row"] == "filled" else "tuned in this bucket"
        on = "" if w["chip"] == result["chip"] else f" on {w['chip']} (records {result['chip']} inherits)"
        lines.append(f"  row     {where}: {w['median_ms']:.4f} ms measured{on} {w['date']} "
                     f"({w['flush']}-flush timing)")
        if "ranked" in result:
            r = result["ranked"]
            lines.append(f"  ranked  timed on {r['buckets']} buckets around, {r['predicted']:.3f} of the fastest's speed "
                         f"there (weighed by distance); nearest {r['nearest']}: {r['nearest_ratio']:.3f}")
        if "clamped" in result:
            moved = ", ".join(f"{n} {a} -> {b}" for n, (a, b) in result["clamped"].items())
            lines.append(f"  clamped {moved} (tiles no wider than the bucket's largest call)")
        if "measured" in result:
            m = result["measured"]
            on = "" if m["chip"] == result["chip"] else f" on {m['chip']}"
            lines.append(f"  measure {m['ms']:.4f} ms here{on} (run {m['run']})")
        if "cross_check" in result:
            c = result["cross_check"]
            lines.append(f"  check   leave-one-out loss {c['loss']:.1%} (margin {c['margin']:.0%})")
        compiler = w["compiler"]
        if compiler and compiler.get("reported") is not None:
            lines.append(f"  compiler {compiler['kind']} {compiler['reported']} (regs {compiler['regs']}, "
                         f"spills {compiler['spills']}) where it was tuned")
    if "rule" in result:
        r = result["rule"]
        lines.append(f"  rule    {r['name']} fill; each measured bucket filled from the others: {r['line']}")
    if "budget" in result:
        b = result["budget"]
        worst = max(b["estimate"].values())
        parts = ", ".join(f"{k or 'kernel'} {v}" for k, v in b["estimate"].items())
        lines.append(f"  budget  {b['kind']} estimate {parts}: {worst / b['limit']:.0%} of {b['limit']}")
    if "compiled" in result:
        lines += _compiled_lines(result)
    return "\n".join(lines)


def _compiled_lines(result: Mapping[str, Any]) -> list[str]:
    """What ``opgen explain --compile`` adds: each kernel's figures at the call's shape."""
    compiled = result["compiled"]
    lines = [f"  compiled for {compiled['target']} at this shape:"]
    if "error" in compiled:
        lines.append(f"    error: {compiled['error'][:300]}")
    for k in compiled.get("kernels", ()):
        name = k["name"].removeprefix(f"{result['op']}_")
        if "error" in k:
            lines.append(f"    {name}: error: {k['error'][:300]}")
        elif "accepted" in k:
            verdict = "accepted" if k["accepted"] else f"refused ({k['stage']}): {k['message'][:300]}"
            lines.append(f"    {name}: front end {verdict}; the UB figure needs an NPU")
        else:
            by = ", ".join(n for n, v in k["limits"].items() if v == k["ctas"])
            form = (f"; sm_90 wgmma fault form ({k['wgmma']} warp-group dots, {k['wgmma_small']} with a dim "
                    f"of 16 or 32)" if is_wgmma_fault_form(k) else "")
            lines.append(f"    {name}: {k['regs']} registers, spills {k['spill_stores']} B stored "
                         f"{k['spill_loads']} B loaded, stack {k['stack']} B, smem {k['smem']} B, "
                         f"{k['num_warps']} warps: {k['ctas']} CTAs/SM ({by}){form}")
    return lines

