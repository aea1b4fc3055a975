"""Measure one point in an isolated process: compile, check against the golden, time.

The parent keeps one worker process and sends it tasks; a task that hangs is killed at its
timeout, a process that dies is recorded as a crash (or, killed by a signal from outside, as
``killed``: measured again by a later run), and either way a fresh worker serves the next task,
so one bad configuration never stops a study; workers die with the tuner (``lifetime``). Every
point is checked against the op's float64 golden before it is timed: a wrong result is a status,
never a time. Uses ``spec``, ``space``, ``accuracy``, ``bench``, ``backends``, ``errors``,
``lifetime``, ``compiled``.
"""
from __future__ import annotations

import importlib
import inspect
import multiprocessing as mp
import os
import re
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..backends import get_backend
from ..errors import WorkerError
from ..space.space import case_inputs, evaluate_params
from ..storage.records import STATUSES  # noqa: F401  (a Result's status is one of them)
from . import bench
from .compiled import kept_kernels, reported
from .lifetime import death, die_with_parent, track, untrack

# Substrings of compiler messages that mean "does not fit on chip" (Triton's OutOfResources on
# NVIDIA; BiShengIR's "ub overflow" on Ascend).
_OVER_BUDGET = ("out of resource", "OutOfResources", "ub overflow")
# Errors after which the device context cannot be trusted: the worker exits and is replaced.
_STARTUP_SECONDS = 300  # importing torch and triton in a fresh process, on a busy host
_CASES_KEPT = 4  # prepared cases (inputs and goldens) a worker keeps
_FATAL = ("illegal memory access", "CUDA error", "unspecified launch failure", "device-side assert")


@dataclass(frozen=True)
class Task:
    """One point of one case to compile, check and (optionally) time.

    Attributes:
        op, rendering, variant: which generated kernel module.
        point: tunable values.
        case: the case row (dims, dtype, optional scalars).
        backend: ``cuda``, ``npu`` or ``interpreter``; device: a torch device string.
        programs: cores of the device (persistent grids launch ``programs * occupancy``).
        max_rel_l2: the precision bar for this case's dtype, or None.
        timed: False to only compile and check.
    """

    op: str
    rendering: str
    variant: str
    point: tuple[tuple[str, Any], ...]
    case: tuple[tuple[str, Any], ...]
    backend: str
    device: str
    programs: int
    seed: int = 0
    max_rel_l2: float | None = None
    timed: bool = True
    protocol: bench.Protocol = bench.DEFAULT


@dataclass(frozen=True)
class Result:
    """What a task produced. ``status`` is one of :data:`STATUSES`."""

    status: str
    reason: str = ""
    median_ms: float | None = None
    times_ms: tuple[float, ...] = ()
    error: dict[str, float] = field(default_factory=dict)
    reported: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def timeout_reason(seconds: float) -> str:
    """The reason of a ``timeout`` result: the limit it ran under, read back by
    :func:`timeout_of_reason`."""
    return f"no result after {seconds:g} s"


def timeout_of_reason(reason: str) -> float | None:
    """The limit a :func:`timeout_reason` names (None for any other reason)."""
    found = re.fullmatch(r"no result after ([0-9.e+-]+) s", reason)
    return float(found.group(1)) if found else None


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if any(s in text for s in _OVER_BUDGET):
        return "over_budget"
    if any(s in text for s in _FATAL):
        return "crash"
    return "compile_error"


class WorkerState:
    """A measuring process's state: the op's spec (given by value, never read again from disk), caches of
    backends and of each case's inputs and golden outputs."""

    def __init__(self, spec: Any) -> None:
        self.op_spec = spec
        self.backends: dict[tuple[str, str], Any] = {}
        self.cases: dict[tuple, dict[str, Any]] = {}

    def spec(self, task: Task):
        if task.op != self.op_spec.op:
            raise ValueError(f"a worker of {self.op_spec.op} was sent a task of {task.op}")
        return self.op_spec

    def backend(self, task: Task):
        key = (task.backend, task.device)
        if key not in self.backends:
            self.backends[key] = get_backend(task.backend, task.device)
        return self.backends[key]

    def case(self, task: Task, spec) -> dict[str, Any]:
        key = (task.op, task.case, task.seed, task.device)
        if key not in self.cases:
            # A bucket's cases alternate within every trial: keep a few, bounding device memory.
            while len(self.cases) >= _CASES_KEPT:
                del self.cases[next(iter(self.cases))]
            self.cases[key] = prepare_case(spec, dict(task.case), task.seed, task.device)
        return self.cases[key]


def resolve(path: str) -> Any:
    """The object named by a ``module:name`` path (a spec's references and baselines)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def case_arguments(spec, case: dict[str, Any], seed: int, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The params of one case and its inputs on ``device``: the op's arguments by name (an
    optional tensor the case leaves out is None), with what else the spec's ``make_inputs`` gave."""
    import torch

    params = evaluate_params(spec, case_inputs(spec, case))
    dims = {k: params[k] for k in spec.dim_symbols()}
    dtype = getattr(torch, case.get("dtype", "float32"))
    make = resolve(spec.reference.inputs)
    scalar_names = set(spec.signature.scalars)
    wanted = inspect.signature(make).parameters  # the scalars that shape the inputs (chunk_size)
    inputs = make(**dims, **{k: params[k] for k in scalar_names if k in wanted},
                  dtype=dtype, seed=seed, device=device)
    for name, arg in spec.signature.tensors.items():  # the case decides which optional inputs exist
        if arg.optional and not params[f"{name}_given"]:
            inputs[name] = None
    for name in scalar_names:  # the case (or the spec default) decides the scalars
        is_dtype = spec.signature.scalars[name].type == "dtype"
        inputs[name] = getattr(torch, params[name]) if is_dtype else params[name]
    return params, inputs


def prepare_case(spec, case: dict[str, Any], seed: int, device: str) -> dict[str, Any]:
    """Inputs on ``device`` plus the float64 golden, fp32 reference and magnitude of one case."""
    params, inputs = case_arguments(spec, case, seed, device)
    scalar_names = set(spec.signature.scalars)
    ref_device = device if device.startswith("cuda") else "cpu"
    ref_args = {k: inputs.get(k) for k in (*spec.signature.tensors, *scalar_names)}

    def reference(path: str):
        fn = resolve(path)  # a reference takes the op's arguments it needs (not e.g. output_dtype)
        wanted = inspect.signature(fn).parameters
        return fn(**{k: v for k, v in ref_args.items() if k in wanted}, device=ref_device)

    gold = reference(spec.reference.golden)
    ref32 = reference(spec.reference.fp32)
    mag = reference(spec.reference.magnitude)
    half_rel_l2 = None  # the upstream half-precision computation's error on the first output
    if spec.reference.half is not None and spec.accuracy.half_ratio is not None:
        from .accuracy import rel_l2  # accuracy imports torch: loaded with the first case prepared, not with the module

        first = next(iter(spec.signature.outputs))
        half = reference(spec.reference.half)
        pick = (lambda t: t[first]) if isinstance(gold, dict) else (lambda t: t)
        half_rel_l2 = rel_l2(pick(half), pick(gold))
    return dict(params=params, inputs=inputs, golden=gold, ref32=ref32, magnitude=mag, half_rel_l2=half_rel_l2)


def precision_bar(spec, case: dict[str, Any], max_rel_l2: float | None) -> float | None:
    """The rel. L2 bar of a case's first output: the spec's bar for its dtype (``max_rel_l2``),
    raised to ``accuracy.half_ratio`` times the upstream half-precision computation's error
    where that is higher (a case on which no half-precision kernel can meet the fixed bar)."""
    half = case.get("half_rel_l2")
    if half is None or max_rel_l2 is None:
        return max_rel_l2
    return max(max_rel_l2, spec.accuracy.half_ratio * half)


def _outputs(spec, params: dict[str, Any], inputs: dict[str, Any], device: str) -> dict[str, Any]:
    """The op's outputs, allocated as the generated API does (None where ``when`` is false)."""
    import torch

    outs: dict[str, Any] = {}
    for name, out in spec.signature.outputs.items():
        if out.when is not None and not out.when.evaluate(params):
            outs[name] = None
            continue
        if out.dtype in spec.signature.tensors:
            dtype = inputs[out.dtype].dtype
        else:
            dtype = getattr(torch, params.get(out.dtype, out.dtype))
        outs[name] = torch.empty(tuple(params[d] for d in out.dims), dtype=dtype, device=device)
    return outs


def _per_output(spec, case: dict[str, Any]):
    """``(name, golden, ref32, magnitude)`` per output; a reference may return one tensor (the
    op's only output) or a dict by output name."""
    golds, refs, mags = case["golden"], case["ref32"], case["magnitude"]
    if not isinstance(golds, dict):
        name = next(iter(spec.signature.outputs))
        golds, refs, mags = {name: golds}, {name: refs}, {name: mags}
    for name in spec.signature.outputs:
        yield name, golds.get(name), refs.get(name), mags.get(name)


def run_task(task: Task, state: WorkerState) -> Result:
    """Compile, check and time one point in this process (the worker's body)."""
    from . import accuracy  # imports torch: loaded in the worker process, not in the tuner

    start = time.perf_counter()
    spec = state.spec(task)
    backend = state.backend(task)
    case = state.case(task, spec)
    module = importlib.import_module(f"generated.{task.op}.kernels.{task.rendering}.{task.variant}")
    point = dict(task.point)
    outputs = _outputs(spec, case["params"], case["inputs"], task.device)
    values = {**case["params"], **case["inputs"], **outputs}
    kwargs = {name: values.get(name) for name in spec.api.launch_args}  # absent optional inputs: None
    programs = task.programs * int(point.get("occupancy", 1))

    def call():
        return module.launch(**kwargs, num_programs=programs, point=point)

    try:
        with kept_kernels() as kernels:
            returned = call()
        backend.synchronize()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a status
        return Result(_classify(exc), f"{type(exc).__name__}: {str(exc)[:2000]}",
                      seconds=time.perf_counter() - start)
    error: dict[str, float] = {}
    first = next(iter(spec.signature.outputs))
    for name, gold, ref32, mag in _per_output(spec, case):
        out = outputs[name]
        if (gold is None) != (out is None):
            return Result("wrong_result", f"{name}: produced {out is not None}, expected {gold is not None}",
                          error=error, seconds=time.perf_counter() - start)
        if gold is None:
            continue
        report = accuracy.check_all(out, gold, ref32, mag if spec.accuracy.domain_check else None)
        prefix = "" if name == first else f"{name}."
        error.update({f"{prefix}rel_l2": report.rel_l2, f"{prefix}max_abs_rel": report.max_abs_rel,
                      f"{prefix}ref_rel_l2": report.dual.ref32_rms})
        if not report.passed:
            return Result("wrong_result", f"{name}: {report.summary()}", error=error,
                          seconds=time.perf_counter() - start)
        bar = precision_bar(spec, case, task.max_rel_l2) if name == first else None
        if bar is not None and report.rel_l2 > bar:
            half = case.get("half_rel_l2")
            why = "" if half is None else f"; the half-precision reference's {half:.3g}"
            return Result("wrong_result", f"rel_l2 {report.rel_l2:.3g} above the bar {bar:.3g}{why}",
                          error=error, seconds=time.perf_counter() - start)
    times: list[float] = []
    if task.timed:
        times = bench.measure(backend, call, task.protocol)
    return Result("ok", "", bench.median(times) if times else None, tuple(times), error,
                  reported(kernels or [returned]), time.perf_counter() - start)


def _serve(conn, root: str, env: dict[str, str], spec: Any, parent: int) -> None:
    """Worker process loop: run tasks of ``spec``'s op until told to stop or the device context
    is suspect.

    ``env`` is applied before anything imports triton (TRITON_INTERPRET is read at import);
    under the interpreter, bf16 is computed by value (``opgen.run.interpreter``)."""
    die_with_parent(parent)
    os.environ.update(env)
    sys.path.insert(0, root)
    import torch  # noqa: F401  (imported before "ready": start-up is not charged to a task)
    import triton  # noqa: F401

    if os.environ.get("TRITON_INTERPRET") == "1":  # bf16 computed by value, as the API does there
        from .interpreter import patch_bf16  # imports numpy: only under the interpreter

        patch_bf16()

    conn.send("ready")
    state = WorkerState(spec)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            result = run_task(task, state)
        except Exception as exc:  # noqa: BLE001 - a driver-side failure is reported, not lost
            result = Result("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")
        conn.send(result)
        if result.status == "crash":
            return


class Worker:
    """A replaceable worker process with a per-task timeout, serving tasks of one op.

    Args:
        spec: the op's spec, handed to each process it starts (a process never reads specs).
        root: the project root (its ``generated/`` is imported).
        env: environment variables set in the process before it imports triton.
    """

    def __init__(self, spec: Any, root: str, env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.root = root
        self.env = dict(env or {})
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._stopping = False

    def start(self) -> None:
        """Start the process unless it runs. Start workers from the thread that outlives them:
        on Linux a worker dies with the thread that started it."""
        if self._proc is None or not self._proc.is_alive():
            self._start()

    def _start(self) -> None:
        if self._proc is not None:
            self.close(kill=True)
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.root, self.env, self.spec, os.getpid()),
                                       daemon=True)
        self._proc.start()
        self._stopping = False
        track(self)
        child.close()
        self._conn = parent
        try:
            ready = parent.poll(_STARTUP_SECONDS) and parent.recv() == "ready"
        except (EOFError, ConnectionResetError):
            ready = False
        if not ready:
            code = self._proc.exitcode
            self.close(kill=True)
            raise WorkerError(f"did not start within {_STARTUP_SECONDS} s (exit code {code}); its imports "
                              "(torch, triton, the generated package) failed or hung")

    def run(self, task: Task, timeout: float) -> Result:
        """Run ``task``; a hang past ``timeout`` seconds or a dead process becomes a status."""
        self.start()
        start = time.perf_counter()
        self._conn.send(task)
        if not self._conn.poll(timeout):
            self.close(kill=True)
            return Result("timeout", timeout_reason(timeout), seconds=time.perf_counter() - start)
        try:
            result = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._proc.join(timeout=5)
            code, by_us = self._proc.exitcode, self._stopping
            self.close(kill=True)
            status, reason = death(code, by_us)
            return Result(status, reason, seconds=time.perf_counter() - start)
        if result.status == "crash":
            self.close(kill=True)
        return result

    def close(self, kill: bool = False) -> None:
        """Stop the worker (politely unless ``kill``)."""
        if self._proc is None:
            return
        untrack(self)
        if kill:
            self.kill()
        else:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self.kill()
            self._proc.join()
        self._proc = self._conn = None

    def kill(self) -> None:
        """SIGKILL the process and its group now, without waiting (safe in a signal handler)."""
        proc = self._proc
        if proc is None or proc.pid is None:
            return
        self._stopping = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # its group is not set up yet, or gone
            pass
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

