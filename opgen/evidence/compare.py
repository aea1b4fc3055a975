"""``opgen bench``: a generated op and a baseline side by side, in one process, on the same inputs.

Prints per case both device times, the speed-up, the fraction of the memory floor (bytes the op
must move over the copy bandwidth measured in the same run), both errors against the float64
golden, the host time of one call of each (argument checks, dispatch and launch; the device times
exclude it, see ``bench``) and the first-call time of each (the baseline's includes its runtime
autotuning). Not a test: numbers depend on the device. Uses ``spec``, ``space``, ``bench``, ``backends``, ``accuracy``.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..backends import Backend
from ..errors import OpgenError
from ..render.render import content_hash
from ..run import bench
from ..run.worker import _outputs, case_arguments, prepare_case
from ..space.space import case_inputs, default_point, evaluate_params, find_variant, forced_point
from ..spec.spec import OpSpec


@dataclass(frozen=True)
class CaseResult:
    """One case of the comparison."""

    case: str
    ours_ms: float
    base_ms: float
    floor_ms: float
    ours_err: float
    base_err: float
    ours_first_s: float
    base_first_s: float
    ours_host_us: float
    base_host_us: float
    # Both medians again under write-flush timing (flush and hold zero-fill their buffer), so the
    # table shows what the cache's dirty lines cost; NaN in shards whose JSON lacks them.
    ours_dirty_ms: float = math.nan
    base_dirty_ms: float = math.nan
    # Output name -> rel. L2 of our output against the baseline's, for ops with several outputs
    # (empty for one output, and in shards whose JSON lacks it).
    agree: dict[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.base_ms / self.ours_ms


def copy_bandwidth(backend: Backend, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=backend.device)
    dst = torch.empty_like(src)
    times = bench.measure(backend, lambda: dst.copy_(src), bench.Protocol(warmup=3, repeat=20, flush=False))
    return 2 * nbytes / (bench.median(times) * 1e-3)


def case_id(row: dict[str, Any]) -> str:
    """A readable case id from its sizes: ``B4-T2048-H16-K128-V128-C64-bf16``."""
    short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
    dims = "-".join(f"{k}{v}" for k, v in row.items()
                    if k not in ("chunk_size", "dtype") and isinstance(v, int) and not isinstance(v, bool))
    chunk = f"-C{row['chunk_size']}" if "chunk_size" in row else ""
    return f"{dims}{chunk}-{short.get(row.get('dtype'), row.get('dtype'))}"


def run_case(spec: OpSpec, row: dict[str, Any], backend: Backend, base: Callable[..., Any],
             bandwidth: float, seed: int, rounds: int, protocol: bench.Protocol) -> CaseResult:
    """Time and check the generated op and the baseline on one case."""
    import torch

    from ..run.accuracy import rel_l2  # accuracy imports torch: loaded with the first case, not with the module

    op = getattr(importlib.import_module(f"generated.{spec.op}"), spec.op)
    case = prepare_case(spec, row, seed, backend.device)
    args = {name: case["inputs"].get(name) for name in (*spec.signature.tensors, *spec.signature.scalars)}
    outs, firsts = _first_calls(backend, op, base, args)
    errors = [rel_l2(_first(o), _first(case["golden"])) for o in outs]
    agree = agreement(list(spec.signature.outputs), outs[0], outs[1])
    fns = {"ours": _named("ours", op, args), "baseline": _named("baseline", base, args)}
    times = bench.side_by_side(backend, fns, rounds=rounds, protocol=protocol)
    dirty = bench.side_by_side(backend, fns, rounds=rounds, protocol=dataclasses.replace(protocol, dirty=True))
    hosts = [bench.host_overhead(backend, fns[side]) * 1e6 for side in ("ours", "baseline")]
    floor_s = spec.traffic_bytes.evaluate(case["params"]) / bandwidth if spec.traffic_bytes else math.nan
    del case, outs
    if backend.name == "cuda":
        torch.cuda.empty_cache()
    return CaseResult(case_id(row), times["ours"], times["baseline"], floor_s * 1e3, errors[0], errors[1],
                      firsts[0], firsts[1], hosts[0], hosts[1], dirty["ours"], dirty["baseline"], agree)


def compile_case(spec: OpSpec, row: dict[str, Any], backend: Backend, base: Callable[..., Any],
                 seed: int) -> tuple[float, float]:
    """Call the generated op and the baseline once each on one case's inputs, so that what they
    compile lands in the disk caches: no golden, no check, no timing. Returns each side's
    first-call seconds."""
    op = getattr(importlib.import_module(f"generated.{spec.op}"), spec.op)
    _, inputs = case_arguments(spec, row, seed, backend.device)
    args = {name: inputs.get(name) for name in (*spec.signature.tensors, *spec.signature.scalars)}
    _, firsts = _first_calls(backend, op, base, args)
    return firsts[0], firsts[1]


def _first_calls(backend: Backend, op: Callable[..., Any], base: Callable[..., Any],
                 args: dict[str, Any]) -> tuple[list[Any], list[float]]:
    """Each side's first call on ``args``, in turn: their outputs and seconds (compiles included);
    what a side raises becomes a :class:`CaseFailed` naming it."""
    outs, firsts = [], []
    for side, fn in (("ours", op), ("baseline", base)):
        start = time.perf_counter()
        try:
            outs.append(fn(**args))
            backend.synchronize()
        except Exception as exc:  # noqa: BLE001 - named, then the bench goes on with the next case
            raise CaseFailed(f"{side}: {failure_text(exc)}") from exc
        firsts.append(time.perf_counter() - start)
    return outs, firsts


def _named(side: str, fn: Callable[..., Any], args: dict[str, Any]) -> Callable[[], Any]:
    """``fn(**args)`` for the timed runs; what it raises there becomes a :class:`CaseFailed` that
    names the side and says it raised while timed."""
    def call() -> Any:
        try:
            return fn(**args)
        except Exception as exc:  # noqa: BLE001 - named, then the bench goes on with the next case
            raise CaseFailed(f"{side}, timed: {failure_text(exc)}") from exc
    return call


class CaseFailed(OpgenError):
    """One contender raised on a case, at its first call or while timed; the message names which
    and what it raised."""


def failure_text(exc: BaseException) -> str:
    """An exception as one line: its type, the first line of its message and, for a longer one,
    its last line that is no caret marker (a Triton compile error: where, then the statement)."""
    lines = [line.strip() for line in str(exc).splitlines() if set(line) - {" ", "^", "~"}]
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}" if lines else ""
    return f"{type(exc).__name__}: {text[:300]}"


def agreement(names: list[str], ours: Any, base: Any) -> dict[str, float]:
    """Output name -> rel. L2 of our output against the baseline's, over the outputs both return;
    empty for an op with one output (its error column says it all)."""
    from ..run.accuracy import rel_l2  # accuracy imports torch: loaded with the first case, not with the module

    if len(names) < 2:
        return {}
    mine, theirs = _by_name(names, ours), _by_name(names, base)
    return {name: rel_l2(mine[name], theirs[name]) for name in names
            if mine.get(name) is not None and theirs.get(name) is not None}


def _by_name(names: list[str], out: Any) -> dict[str, Any]:
    """An op's outputs by name: a dict as is, a tuple or list in the spec's output order."""
    if isinstance(out, dict):
        return dict(out)
    return dict(zip(names, out if isinstance(out, (tuple, list)) else (out,)))


def worst_agreement(agree: dict[str, float]) -> str:
    """The agreement column: the output that agrees least and its rel. L2 (``-`` when none)."""
    if not agree:
        return "-"
    name = max(agree, key=lambda n: _badness(agree[n]))
    return f"{name} {agree[name]:.2e}"


def _badness(value: float) -> tuple[bool, float]:
    """Order of disagreement: NaN worst, then larger rel. L2."""
    return (math.isnan(value), 0.0 if math.isnan(value) else value)


def _first(out: Any) -> Any:
    """The first output of an op (the error column reports it): a tensor, tuple or dict."""
    if isinstance(out, dict):
        return next(iter(out.values()))
    return out[0] if isinstance(out, (tuple, list)) else out


def variant_baseline(spec: OpSpec, profile: Any, options: dict[str, str]) -> Callable[..., Any]:
    """A baseline that runs the generated op with some axes forced (``stage0`` for mamba3): the
    other axes and the tunables come from the spec's defaults for the shape on ``profile``."""
    import torch

    def run(**args: Any) -> Any:
        dims: dict[str, Any] = {}
        for name, arg in spec.signature.tensors.items():
            if args.get(name) is not None:
                dims.update({d: n for d, n in zip(arg.dims, args[name].shape)})
        row = {k: v for k, v in dims.items() if k in spec.dim_symbols()}
        scalars = {k: (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v)
                   for k, v in args.items() if k in spec.signature.scalars}
        inputs = case_inputs(spec, {**row, **scalars})
        for name, arg in spec.signature.tensors.items():
            inputs[f"{name}_dtype"] = None if args.get(name) is None else str(args[name].dtype).removeprefix("torch.")
            if arg.optional:
                inputs[f"{name}_given"] = args.get(name) is not None
        params = evaluate_params(spec, inputs)
        chosen = default_point(spec, profile, params)
        flags = {**find_variant(spec, chosen.variant).flags, **options}
        variant = find_variant(spec, "_".join(flags[a] for a in spec.variants.axes))
        point = forced_point(spec, profile, variant, params).config
        module = importlib.import_module(f"generated.{spec.op}.kernels.{profile.rendering}.{variant.name}")
        first = next(a for a in args.values() if isinstance(a, torch.Tensor))
        outs = _outputs(spec, params, args, str(first.device))
        values = {**params, **args, **outs}
        module.launch(**{n: values.get(n) for n in spec.api.launch_args},
                      num_programs=profile.cores * int(point.get("occupancy", 1)), point=point)
        return tuple(outs.values())
    return run


def table(results: list[CaseResult], baseline: str) -> str:
    """The printed comparison with its summary lines; a last column ``agree`` (the output that
    agrees least with the baseline's, and its rel. L2) and a line of each output's worst
    agreement when some case has several outputs."""
    agreeing = any(r.agree for r in results)
    lines = [f"{'case':<34} {'ours ms':>9} {baseline + ' ms':>9} {'speedup':>8} {'floor ours':>10} "
             f"{'floor ' + baseline:>10} {'err ours':>9} {'err ' + baseline:>9} {'host ours us':>12} "
             f"{'host ' + baseline + ' us':>11} {'1st ours s':>10} {'1st ' + baseline + ' s':>10}"
             + (f" {'agree':>{_AGREE_WIDTH}}" if agreeing else "")]
    for r in results:
        lines.append(f"{r.case:<34} {r.ours_ms:>9.4f} {r.base_ms:>9.4f} {r.speedup:>7.3f}x "
                     f"{r.floor_ms / r.ours_ms:>10.3f} {r.floor_ms / r.base_ms:>10.3f} {r.ours_err:>9.2e} "
                     f"{r.base_err:>9.2e} {r.ours_host_us:>12.1f} {r.base_host_us:>11.1f} "
                     f"{r.ours_first_s:>10.2f} {r.base_first_s:>10.2f}"
                     + (f" {worst_agreement(r.agree):>{_AGREE_WIDTH}}" if agreeing else ""))
    if results:
        geo = bench.geomean([r.speedup for r in results])
        floor = bench.geomean([r.floor_ms / r.ours_ms for r in results])
        worst = min(results, key=lambda r: r.speedup)
        floors = [r for r in results if math.isfinite(r.floor_ms)]
        lines.append(f"geomean speedup {geo:.3f}x, min {worst.speedup:.3f}x ({worst.case}), "
                     f">=1.2x on {sum(r.speedup >= 1.2 for r in results)}/{len(results)}; "
                     f"geomean fraction of the memory floor {floor:.3f}"
                     + (f" ({floor_summary(floors, baseline)})" if floors else "") + "; error no worse than "
                     f"{baseline} on {sum(r.ours_err <= r.base_err for r in results)}/{len(results)}")
        dirty = [r for r in results if not math.isnan(r.ours_dirty_ms)]
        if dirty:
            lines.append(f"write-flush timing (the flush zero-fills), {len(dirty)} cases: "
                         f"geomean speedup {bench.geomean([r.base_dirty_ms / r.ours_dirty_ms for r in dirty]):.3f}x, "
                         f"fraction of the memory floor ours {bench.geomean([r.floor_ms / r.ours_dirty_ms for r in dirty]):.3f}, "
                         f"{baseline} {bench.geomean([r.floor_ms / r.base_dirty_ms for r in dirty]):.3f}")
        if agreeing:
            lines.append(agreement_summary(results, baseline))
    return "\n".join(lines)


_AGREE_WIDTH = 16  # "dmimo_o 4.12e-03"

LAUNCH_BOUND_MS = 0.02
"""Cases whose memory floor is under this are launch-bound: on the H200 a call of the GLA op's
smallest holdout shapes took 6-10 µs (ours and FLA's) against a floor under 1 µs, so a fixed cost
of that size, not the bytes, decides their fraction of the floor."""


def floor_summary(results: list[CaseResult], baseline: str) -> str:
    """The worst fraction of the memory floor, and the geomean and worst over the cases that are
    not launch-bound (floor at least :data:`LAUNCH_BOUND_MS`)."""
    worst = min(results, key=lambda r: r.floor_ms / r.ours_ms)
    text = f"min {worst.floor_ms / worst.ours_ms:.3f} ({worst.case})"
    big = [r for r in results if r.floor_ms >= LAUNCH_BOUND_MS]
    if len(big) == len(results):
        return text
    if not big:
        return text + f"; every case's floor is under {LAUNCH_BOUND_MS * 1e3:g} us (launch-bound)"
    low = min(big, key=lambda r: r.floor_ms / r.ours_ms)
    return (text + f"; over the {len(big)} of {len(results)} cases whose floor is at least "
            f"{LAUNCH_BOUND_MS * 1e3:g} us (the others are launch-bound): geomean ours "
            f"{bench.geomean([r.floor_ms / r.ours_ms for r in big]):.3f}, {baseline} "
            f"{bench.geomean([r.floor_ms / r.base_ms for r in big]):.3f}, min {low.floor_ms / low.ours_ms:.3f} ({low.case})")


def agreement_summary(results: list[CaseResult], baseline: str) -> str:
    """One line: per output, the largest rel. L2 against the baseline over the cases, and where."""
    worst: dict[str, tuple[float, str]] = {}
    for r in results:
        for name, value in r.agree.items():
            if name not in worst or _badness(value) > _badness(worst[name][0]):
                worst[name] = (value, r.case)
    parts = [f"{name} {value:.2e} ({case})" for name, (value, case) in worst.items()]
    return (f"agreement with {baseline} (rel. L2 of ours against it), worst case per output: "
            + ", ".join(parts))


def generated_hash(root: Path, op: str) -> str:
    """Identity of the generated code a benchmark runs: every file under ``generated/<op>/``, with
    its path (the kernels and the frozen tables)."""
    base = root / "generated" / op
    files = sorted(f for f in base.rglob("*.py") if "__pycache__" not in f.parts)
    return content_hash(f"{f.relative_to(base).as_posix()}\n{f.read_text(encoding='utf-8')}" for f in files)


def read_shards(rows: list[dict[str, Any]], files: list[Path],
                generated: str | None = None) -> tuple[list[CaseResult], dict[str, str], str]:
    """The results of the ``--json`` files of bench shards in the order of the case rows ``rows``,
    their toolchain and the hash of the generated code they measured: every case present once,
    one toolchain, one generated code (``generated`` where given, e.g. this tree's).

    Raises:
        OpgenError: naming the file, for a shard that is no JSON of a bench, says nothing of the
            generated code or measured other code, a case twice, outside the rows or missing (a
            case a shard lists as failed, with what it raised), or shards of different toolchains.
    """
    found: dict[str, CaseResult] = {}
    failed: dict[str, str] = {}
    toolchains: dict[str, Path] = {}
    for f in files:
        try:
            shard = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise OpgenError(f"bench shard {f}: cannot read it as JSON ({exc})") from None
        if not isinstance(shard, dict) or "generated" not in shard:
            raise OpgenError(f"bench shard {f} does not say which generated code it measured "
                             "(no 'generated' field): run that shard again")
        if generated is None:
            generated = shard["generated"]
        if shard["generated"] != generated:
            raise OpgenError(f"bench shard {f} measured generated code {shard['generated']}, but "
                             f"{generated} is wanted: run that shard again on the tree of {generated}")
        toolchains.setdefault(json.dumps(shard["toolchain"], sort_keys=True), f)
        for r in shard["results"]:
            if r["case"] in found:
                raise OpgenError(f"bench shards: case {r['case']} appears twice (again in {f})")
            found[r["case"]] = CaseResult(**r)
        failed.update({x["case"]: f"{x['error']} (in {f})" for x in shard.get("failed", ())})
    if len(toolchains) > 1:
        raise OpgenError(f"bench shards ran on different toolchains: {sorted(toolchains)}")
    order = [case_id(row) for row in rows]
    broken = [f"{c}: {failed[c]}" for c in order if c not in found and c in failed]
    if broken:
        raise OpgenError("bench cases failed: " + "; ".join(broken))
    missing = [c for c in order if c not in found]
    if missing:
        raise OpgenError(f"bench shards returned no result for {missing}")
    extra = sorted(set(found) - set(order))
    if extra:
        raise OpgenError(f"bench shards hold cases outside the case set: {extra}")
    return [found[c] for c in order], json.loads(next(iter(toolchains))), str(generated)
