"""What the compiler says of generated kernels for an NVIDIA chip, on a host without a GPU.

Each job (a variant, its tunables, a case's shape, the persistent grid's programs) is recorded as
the launches it makes (``opgen.launches``); each launch is bound by Triton's own binder (the
specialisation a launch on the device gets: constexprs, the 16-byte divisibility of pointers and
integers, integers equal to 1, the launch options) and compiled by ``triton.compile`` for
``GPUTarget("cuda", CC, 32)`` through a driver that names the target, as ``JITFunction.run`` would
compile it, minus the launch. ptxas's ``-v`` report gives the registers per thread, the spill
stores and loads and the stack frame (bytes); Triton's metadata the shared memory (bytes) and the
warps. The figures of each kernel are cached in ``<cache>/<key[:2]>/<key>.json``, the key being
Triton's compile key (the kernel's source and the functions it calls, specialisation,
constexprs, launch options, Triton's and ptxas's versions): a run compiles only the kernels that
changed, the distinct ones once, in ``workers`` processes where more than one is missing.

Needs a Triton with its NVIDIA backend (upstream 3.6; triton-ascend has none). ``opgen.resources``
runs ``python -m opgen.cuda_compile JOBS ANSWER --root R --cc CC --cache DIR --workers N`` under such
a Python where the running one lacks it (JOBS and ANSWER: JSON files). Uses ``launches``, ``spec``.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import hashlib
import io
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

FORMAT = 1
"""Version of the cached figures: a change of what is read or how invalidates every entry."""

FIGURES = ("regs", "spill_stores", "spill_loads", "stack", "smem", "num_warps")
"""What each compiled kernel reports, as ints."""


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
                num_stages=meta.num_stages, maxnreg=getattr(options, "maxnreg", None))


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
    from .spec import load_spec

    if (root, op) not in _SPECS:
        _SPECS[root, op] = load_spec(Path(root) / "specs" / f"{op}.yaml", Path(root))
    return _SPECS[root, op]


def _record(root: str, job: Mapping[str, Any]) -> list[Any]:
    from .launches import record

    return record(_spec(root, job["op"]), "cuda", job["variant"], job["config"], job["case"], job["programs"])


def _compile_task(task: tuple[str, Mapping[str, Any], int, str, str]) -> tuple[str, dict[str, Any]]:
    """One missing kernel (the ``index``-th launch of a job), compiled and written to the cache."""
    root, job, index, key, cache = task
    try:
        figures = _compile(_record(root, job)[index])
    except Exception as exc:  # noqa: BLE001 - reported with the kernel, the other kernels go on
        return key, {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    _write(Path(cache), key, figures)
    return key, figures


def compile_jobs(root: Path, jobs: list[Mapping[str, Any]], cc: int, cache: Path, workers: int = 1,
                 log: Any = sys.stderr) -> list[dict[str, Any]]:
    """The kernels of each job, with their figures: ``{"kernels": [{"name", "key", "cached",
    regs, spill_stores, spill_loads, stack, smem, num_warps, ...}]}``, or ``{"error": ...}`` for a
    job whose launches could not be recorded or bound; a kernel that did not compile holds its
    ``error``. Each job: ``op``, ``variant``, ``config``, ``case``, ``programs``."""
    set_target(cc)
    keys: list[list[tuple[str, str]] | str] = []
    for job in jobs:
        try:
            keys.append([(launch.name, cache_key(launch)) for launch in _record(str(root), job)])
        except Exception as exc:  # noqa: BLE001 - reported with the job
            keys.append(f"{type(exc).__name__}: {str(exc)[:2000]}")
    found: dict[str, dict[str, Any]] = {}
    tasks: dict[str, tuple[str, Mapping[str, Any], int, str, str]] = {}
    for job, names in zip(jobs, keys):
        for index, (_, key) in enumerate(names if isinstance(names, list) else ()):
            entry = found.get(key) or _read(cache, key)
            if entry is not None:
                found[key] = entry
            elif key not in tasks:
                tasks[key] = (str(root), job, index, key, str(cache))
    start = time.perf_counter()
    if tasks:
        print(f"compiling {len(tasks)} kernels for {target_text(cc)} ({len(found)} in the cache {cache}), "
              f"{min(workers, len(tasks))} processes", file=log, flush=True)
    if workers > 1 and len(tasks) > 1:
        context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        with cf.ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context, initializer=set_target,
                                    initargs=(cc,)) as pool:
            compiled = dict(pool.map(_compile_task, tasks.values()))
    else:
        compiled = dict(map(_compile_task, tasks.values()))
    if tasks:
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
    """``python -m opgen.cuda_compile JOBS ANSWER``: compile the jobs of the JSON file JOBS, write
    :func:`compile_jobs`'s answer to ANSWER (progress on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m opgen.cuda_compile", description=main.__doc__)
    parser.add_argument("jobs")
    parser.add_argument("out")
    parser.add_argument("--root", required=True)
    parser.add_argument("--cc", type=int, required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # before any kernel module is imported: JIT kernels
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))  # generated/ of this project
    jobs = json.loads(Path(args.jobs).read_text())
    answer = {"target": target_text(args.cc), "python": sys.executable,
              "results": compile_jobs(root, jobs, args.cc, Path(args.cache), args.workers)}
    Path(args.out).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
