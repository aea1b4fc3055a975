"""``opgen report``: one markdown page with PNG plots, for a merge request, of one op on one chip
from the committed files alone (no device): speed against each baseline per case, error against
the float64 golden beside the baseline's, the on-chip budget headroom of every frozen choice, the
tuning history per study and the tests that name the op; each section says where its figures
come from and the command that reproduces them. Uses ``review_data``, ``plots``.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..spec.hardware import ChipProfile
from ..spec.spec import OpSpec
from ..storage.storage import shown
from . import plots
from .review_data import GOOD, RUNS, BenchRun, Headroom, ReviewData, gather


def write(root: Path, spec: OpSpec, chip: ChipProfile, out: Path, storage: str | None = None) -> list[Path]:
    """Write the page and its plots into ``out``; the files written, the page first."""
    plots.check_matplotlib()
    data = gather(root, spec, chip, storage)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{spec.op}-{chip.name}"
    written: list[Path] = []

    def png(name: str) -> Path:
        path = out / f"{stem}-{name}.png"
        written.append(path)
        return path

    sections = [_head(root, data)]
    for run in data.runs:
        tag = f"{run.baseline}-{run.cases}"
        plots.speed(run, spec.op, png(f"speed-{tag}"))
        plots.error(run, spec.op, png(f"error-{tag}"))
        sections.append(_speed(data, run, written[-2].name))
        sections.append(_error(spec, run, written[-1].name))
    if not data.runs:
        sections.append(f"## Speed and error against a baseline\n\nNot recorded: `{RUNS}` names no "
                        f"benchmark run of {spec.op} on {chip.name}.")
    if data.headroom:
        plots.headroom(data.headroom, spec.op, chip.name, png("headroom"))
    sections.append(_headroom(root, data, written[-1].name if data.headroom else None))
    history = [s for s in data.studies if s.best is not None]
    names = []
    if history:
        plots.history_all(data.studies, spec.op, png("history"))
        names.append(written[-1].name)
        current = [s for s in history if s.current]
        if current:
            plots.history_buckets(current, spec.op, png("history-buckets"))
            names.append(written[-1].name)
    sections.append(_history(root, data, names))
    sections.append(_tests(data))
    page = out / f"{stem}.md"
    page.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return [page, *written]


def _rel(root: Path, path: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _toolchain(toolchain: dict[str, str]) -> str:
    device = toolchain.get("device", "a device not recorded")
    rest = ", ".join(f"{k} {v}" for k, v in sorted(toolchain.items()) if k != "device")
    return f"{device} ({rest})" if rest else device


def _head(root: Path, data: ReviewData) -> str:
    spec, chip = data.spec, data.chip
    kind = {"cuda": "smem_bytes", "npu": "ub_bytes"}.get(chip.backend)
    budget = f"; on-chip budget {kind} {chip.budget(kind)} bytes" if kind and chip.budget(kind) else ""
    devices = sorted({_toolchain(r.toolchain) for r in data.runs})
    lines = [
        f"# {spec.op} on {chip.name}",
        "",
        f"Written by `opgen report {spec.op} --chip {chip.name}` from the committed files alone, no device: "
        f"`specs/{spec.op}.yaml`, `{_rel(root, data.records)}`, the benchmark runs `{RUNS}` names and "
        "`tests/`.",
        "",
        f"- Hardware: chip profile `{chip.name}` ({chip.source}{budget}); the benchmarks ran on "
        + ("; ".join(devices) if devices else "no benchmark recorded") + ", as their JSON records.",
        f"- This tree's generated code: `generated/{spec.op}/` {data.generated_now} (the hash `opgen bench` "
        "records); each section names the code its figures were measured on.",
    ]
    return "\n".join(lines)


def _speed(data: ReviewData, run: BenchRun, image: str) -> str:
    spec, worst = data.spec, run.worst
    code = f"generated code {run.generated}" + (
        f" (`generated/{spec.op}/` of commit {run.commit})" if run.commit else "")
    if run.generated != data.generated_now:
        code += f"; this tree's ({data.generated_now}) differs, so the figures are of that code"
    sources = ", ".join(f"`benchmarks/{f}`" for f in run.files)
    dirty = [r for r in run.results if not math.isnan(r.ours_dirty_ms) and not math.isnan(r.base_dirty_ms)]
    write_flush = (f"{_geomean([r.base_dirty_ms / r.ours_dirty_ms for r in dirty]):.3f}x geomean over "
                   f"{len(dirty)} cases" if dirty else "not recorded")
    lines = [
        f"## Speed against {run.baseline} ({run.case_set}, {len(run.results)} cases)",
        "",
        f"- Measured on {_toolchain(run.toolchain)}, {code}.",
        f"- Source: {sources}" + (f" ({len(run.files)} shards joined in the case set's order)"
                                  if len(run.files) > 1 else "")
        + (f"; the table `benchmarks/{run.table}`" if run.table else "") + ".",
    ]
    lines += [
        (f"- Reproduce" + (f" (on a checkout of commit {run.commit})" if run.commit else "")
         + f": `{run.command}`") if run.command else "- Reproduce: not recorded.",
        "",
        f"| geomean speed-up | min | cases at >= {GOOD}x |",
        "| --- | --- | --- |",
        f"| {run.geomean:.3f}x | {worst.speedup:.3f}x ({worst.case}) | {run.good}/{len(run.results)} |",
        "",
        f"![speed-up over {run.baseline} per case]({image})",
        "",
        "Median device times, side by side in one process per case (`benchmarks/README.md`, timing "
        f"protocol). The same run under write-flush timing (flush and hold zero-fill their buffer): {write_flush}.",
    ]
    return "\n".join(lines)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _error(spec: OpSpec, run: BenchRun, image: str) -> str:
    first = next(iter(spec.signature.outputs))
    ours = [r.ours_err for r in run.results]
    base = [r.base_err for r in run.results]
    rows = "\n".join(f"| {r.case} | {r.ours_ms:.4f} | {r.base_ms:.4f} | {r.speedup:.3f}x | {r.ours_err:.2e} | "
                     f"{r.base_err:.2e} |" for r in run.results)
    return "\n".join([
        f"## Error against the float64 golden, beside {run.baseline}'s ({run.case_set})",
        "",
        f"Rel. L2 of the first output (`{first}`) against the float64 golden, from the same run: ours "
        f"{min(ours):.2e}..{max(ours):.2e}, {run.baseline} {min(base):.2e}..{max(base):.2e}; ours no worse on "
        f"{run.error_no_worse}/{len(run.results)} cases.",
        "",
        f"![rel. L2 error per case, ours and {run.baseline}]({image})",
        "",
        "<details><summary>per case</summary>",
        "",
        f"| case | ours ms | {run.baseline} ms | speed-up | error ours | error {run.baseline} |",
        "| --- | --- | --- | --- | --- | --- |",
        rows,
        "",
        "</details>",
    ])


def _explain_command(spec: OpSpec, chip: ChipProfile, entry: Headroom) -> str:
    words = " ".join(f"{k}={v}" for k, v in entry.case.items())
    return f"opgen explain {spec.op} --chip {chip.name} {words}"


def _headroom(root: Path, data: ReviewData, image: str | None) -> str:
    spec, chip, table = data.spec, data.chip, data.table
    tuned = sum(r.source is None for r in table.rows)
    lines = ["## Budget headroom of the frozen choices", ""]
    if tuned:
        lines.append(f"The frozen table of {chip.name} (`generated/{spec.op}/table_{chip.name}.py`, from "
                     f"`{_rel(root, data.records)}`) holds {tuned} tuned rows, each shown at the case it was "
                     f"tuned on; {table.filled} more bucket combinations are filled with their configs, which "
                     "the fill admits only where they fit the budget at the bucket's representative shape.")
    else:
        lines.append(f"The frozen table of {chip.name} holds no tuned row ({len(table.stale)} stale winners "
                     f"not frozen: `opgen records {spec.op} --chip {chip.name}` says why).")
    others = [e for e in data.headroom if e.row != "tuned"]
    if others:
        lines.append(f"Shown too: the choice ({', '.join(sorted({e.row for e in others}))}) of each benchmark "
                     "case whose bucket has no tuned row, once per bucket.")
    if not data.headroom:
        lines += ["", f"Not recorded: the spec gives no budget formula for {chip.name}, or nothing is frozen."]
        return "\n".join(lines)
    worst = max(data.headroom, key=lambda e: e.used)
    lines += [
        "The estimate is the spec's budget formula for the largest kernel of the choice; the compiler's "
        "figure is the one the tuning records hold for a tuned row (on its case).",
        "",
        f"Least headroom: {1 - worst.used:.0%} ({worst.label}, {worst.worst} of {worst.limit} bytes).",
        "",
        f"![on-chip budget per frozen choice]({image})",
        "",
        "<details><summary>per choice, and the command that shows each</summary>",
        "",
        "| choice | row | bucket | estimate | compiler | budget | headroom |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in data.headroom:
        reported = "not recorded" if e.reported is None else str(e.reported)
        lines.append(f"| {e.label} | {e.row} | {e.bucket} | {e.worst} | {reported} | {e.limit} | {1 - e.used:.0%} |")
    lines += ["", "`opgen explain` shows one row with its case, the first one: `"
              + _explain_command(spec, chip, data.headroom[0]) + "`.", "", "</details>"]
    return "\n".join(lines)


def _history(root: Path, data: ReviewData, images: list[str]) -> str:
    studies = data.studies
    trials = sum(len(s.medians) for s in studies)
    measured = sum(m is not None for s in studies for m in s.medians)
    lines = ["## Tuning history", ""]
    if data.storage:
        lines.append(f"From the optuna storage `{shown(data.storage)}`: each study's trials in trial-number order, "
                     "the value of each complete trial.")
    else:
        lines.append(f"No optuna storage is committed (`opgen tune` keeps its journal in `.tune/`, outside git); "
                     f"the history is rebuilt from the trial records of `{_rel(root, data.records)}`: each "
                     "study's trials of the search in the order they were recorded, one series per study and "
                     "flush, a trial's median where its point was correct (failed, timed-out and over-budget "
                     "points count as trials without a time). `opgen report --storage URL` reads a storage "
                     "instead.")
    current = [s for s in studies if s.current]
    lines += ["", f"{len(studies)} studies, {trials} trials ({measured} with a time); {len(current)} studies "
              "measured the current kernels."]
    if images:
        lines += ["", f"![best so far against trials, every study]({images[0]})"]
    if len(images) > 1:
        lines += ["", f"![best so far per study on the current kernels, per bucket]({images[1]})"]
    if not images:
        lines += ["", "Not recorded: no trial with a time."]
    if data.campaigns:
        lines += ["", "The campaigns that appended the records, each command run on a checkout of its commit "
                  f"(`benchmarks/runs.yaml`; `opgen records {data.spec.op} --chip {data.chip.name}` shows them "
                  "per bucket):", ""]
        lines += [f"- {commit}: " + (f"`{command}`" if command else "command not recorded")
                  for commit, command in data.campaigns]
    return "\n".join(lines)


def _tests(data: ReviewData) -> str:
    count = sum(len(v) for v in data.tests.values())
    op = data.spec.op
    rows = "\n".join(f"| `{f}` | {len(names)} |" for f, names in data.tests.items())
    files = " ".join(data.tests)
    return "\n".join([
        "## Tests",
        "",
        f"{count} test functions in {len(data.tests)} files name `{op}`, counted statically: a function "
        f"whose decorators or body hold a string naming it, or use a name of their file (an import, a "
        "constant, a helper, a fixture) that does, and every function of a file named after it; a "
        "parametrized function counts once; fixtures of `conftest.py` are not followed, and tests run "
        "over every spec without naming it are not counted.",
        "",
        "| file | test functions |",
        "| --- | --- |",
        rows,
        "",
        f"Their files (other tests among them), on the CPU: `python -m pytest -q {files}`" if files
        else "No test names the op.",
    ])
