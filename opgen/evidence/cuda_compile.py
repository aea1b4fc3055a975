"""What the compiler says of generated kernels for an NVIDIA chip, on a host without a GPU.

Each job (a variant, its tunables, a case's shape, the persistent grid's programs) is recorded as
the launches it makes (``opgen.evidence.launches``); each launch is bound by Triton's own binder (the
specialisation a launch on the device gets: constexprs, the 16-byte divisibility of pointers and
integers, integers equal to 1, the launch options) and compiled by ``triton.compile`` for
``GPUTarget("cuda", CC, 32)`` through a driver that names the target, as ``JITFunction.run`` would
compile it, minus the launch. ptxas's ``-v`` report gives the registers per thread, the spill
stores and loads and the stack frame (bytes); Triton's metadata the shared memory (bytes) and the
warps; the TTGIR the warp-group (wgmma) dots, and those with an M, N or K of 16 or 32. The
figures of each kernel are cached in ``<cache>/<key[:2]>/<key>.json``, the key being
Triton's compile key (the kernel's source and the functions it calls, specialisation,
constexprs, launch options, Triton's and ptxas's versions): a run compiles only the kernels that
changed, the distinct ones once, in ``workers`` processes where more than one is missing.

Needs a Triton with its NVIDIA backend (upstream 3.6; triton-ascend has none). ``opgen.evidence.resources``
runs ``python -m opgen.evidence.cuda_compile JOBS ANSWER --root R --cc CC --cache DIR --workers N`` under such
a Python where the running one lacks it (JOBS and ANSWER: JSON files). Uses ``launches``, ``spec``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from ..spec.spec import load_spec
from .launches import record

FORMAT = 2
"""Version of the cached figures: a change of what is read or how invalidates every entry."""

FIGURES = ("regs", "spill_stores", "spill_loads", "stack", "smem", "num_warps", "wgmma", "wgmma_small")
"""What each compiled kernel reports, as ints."""

SMALL_DIMS = (16, 32)
"""Product dims of the sm_90 wgmma fault form (triton-lang/triton#10486, #11366: several ``tl.dot``,
one with a dim of 16 or 32, reading shared memory out of bounds under Triton 3.6 to 3.7.1)."""


class _TargetDriver:
    """The least of a Triton driver that lets the JIT bind and compile for ``target`` without a device."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")


def has_nvidia_backend() -> bool:
    """Whether the Triton of this Python has its NVIDIA backend."""
    try:
        import triton.backends
    except ImportError:
        return False
    return "nvidia" in triton.backends.backends


def set_target(cc: int) -> None:
    """Make Triton's JIT bind and compile for NVIDIA compute capability ``cc`` with no device.

    Raises:
        RuntimeError: this Triton has no NVIDIA backend.
    """
    if not has_nvidia_backend():
        raise RuntimeError("this Triton has no NVIDIA backend (upstream triton==3.6.0 has it)")
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(_TargetDriver(GPUTarget("cuda", int(cc), 32)))


def target_text(cc: int) -> str:
    """The target and toolchain, for a person: ``sm_90a, Triton 3.6.0``."""
    import triton
    from triton.backends.nvidia.compiler import sm_arch_from_capability

    return f"{sm_arch_from_capability(int(cc))}, Triton {triton.__version__}"


# --- ptxas's report ---------------------------------------------------------------------------
_PROPERTIES = r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"


def ptxas_figures(log: str, name: str) -> dict[str, int] | None:
    """Registers, stack frame and spill bytes of the entry function ``name`` in a ``ptxas -v``
    report, or None where the report does not hold them all."""
    start = log.find(f"Compiling entry function '{name}'")
    if start < 0:
        return None
    block = log[start:]
    after = block.find("Compiling entry function", 1)
    block = block if after < 0 else block[:after]
    props = re.search(rf"Function properties for {re.escape(name)}\s*\n\s*{_PROPERTIES}", block)
    regs = re.search(r"Used (\d+) registers", block)
    if props is None or regs is None:
        return None
    stack, stores, loads = map(int, props.groups())
    return dict(regs=int(regs.group(1)), stack=stack, spill_stores=stores, spill_loads=loads)


def _ptxas_report(ptx: str, cc: int) -> str:
    """``ptxas -v`` run again on a kernel's PTX (its binary came from Triton's own cache)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        done = subprocess.run([get_ptxas(cc).path, "-v", f"--gpu-name={sm_arch_from_capability(cc)}", str(src),
                               "-o", str(Path(tmp) / "kernel.o")], capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


# --- the TTGIR's warp-group dots ---------------------------------------------------------------
_WGMMA = re.compile(r"ttng\.warp_group_dot\b(.*)")
_SHAPE = re.compile(r"(?:tensor|memdesc)<((?:\d+x)+)")


def wgmma_dims(line: str) -> tuple[int, int, int] | None:
    """M, N and K of the warp-group dot (``ttng.warp_group_dot``) on one TTGIR line, from its type
    signature ``A * B -> C`` (M and N the last two dims of C, K the last of A), or None where the
    line holds none.

    Raises:
        ValueError: a warp-group dot whose operand and result shapes are not found.
    """
    found = _WGMMA.search(line)
    if found is None:
        return None
    operands, _, result = found.group(1).split(" loc(")[0].rpartition("->")
    a, c = _SHAPE.findall(operands)[-2:-1], _SHAPE.findall(result)[:1]
    if not a or not c:
        raise ValueError(f"no operand and result shapes in a warp-group dot: {line.strip()[:300]}")
    a_dims, c_dims = ([int(d) for d in shape.rstrip("x").split("x")] for shape in (a[0], c[0]))
    return c_dims[-2], c_dims[-1], a_dims[-1]


def wgmma_figures(ttgir: str) -> dict[str, int]:
    """The warp-group dots of a kernel's TTGIR (``wgmma``) and those with an M, N or K in
    :data:`SMALL_DIMS` (``wgmma_small``)."""
    dims = [d for d in map(wgmma_dims, ttgir.splitlines()) if d is not None]
    return dict(wgmma=len(dims), wgmma_small=sum(any(x in SMALL_DIMS for x in d) for d in dims))


def is_wgmma_fault_form(kernel: Mapping[str, Any]) -> bool:
    """Whether a compiled kernel has the form of the sm_90 wgmma fault (triton-lang/triton#10486):
    at least two warp-group dots, one of them with a dim in :data:`SMALL_DIMS`."""
    return kernel.get("wgmma", 0) >= 2 and kernel.get("wgmma_small", 0) >= 1


# --- binding, keys, compiling -------------------------------------------------------------------
def _bound(launch: Any) -> tuple[Any, Any, Any, Any]:
    """Triton's compile source, target, backend and options of one recorded launch, formed as
    ``JITFunction.run`` forms them (its binder, then its packing of the arguments)."""
    from triton import knobs
    from triton.compiler.compiler import ASTSource
    from triton.runtime.driver import driver

    kernel = launch.kernel
    if not hasattr(kernel, "device_caches"):
        raise RuntimeError(f"{launch.name} is no JIT kernel (a module imported under TRITON_INTERPRET=1?): "
                           "compile in a process without it")
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    _, _, target, backend, binder = kernel.device_caches[driver.active.get_current_device()]
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return ASTSource(kernel, signature, constexprs, attrs), target, backend, options


def cache_key(launch: Any) -> str:
    """The cache key of a recorded launch's figures: Triton's own compile key, with :data:`FORMAT`."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import get_cache_key

    src, _, backend, options = _bound(launch)
    text = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    return hashlib.sha256(f"opgen-resources-{FORMAT}-{text}".encode()).hexdigest()


def _compile(launch: Any) -> dict[str, Any]:
    """Compile one recorded launch's kernel and read its figures."""
    import triton
    from triton import knobs

    src, target, _, options = _bound(launch)
    knobs.nvidia.dump_ptxas_log = True  # ptxas runs with -v; Triton prints its report with this
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        compiled = triton.compile(src, target=target, options=options.__dict__)
    meta = compiled.metadata
    figures = ptxas_figures(out.getvalue(), meta.name)
    if figures is None:  # no ptxas ran: Triton's own cache held the binary
        figures = ptxas_figures(_ptxas_report(compiled.asm["ptx"], target.arch), meta.name)
    if figures is None:
        raise RuntimeError(f"ptxas -v gave no figures for {meta.name}")
    return dict(name=meta.name, **figures, smem=meta.shared, num_warps=meta.num_warps,
                **wgmma_figures(compiled.asm["ttgir"]), num_stages=meta.num_stages,
                maxnreg=getattr(options, "maxnreg", None))


def _read(cache: Path, key: str) -> dict[str, Any] | None:
    path = cache / key[:2] / f"{key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(cache: Path, key: str, figures: Mapping[str, Any]) -> None:
    """Write one entry whole or not at all (a temporary file renamed over it)."""
    folder = cache / key[:2]
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(dict(figures), f, sort_keys=True)
    os.replace(tmp, folder / f"{key}.json")


# --- jobs ---------------------------------------------------------------------------------------
_SPECS: dict[tuple[str, str], Any] = {}


def _spec(root: str, op: str) -> Any:
    if (root, op) not in _SPECS:
        _SPECS[root, op] = load_spec(Path(root) / "specs" / f"{op}.yaml", Path(root))
    return _SPECS[root, op]


def _record(root: str, job: Mapping[str, Any]) -> list[Any]:
    return record(_spec(root, job["op"]), "cuda", job["variant"], job["config"], job["case"], job["programs"])


Task = tuple  # (root, job, launch index, cache key, cache folder, kernel name)


def _compile_task(task: Task) -> tuple[str, dict[str, Any]]:
    """One missing kernel (the ``index``-th launch of a job), compiled and written to the cache."""
    root, job, index, key, cache, _ = task
    try:
        figures = _compile(_record(root, job)[index])
    except Exception as exc:  # noqa: BLE001 - reported with the kernel, the other kernels go on
        return key, {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    _write(Path(cache), key, figures)
    return key, figures


def _in_child(task: Task, conn: Any) -> None:
    conn.send(_compile_task(task))
    conn.close()


@contextlib.contextmanager
def _one_torch_thread() -> Any:
    """Torch's CPU ops on one thread while the compiling processes are forked: each records its
    job's launches again (the inputs made with torch), and a child forked after GNU OpenMP's
    thread pool ran a parallel region waits forever at its next one for the parent's threads (a
    tail case's ``tril``). One thread runs every op inline, without the pool."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _compile_all(tasks: list[Task], workers: int, timeout: float | None, log: Any) -> dict[str, dict[str, Any]]:
    """Each task compiled in a process of its own forked from this one (the kernel modules and the
    target are set up here), ``workers`` at a time; one past ``timeout`` seconds is killed and
    reported. Serially in this process, without a limit, where processes cannot be forked."""
    out: dict[str, dict[str, Any]] = {}
    done = 0

    def report(task: Task, figures: Mapping[str, Any], seconds: float) -> None:
        nonlocal done
        done += 1
        what = f"error: {figures['error'][:200]}" if "error" in figures else \
            f"{figures['regs']} registers, {figures['spill_stores']} B spilled, {figures['smem']} B shared"
        print(f"  [{done}/{len(tasks)}] {task[1]['variant']} {task[5]}: {seconds:.1f} s, {what}", file=log, flush=True)

    if "fork" not in mp.get_all_start_methods():
        for task in tasks:
            start = time.perf_counter()
            key, out[key] = _compile_task(task)
            report(task, out[key], time.perf_counter() - start)
        return out
    context = mp.get_context("fork")
    waiting, running = list(tasks), {}
    while waiting or running:
        while waiting and len(running) < max(1, workers):
            task = waiting.pop(0)
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_in_child, args=(task, send), daemon=True)
            process.start()
            send.close()
            running[receive] = (process, task, time.perf_counter())
        for conn in mp.connection.wait(list(running), timeout=1.0):
            process, task, start = running.pop(conn)
            try:
                key, figures = conn.recv()
            except EOFError:
                key, figures = task[3], {"error": f"the compiling process died (exit status {process.exitcode})"}
            process.join()
            out[key] = figures
            report(task, figures, time.perf_counter() - start)
        for conn, (process, task, start) in list(running.items()):
            if timeout is not None and time.perf_counter() - start > timeout:
                process.kill()
                process.join()
                running.pop(conn)
                out[task[3]] = {"error": f"TimeoutError: not compiled within {timeout:g} s"}
                report(task, out[task[3]], time.perf_counter() - start)
    return out


def compile_jobs(root: Path, jobs: list[Mapping[str, Any]], cc: int, cache: Path, workers: int = 1,
                 timeout: float | None = None, log: Any = sys.stderr) -> list[dict[str, Any]]:
    """The kernels of each job, with their figures: ``{"kernels": [{"name", "key", "cached",
    regs, spill_stores, spill_loads, stack, smem, num_warps, wgmma, wgmma_small, ...}]}``, or
    ``{"error": ...}`` for a job whose launches could not be recorded or bound; a kernel that did
    not compile (or not within ``timeout`` seconds) holds its ``error``, and is not cached. Each
    job: ``op``, ``variant``, ``config``, ``case``, ``programs``."""
    set_target(cc)
    keys: list[list[tuple[str, str]] | str] = []
    for job in jobs:
        try:
            keys.append([(launch.name, cache_key(launch)) for launch in _record(str(root), job)])
        except Exception as exc:  # noqa: BLE001 - reported with the job
            keys.append(f"{type(exc).__name__}: {str(exc)[:2000]}")
    found: dict[str, dict[str, Any]] = {}
    tasks: dict[str, Task] = {}
    for job, names in zip(jobs, keys):
        for index, (name, key) in enumerate(names if isinstance(names, list) else ()):
            entry = found.get(key) or _read(cache, key)
            if entry is not None:
                found[key] = entry
            elif key not in tasks:
                tasks[key] = (str(root), job, index, key, str(cache), name)
    compiled: dict[str, dict[str, Any]] = {}
    if tasks:
        start = time.perf_counter()
        print(f"compiling {len(tasks)} kernels for {target_text(cc)} ({len(found)} in the cache {cache}), "
              f"{min(workers, len(tasks))} at a time", file=log, flush=True)
        with _one_torch_thread():
            compiled = _compile_all(list(tasks.values()), workers, timeout, log)
        print(f"compiled in {time.perf_counter() - start:.1f} s", file=log, flush=True)
    out = []
    for names in keys:
        if isinstance(names, str):
            out.append({"error": names})
            continue
        out.append({"kernels": [{**(compiled.get(key) or found[key]), "name": name, "key": key,
                                 "cached": key not in compiled} for name, key in names]})
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m opgen.evidence.cuda_compile JOBS ANSWER``: compile the jobs of the JSON file JOBS, write
    :func:`compile_jobs`'s answer to ANSWER (progress on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m opgen.evidence.cuda_compile", description=main.__doc__)
    parser.add_argument("jobs")
    parser.add_argument("out")
    parser.add_argument("--root", required=True)
    parser.add_argument("--cc", type=int, required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, help="seconds a kernel may take to compile")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # before any kernel module is imported: JIT kernels
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))  # generated/ of this project
    jobs = json.loads(Path(args.jobs).read_text())
    answer = {"target": target_text(args.cc), "python": sys.executable,
              "results": compile_jobs(root, jobs, args.cc, Path(args.cache), args.workers,
                                                   args.timeout)}
    Path(args.out).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
