"""``opgen build``: render every op's kernels, frozen tables and public API into ``generated/``.

The output is a pure function of the specs, the templates and the tuning records, byte for byte;
``check`` compares what would be written with what is on disk.
Uses ``branches``, ``case_checks``, ``errors``, ``expr``, ``fill_score``, ``hardware``, ``kernels``,
``keys``, ``pyformat``, ``records``, ``render``, ``space``, ``spec``, ``spec_paths``, ``table``,
``table_layout``.
"""
from __future__ import annotations

import ast
import inspect
import shutil
import string
from pathlib import Path
from typing import Any

from ..errors import BuildError, SpecError
from ..render.kernels import (GENERATED, RENDERINGS, GeneratedFile, OpInputs, op_environment, op_inputs,
                      render_kernels)
from ..render.pyformat import format_source
from ..render.render import content_hash, file_hash, header, render
from ..space.case_checks import check_cases
from ..space.space import budget_formula, variants_for
from ..spec.expr import Expr, python_helpers
from ..spec.hardware import PROFILES, ChipProfile, rendering_of
from ..spec.spec_paths import check_paths
from ..spec.keys import bucket_index
from ..spec.spec import KeyField, OpSpec, load_specs
from ..storage import records as records_mod
from ..table.fill_score import fill_gate
from ..table.table import frozen_rows
from .branches import live_branches, may_hold
from .table_layout import WIDTH, layout, wrap_comment

def _format_fields(spec: OpSpec, message: str, known: set[str], at: str) -> list[str]:
    fields = []
    for _, field, _, _ in string.Formatter().parse(message):
        if field is None:
            continue
        if field not in known:
            raise SpecError(spec.path, at, f"message fields among {sorted(known)}", field)
        if field not in fields:
            fields.append(field)
    return fields


def _signature_context(spec: OpSpec, numbers: frozenset[str]) -> dict[str, Any]:
    sig = spec.signature
    tensors = [dict(name=n, dims=t.dims, dtypes=t.dtypes, doc=t.doc, optional=t.optional)
               for n, t in sig.tensors.items()]
    scalars = [dict(name=n, type=s.type, doc=s.doc, default=s.default,
                    default_src=f"torch.{s.default}" if s.type == "dtype" else repr(s.default),
                    choices=None if s.choices is None else tuple(s.choices)) for n, s in sig.scalars.items()]
    binds, dim_checks, bound = [], [], {}
    for name, t in sig.tensors.items():
        for axis, dim in enumerate(t.dims):
            if dim in spec.params:
                dim_checks.append((name, axis, dim, f"from {spec.params[dim].source}", t.optional))
            elif dim in bound:
                dim_checks.append((name, axis, dim, f"from {bound[dim]}", t.optional))
            else:
                bound[dim] = f"{name}.shape[{axis}]"
                binds.append((dim, name, axis))
    outputs = []
    for name, out in sig.outputs.items():
        if out.dtype in sig.tensors:
            dtype = f"{out.dtype}.dtype"
        elif out.dtype in sig.scalars:
            dtype = f"getattr(torch, {out.dtype})"
        else:
            dtype = f"torch.{out.dtype}"
        outputs.append(dict(name=name, dims=out.dims, dtype=dtype, doc=out.doc,
                            when=None if out.when is None else out.when.to_python(numbers)))
    known = set(spec.param_names())
    checks = [dict(rule=c.rule.to_python(numbers), error=c.error, message=c.message,
                   fields=_format_fields(spec, c.message, known, f"checks.{i}.message"))
              for i, c in enumerate(spec.checks)]
    return dict(tensors=tensors, scalars=scalars, scalar_types={a.type for a in sig.scalars.values()},
                binds=binds, dim_checks=dim_checks,
                outputs=outputs, checks=checks,
                params=[(n, e.to_python(numbers)) for n, e in spec.params.items()])


def _budgets_context(spec: OpSpec, numbers: frozenset[str]) -> list[dict[str, Any]]:
    """Per rendering and budget kind, the sources of its formulas (one per kernel: the point needs
    the largest) and the names they read."""
    budgets = []
    for rendering, formulas in sorted(spec.budgets.items()):
        for kind, expr in formulas.items():
            exprs = list(expr.values()) if isinstance(expr, dict) else [expr]
            budgets.append(dict(rendering=rendering, kind=kind, sources=[e.to_python(numbers) for e in exprs],
                                names=tuple(sorted({n for e in exprs for n in e.names}))))
    return budgets


def _defaults_context(spec: OpSpec, numbers: frozenset[str],
                      budgets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per backend, what its default function renders: the axes' formulas, the tunables given by
    a formula, the branches that change a value (:func:`opgen.build.branches.live_branches`), and
    the tunables given as lists of candidates (``values``, each narrowed to one by the options that
    fix it, ``overrides``), the first whose point fits the budget taken."""
    by_rendering = {b["rendering"]: b for b in budgets}
    axes = spec.variants.axes
    out = []
    for backend, defaults in spec.dispatch.defaults.items():
        rendering = rendering_of(backend)
        tunable_names = spec.tunables_for(backend)
        axis_sources = {a: defaults[a].to_python(numbers) for a in axes}
        fixed = [(axis, opt, [(n, e.to_python(numbers)) for n, e in o.fixed.items() if n in tunable_names])
                 for axis, options in axes.items() for opt, o in options.items()]
        fixed = [row for row in fixed if row[2] and may_hold(axis_sources[row[0]], row[1])]
        tunables, lists = [], []
        for name in tunable_names:
            value = defaults[name]
            if isinstance(value, Expr):
                tunables.append((name, value.to_python(numbers)))
                continue
            overrides = [(axis, opt, source) for axis, opt, assignments in fixed
                         for fixed_name, source in assignments if fixed_name == name]
            lists.append(dict(name=name, values=[v.to_python(numbers) for v in value], overrides=overrides))
        budget = by_rendering.get(rendering)
        if lists and budget is None:
            raise SpecError(spec.path, f"dispatch.defaults.{backend}",
                            f"a budget formula for {rendering} to choose among listed defaults", None)
        out.append(dict(backend=backend, rendering=rendering, axes=list(axis_sources.items()), tunables=tunables,
                        fixed=live_branches(fixed, dict(tunables), axis_sources), lists=lists,
                        tunable_names=tunable_names, budget=budget))
    return out


def _api_context(spec: OpSpec, inputs: OpInputs) -> dict[str, Any]:
    axes = list(spec.variants.axes)
    numbers = _numbers(spec)
    budgets = _budgets_context(spec, numbers)
    defaults = _defaults_context(spec, numbers, budgets)
    calls: set[str] = set()
    for expr in _all_exprs(spec):
        calls |= expr.python_calls(numbers)
    legality = [(axis, opt, o.when.to_python(numbers))
                for axis, options in spec.variants.axes.items() for opt, o in options.items()
                if o.when.source.strip() != "True"]
    legal_names = sorted({n for a in spec.variants.axes.values() for o in a.values() for n in o.when.names})
    # (axis, options, assignments): each axis's options grouped by the shape-dependent values they fix
    shape_fixed, fixed_names = [], set()  # and the shape's names those values read
    for axis, options in spec.variants.axes.items():
        groups: dict[tuple, list[str]] = {}
        for opt, o in options.items():
            shaped = {n: e for n, e in o.fixed.items() if e.names}
            fixed_names.update(n for e in shaped.values() for n in e.names)
            if shaped:
                groups.setdefault(tuple((n, e.to_python(numbers)) for n, e in shaped.items()), []).append(opt)
        shape_fixed += [(axis, opts, list(assignments)) for assignments, opts in groups.items()]
    key = []
    for name, field in spec.dispatch.key.items():
        expr, buckets = (field.expr, field.buckets) if isinstance(field, KeyField) else (field, None)
        source = expr.to_python(numbers)
        key.append((name, source if buckets is None else f"bucket_index({source}, {buckets!r})"))
    doc_lines = spec.doc.strip().splitlines()
    rendered = [v for r in ("cuda", "npu") for v in variants_for(spec, r)]
    variants = sorted({(v.name, tuple(o for _, o in v.options)) for v in rendered})
    host_descriptors = sorted({v.name for v in rendered
                               if any(spec.variants.axes[a][o].host_descriptors for a, o in v.options)})
    descriptor_options = [f"{a} {' and '.join(names)}" for a, options in spec.variants.axes.items()
                          if (names := [o for o, option in options.items() if option.host_descriptors])]
    uses_product = any(len(d["lists"]) > 1 for d in defaults)
    static = [a for a in spec.api.launch_args if a not in spec.signature.tensors and a not in spec.signature.outputs]
    return dict(header=inputs.header(), op=spec.op, uses_product=uses_product, doc_summary=doc_lines[0].rstrip(".:"),
                doc_body="\n".join(doc_lines[1:]).strip() or spec.op, axes=axes,
                variants=variants, host_descriptors=host_descriptors, defaults=defaults, budgets=budgets,
                descriptor_options=", ".join(descriptor_options), strided=list(spec.api.strided),
                legality=legality, legal_names=legal_names, shape_fixed=shape_fixed,
                fixed_names=sorted(fixed_names), key=key,
                param_names=list(spec.param_names()),
                launch_args=list(spec.api.launch_args),
                static_args=static,
                helpers="\n\n".join(filter(None, [python_helpers(calls), inspect.getsource(bucket_index)])).rstrip("\n"),
                chips=[(p.backend, p.device_names, p.name) for p in PROFILES.values()
                       if p.backend in ("cuda", "npu")],
                **_signature_context(spec, numbers))


def _numbers(spec: OpSpec) -> frozenset[str]:
    """Names whose values in the generated API are numbers or booleans, never strings or tuples:
    dims, numeric scalars, ``<tensor>_given``, ``CORES``, the params whose formulas give numbers,
    and the tunables whose domains hold no string and whose defaults and fixed values are formulas
    of numbers (a frozen row holds a value of the domain). Rendered formulas multiply, add and
    take ``%`` of these without the bounded helpers (:meth:`opgen.spec.expr.Expr.to_python`)."""
    sig = spec.signature
    numbers = {*spec.dim_symbols(), "CORES", *(n for n, s in sig.scalars.items() if s.type != "dtype"),
               *(f"{t}_given" for t, arg in sig.tensors.items() if arg.optional)}
    for name, expr in spec.params.items():  # in order: a param reads those before it
        (numbers.add if expr.is_number(numbers) else numbers.discard)(name)
    for name, tunable in spec.tunables.items():
        formulas = [f for d in spec.dispatch.defaults.values() if name in d
                    for f in ([d[name]] if isinstance(d[name], Expr) else d[name])]
        formulas += [o.fixed[name] for options in spec.variants.axes.values() for o in options.values()
                     if name in o.fixed]
        if (name not in spec.params and all(not isinstance(v, str) for vs in tunable.domain.values() for v in vs)
                and all(f.is_number(numbers) for f in formulas)):
            numbers.add(name)
    return frozenset(numbers)


def _all_exprs(spec: OpSpec) -> list[Expr]:
    exprs = list(spec.params.values()) + [c.rule for c in spec.checks]
    exprs += [f.expr if isinstance(f, KeyField) else f for f in spec.dispatch.key.values()]
    exprs += [v for d in spec.dispatch.defaults.values() for v in d.values() if isinstance(v, Expr)]
    for formulas in spec.budgets.values():
        for expr in formulas.values():
            exprs += list(expr.values()) if isinstance(expr, dict) else [expr]
    for options in spec.variants.axes.values():
        for o in options.values():
            exprs += [o.when, *o.fixed.values()]
    return exprs


def _table_file(root: Path, spec: OpSpec, inputs: OpInputs, chip: ChipProfile, env,
                kernel_hashes: dict[str, str], notes: list[str] | None = None) -> GeneratedFile:
    rec_path = records_mod.record_path(root, chip.name, spec.op)
    rel = rec_path.relative_to(root).as_posix()
    table = frozen_rows(spec, chip, rec_path, kernel_hashes)
    read = records_mod.read_paths(rec_path, chip)
    parent = [(p, name) for p, name in read if name != chip.name]
    files = [(p.relative_to(root).as_posix(), file_hash([p]) if p.exists() else "none") for p, _ in read]
    found = budget_formula(spec, chip)
    budget_kind = found[0] if found else None
    shown = layout(spec, table)
    tuned = len(shown["tuned"])
    how = (f": {table.measured} with the tuned point measured fastest there, the others"
           if table.measured else "")
    ranked = spec.dispatch.fill_rule == "ranked"
    kept = ""
    if table.kept or (ranked and table.defaulted):
        kept = f"{len(table.kept)} more left to the spec's default, measured fastest there"
        if table.defaulted:
            kept += (f" (and {table.defaulted} unmeasured ones where the ranked rule found it best, or no candidate "
                     "timed in their own dtype and flags serves them)" if ranked else
                     f" (and {table.defaulted} unmeasured ones nearer to such a bucket than to any row)")
        kept += ", "
    rule = "by the ranked rule" if ranked else "from the nearest tuned bucket"
    summary = (f"{tuned} tuned rows ({len(shown['configs'])} distinct configs), {table.filled} more bucket "
               f"combinations filled{how} {rule} (as {len(shown['fills'])} ranges), "
               f"{kept}{len(table.stale)} stale records not frozen"
               + (f"; measured buckets whose winner's search never ran the point measured fastest there, "
                  f"left to the measure step: {len(table.pending)}" if table.pending else "")
               + (", its torn last line skipped." if table.torn else "."))
    for path, name in parent:
        summary = (f"Frozen from the records of {name} ({path.relative_to(root).as_posix()}) and then {chip.name}'s "
                   f"own ({rel}): {chip.name}'s figures are {name}'s, so the same kernels fit and compile "
                   f"alike; a bucket {chip.name} has measured nothing of keeps the choice timed on {name}. "
                   f"{summary}")
    if table.torn and notes is not None:
        notes.append(f"{rec_path}: its last line is torn (a writer died mid-line) and was skipped; the "
                     "next `opgen tune` of this op and chip cuts it, or delete that line by hand")
    if table.toolchains.other and notes is not None:
        notes.append(f"table_{chip.name} of {spec.op}: {table.toolchains.warning()}")
    key_line = (f"Key: ({', '.join(spec.dispatch.key)}); the fields at BUCKETED hold bucket indices, "
                "their ranges are in the comments.")
    gate = []
    if tuned:
        filled = [r.key for r in table.rows if r.source is not None and r.measured is None]
        gate = wrap_comment(fill_gate(spec, chip, rec_path, kernel_hashes, filled).line())
    context = dict(header=inputs.header(files), op=spec.op, chip=chip.name,
                   backend=chip.backend, rendering=chip.rendering, budget_kind=budget_kind,
                   budget=chip.budget(budget_kind) if budget_kind else None,
                   programs=chip.programs, key_names=tuple(spec.dispatch.key), **shown,
                   summary=[*wrap_comment(summary), *gate, *wrap_comment(table.checks.line()),
                            *(line for text in [*table.toolchains.lines(), table.rekeyed_line()] if text
                              for line in wrap_comment(text)),
                            *wrap_comment(key_line), *wrap_comment(f"Chip figures: {chip.source}")],
                   stale=[wrap_comment(f"stale, not frozen: {s.record.variant} at {s.record.key!r}: "
                                       f"{s.reason}") for s in table.stale])
    text = render(env, "table.py.j2", context, WIDTH)
    return GeneratedFile(f"{GENERATED}/{spec.op}/table_{chip.name}.py", text)


def build_op(root: Path, spec: OpSpec, notes: list[str] | None = None) -> list[GeneratedFile]:
    """Every generated file of one op, once its cases run through its checks and defaults; what a
    person should know of its records goes to ``notes``."""
    check_paths(spec, root)
    check_cases(spec)
    env = op_environment(root, spec.op)
    inputs = op_inputs(root, spec)
    base = f"{GENERATED}/{spec.op}"
    files = [GeneratedFile(f"{base}/__init__.py", render(env, spec.api.template, _api_context(spec, inputs), WIDTH))]
    kernels_doc = f'"""Kernel modules of {spec.op}, one per variant and rendering."""\n'
    kernel_header = op_inputs(root, spec, driver=False).header()
    files.append(GeneratedFile(f"{base}/kernels/__init__.py", format_source(kernel_header + kernels_doc)))
    hashes: dict[str, dict[str, str]] = {}
    for rendering in RENDERINGS:
        doc = f'"""{spec.op} kernels rendered for {rendering}."""\n'
        files.append(GeneratedFile(f"{base}/kernels/{rendering}/__init__.py", format_source(kernel_header + doc)))
        if spec.api.strided:
            doc = (f'"""{spec.op} kernels rendered for {rendering}, strided twins: '
                   f'{", ".join(spec.api.strided)} taken through their strides (no tuning records)."""\n')
            files.append(GeneratedFile(f"{base}/kernels/{rendering}/strided/__init__.py",
                                       format_source(kernel_header + doc)))
    for kernel in render_kernels(root, spec, RENDERINGS, env, twins=True):
        if not kernel.strided:  # the twins have no records: no table reads their hashes
            hashes.setdefault(kernel.rendering, {})[kernel.variant] = kernel.hash
        files.append(GeneratedFile(kernel.path, kernel.text))
    for chip in PROFILES.values():
        files.append(_table_file(root, spec, inputs, chip, env, hashes[chip.rendering], notes))
    return files


def build_all(root: Path, notes: list[str] | None = None) -> list[GeneratedFile]:
    """Every file of ``generated/`` for every spec under ``specs/``, sorted by path; what a person
    should know of the records (a torn last line skipped) goes to ``notes``."""
    specs = load_specs(root / "specs", root)
    if not specs:
        raise BuildError(f"no specs under {root / 'specs'}")
    doc = '"""Generated operators. Import `generated.<op>`; never edit: run `opgen build`."""\n'
    hashes = content_hash(s.op for s in specs)
    files = [GeneratedFile(f"{GENERATED}/__init__.py",
                           format_source(header([("ops", ", ".join(s.op for s in specs), hashes)]) + doc)),
             _interpreter_file()]
    for spec in specs:
        files.extend(build_op(root, spec, notes))
    return sorted(files, key=lambda f: f.path)


def _interpreter_file() -> GeneratedFile:
    """``generated/_interpreter.py``: bf16 by value in the Triton interpreter, the copy of
    ``opgen/run/interpreter.py`` that the public API of every op applies under ``TRITON_INTERPRET=1``
    (generated code never imports opgen)."""
    text = (Path(__file__).resolve().parents[1] / "run" / "interpreter.py").read_text(encoding="utf-8")
    return GeneratedFile(f"{GENERATED}/_interpreter.py",
                         header([("source", "opgen/run/interpreter.py", content_hash([text]))]) + text)


def stale(root: Path, files: list[GeneratedFile]) -> list[str]:
    """Paths that differ from ``files``: changed, missing, a link or a folder where a file
    belongs, executable, or on disk but not generated (a link, or any file but the bytecode
    Python caches in ``__pycache__``)."""
    wanted = {f.path: f.text for f in files}
    out = []
    for path, text in wanted.items():
        target = root / path
        if (target.is_symlink() or not target.is_file() or target.stat().st_mode & 0o111
                or target.read_bytes() != text.encode("utf-8")):
            out.append(path)
    on_disk = {p.relative_to(root).as_posix() for p in (root / GENERATED).rglob("*")
               if (p.is_symlink() or not p.is_dir()) and not _bytecode(p)}
    out.extend(sorted(on_disk - set(wanted)))
    return sorted(out)


def _bytecode(path: Path) -> bool:
    """A cache file Python writes beside the generated modules (never compared)."""
    return path.parent.name == "__pycache__" and path.suffix == ".pyc" and not path.is_symlink()


def write(root: Path, files: list[GeneratedFile]) -> list[str]:
    """Write ``files`` (plain files, not executable), delete what else is under ``generated/``
    and the folders left empty; return the paths changed."""
    changed = stale(root, files)
    wanted = {f.path: f.text for f in files}
    for path in changed:
        target = root / path
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        if path in wanted:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(wanted[path].encode("utf-8"))
            target.chmod(0o644)
    for folder in sorted((p for p in (root / GENERATED).rglob("*") if p.is_dir() and not p.is_symlink()),
                         key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    return changed
