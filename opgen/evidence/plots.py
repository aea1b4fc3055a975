"""The PNG plots of ``opgen report`` (matplotlib, Agg backend): speed and error against a
baseline per case, on-chip budget headroom per frozen choice, tuning history per study. Each
function takes values (never text) and writes one file. Uses ``review_data``.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError
from .review_data import GOOD, BenchRun, Headroom, Study

_DPI = 100
_OURS, _BASE, _GOOD_C, _BAD_C = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display).

    Raises:
        UsageError: where matplotlib is not installed, naming the extra that installs it.
    """
    try:
        import matplotlib
    except ImportError:
        raise UsageError("opgen report draws its plots with matplotlib: pip install -e '.[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_matplotlib() -> None:
    """Raise the error :func:`_pyplot` raises where matplotlib is missing, before any work."""
    _pyplot()


def _save(fig: Any, path: Path, tight: bool = True) -> None:
    """Write ``fig`` as a PNG; ``tight``: fit the layout to its text (slow for many panels, whose
    layout the caller fixes instead)."""
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=_DPI, metadata={"Software": None})
    _pyplot().close(fig)


def _height(rows: int) -> float:
    return 1.6 + 0.32 * rows


def speed(run: BenchRun, op: str, path: Path) -> None:
    """Speed-up over the baseline per case (horizontal bars), the geomean, 1.0x and the goal."""
    plt = _pyplot()
    results = list(run.results)
    fig, ax = plt.subplots(figsize=(9, _height(len(results))))
    ys = range(len(results))
    values = [r.speedup for r in results]
    ax.barh(ys, values, color=[_GOOD_C if v >= GOOD else _BASE if v >= 1 else _BAD_C for v in values])
    right = max(values + [GOOD]) * 1.25
    for y, v in zip(ys, values):  # in a column of their own, clear of the bars and lines
        ax.text(right * 0.99, y, f"{v:.3f}x", va="center", ha="right", fontsize=8)
    from matplotlib.patches import Patch

    ax.axvline(1.0, color="black", linewidth=0.8)
    lines = [ax.axvline(GOOD, color=_GOOD_C, linestyle="--", linewidth=1, label=f"{GOOD}x"),
             ax.axvline(run.geomean, color=_OURS, linestyle=":", linewidth=1.5, label=f"geomean {run.geomean:.3f}x")]
    patches = [Patch(color=c, label=t) for c, t in ((_GOOD_C, f">= {GOOD}x"), (_BASE, f"1.0x to {GOOD}x"),
                                                    (_BAD_C, "< 1.0x"))]
    ax.set_yticks(list(ys), [r.case for r in results], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, right)
    ax.set_xlabel(f"speed-up over {run.baseline} ({run.baseline} time / ours, median device time)")
    ax.set_title(f"{op} vs {run.baseline}, case set {run.case_set}: "
                 f"{run.good}/{len(results)} cases at >= {GOOD}x", fontsize=10)
    ax.legend(handles=[*lines, *patches], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, path)


def error(run: BenchRun, op: str, path: Path) -> None:
    """Rel. L2 error against the float64 golden per case, ours beside the baseline's (log scale)."""
    plt = _pyplot()
    results = list(run.results)
    fig, ax = plt.subplots(figsize=(9, _height(len(results))))
    ys = list(range(len(results)))
    for y, r in zip(ys, results):
        ax.plot([r.ours_err, r.base_err], [y, y], color="lightgray", linewidth=1, zorder=1)
    ax.scatter([r.ours_err for r in results], ys, color=_OURS, marker="o", s=28, zorder=2, label="ours")
    ax.scatter([r.base_err for r in results], ys, color=_BASE, marker="s", s=28, zorder=2, label=run.baseline)
    ax.set_xscale("log")
    ax.grid(axis="x", which="both", color="#eeeeee", linewidth=0.6)
    ax.set_yticks(ys, [r.case for r in results], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("rel. L2 error of the first output against the float64 golden (log scale)")
    ax.set_title(f"{op} vs {run.baseline}, case set {run.case_set}: error no worse than "
                 f"{run.baseline} on {run.error_no_worse}/{len(results)}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, path)


def headroom(entries: Sequence[Headroom], op: str, chip: str, path: Path) -> None:
    """Each frozen choice's on-chip estimate (largest kernel) as a share of the chip's budget, and
    the compiler's figure where the records hold one."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, _height(len(entries))))
    ys = list(range(len(entries)))
    used = [e.used for e in entries]
    ax.barh(ys, used, color=[_BAD_C if u > 0.9 else _OURS for u in used], label="spec's estimate")
    reported = [(y, e.reported / e.limit) for y, e in zip(ys, entries) if e.reported is not None]
    if reported:
        ax.scatter([r for _, r in reported], [y for y, _ in reported], marker="D", color="black", s=18, zorder=3,
                   label="compiler's figure where tuned")
    for y, u, e in zip(ys, used, entries):  # right of the bar and of the compiler's mark
        ax.text(max(u, (e.reported or 0) / e.limit) + 0.01, y, f"{u:.0%}", va="center", fontsize=8)
    ax.axvline(1.0, color=_BAD_C, linewidth=1)
    ax.set_xlim(0, 1.12)
    ax.set_yticks(ys, [f"{e.label} ({e.row})" for e in entries], fontsize=8)
    ax.invert_yaxis()
    kind = entries[0].kind if entries else "budget"
    limit = entries[0].limit if entries else 0
    ax.set_xlabel(f"{kind} of the largest kernel / {chip}'s budget ({limit} bytes)")
    ax.set_title(f"{op} on {chip}: on-chip budget used by each frozen choice", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, path)


def history_all(studies: Sequence[Study], op: str, path: Path) -> None:
    """Every study's best time so far against its trials, as a multiple of the study's best."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    longest = 0
    for s in studies:
        best = s.best
        if best is None:
            continue
        ys = [math.nan if b is None else b / best for b in s.best_so_far]
        longest = max(longest, len(ys))
        ax.plot(range(1, len(ys) + 1), ys, color=_OURS if s.current else "gray", alpha=0.35, linewidth=0.8,
                drawstyle="steps-post")
    ax.plot([], [], color=_OURS, label="on the current kernels")
    ax.plot([], [], color="gray", label="on kernels since changed")
    ax.set_yscale("log")
    ax.set_xlim(1, max(longest, 2))
    ax.set_xlabel("trial of the study (in the order it measured them)")
    ax.set_ylabel("best so far / the study's best")
    measured = sum(s.best is not None for s in studies)
    ax.set_title(f"{op}: best so far against trials, {measured} studies with a measured point", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    _save(fig, path)


def history_buckets(studies: Sequence[Study], op: str, path: Path, columns: int = 3) -> None:
    """One panel per bucket: the best time so far against the trials of each study there, one
    colour per variant (a variant may have several studies: campaigns on other cases or domains)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    buckets: dict[str, list[Study]] = {}
    for s in studies:
        if s.best is not None:
            buckets.setdefault(s.bucket, []).append(s)
    variants = sorted({s.variant for group in buckets.values() for s in group})
    palette = plt.get_cmap("tab20").colors
    colour = {v: palette[i % len(palette)] for i, v in enumerate(variants)}
    names = list(buckets)
    rows = max(1, math.ceil(len(names) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.2 * rows + 0.9), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(names):
            ax.axis("off")
            continue
        for s in buckets[names[i]]:
            ys = [math.nan if b is None else b for b in s.best_so_far]
            ax.plot(range(1, len(ys) + 1), ys, color=colour[s.variant], linewidth=1, drawstyle="steps-post",
                    marker=".", markersize=3)
        ax.set_title(_wrap(names[i], 60), fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("best so far (ms)", fontsize=7)
        values = [b for s in buckets[names[i]] for b in s.best_so_far if b is not None]
        if min(values) > 0 and max(values) / min(values) > 10:  # a slow first point would flatten the rest
            ax.set_yscale("log")
            ax.set_ylabel("best so far (ms, log scale)", fontsize=7)
        ax.set_xlabel("trial", fontsize=7)
        ax.tick_params(which="both", labelsize=7)
    handles = [plt.Line2D([], [], color=colour[v], label=v) for v in variants]
    height = 3.2 * rows + 0.9
    legend = 0.2 * math.ceil(len(variants) / 4)  # inches
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"{op}: best time so far per study on the current kernels, one panel per bucket", fontsize=11,
                 y=1 - 0.15 / height, va="top")
    # fixed margins in inches (tight_layout over many panels takes seconds): titles of two lines
    # above each panel, tick labels and the axis label left of it, the legend below
    fig.subplots_adjust(left=0.7 / (5.2 * columns), right=1 - 0.15 / (5.2 * columns),
                        top=1 - 0.95 / height, bottom=(0.55 + legend) / height, wspace=0.22, hspace=0.6)
    _save(fig, path, tight=False)


def _wrap(text: str, width: int) -> str:
    """``text`` broken between its fields (at ``", "`` before a name) into lines of about ``width`` characters."""
    lines: list[str] = []
    for part in re.split(r", (?=\D)", text):  # not inside a range: "(256, 2048]"
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += ", " + part
        else:
            lines.append(part)
    return "\n".join(lines)
