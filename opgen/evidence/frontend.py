"""Ascend front-end acceptance check on a plain CPU: TTIR -> Linalg, no NPU, no CANN.

:func:`ascend_frontend` runs the first two stages of triton-ascend's compiler on a ``@triton.jit``
kernel: the Triton front end (AST -> TTIR, with the Ascend rules such as "no tf32") and
``triton-adapter-opt`` (TTIR -> Linalg/HIVM MLIR). It stops before ``npubin``, the stage that
needs CANN's ``bishengir-compile``. It is a "the front end accepts this" gate, not proof that the
NPU build succeeds: on-chip memory limits are only checked by bishengir.

Global state, handled here so callers need not:

* No Triton cache is read or written: the stages are called directly (``triton.compile`` would
  cache), and the adapter works in a temporary directory it removes. The npubin stage, which
  prints ``ERROR: Invalid bishengir path format`` on machines without CANN, is never run.
* ``TRITON_INTERPRET`` does not matter: an ``InterpretedFunction`` (a kernel decorated while the
  variable was 1) is rebuilt as a ``JITFunction``, module-level helpers it calls included, and if
  triton itself was imported under the variable, its library functions (``tl.cdiv``,
  ``tl.sum``, ...) are swapped for ``JITFunction`` copies during the check.
* The adapter runs as a subprocess (``subprocess.run`` in triton-ascend), so an adapter assertion
  (SIGABRT) is reported as stage ``"adapter"`` and the calling process survives.
* triton-ascend 3.2's interpreter patches ``triton.language`` in place on every launch and never
  restores it; compiling afterwards fails with misleading errors. This module snapshots the
  pristine language at import and restores it before each check (the interpreter re-patches on
  its next launch). If it was imported only after an interpreted launch, the check raises
  :class:`FrontendStateError` instead of returning a false rejection.
"""
from __future__ import annotations

import inspect
import re
import subprocess
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, make_backend
from triton.compiler.errors import CompilationError
from triton.runtime.jit import JITFunction, mangle_type
from triton._C.libtriton import ir

from opgen.errors import FrontendArgumentError, FrontendStateError

__all__ = ["FrontendResult", "FrontendArgumentError", "FrontendStateError", "ascend_frontend", "run_adapter",
           "check_many"]

# "%a, %b = dialect.op", "dialect.op", or the generic form "\"dialect.op\"(".
_OP_RE = re.compile(r'^\s*(?:%[^=]*=\s*)?"?([A-Za-z_]\w*\.[A-Za-z_][\w.]*)\b', re.MULTILINE)
_HIVM_RE = re.compile(r"\b(hivm\.[A-Za-z_][\w.]*)")


@dataclass(frozen=True)
class FrontendResult:
    """Outcome of one front-end check.

    Attributes:
        accepted: True when both the Triton front end and triton-adapter-opt accepted the kernel.
        stage: ``"ok"``, ``"frontend"`` (Triton front end rejected it) or ``"adapter"``
            (triton-adapter-opt failed or asserted).
        message: empty when accepted; else the front-end error text or the adapter's stderr.
        linalg_text_size: characters of Linalg MLIR produced (0 unless accepted).
        ops: sorted distinct MLIR op names in the Linalg output (``linalg.matmul``,
            ``memref.subview``, ...) plus any ``hivm.*`` names (ops or attributes).
    """

    accepted: bool
    stage: str
    message: str
    linalg_text_size: int
    ops: tuple[str, ...]




# ----------------------------------------------------------------------------- language guard

def _language_objects() -> list[Any]:
    return [tl, tl.core, tl.math, tl.tensor, tl.dtype]


def _language_patched() -> bool:
    """True when the Triton interpreter's monkey patches are active on ``triton.language``."""
    is_builtin = tl.core.is_builtin
    return not (is_builtin(tl.load) and is_builtin(tl.core.load) and is_builtin(tl.math.exp)
                and is_builtin(tl.tensor.__add__) and isinstance(tl.static_range, type))


def _snapshot() -> list[tuple[Any, dict[str, Any]]] | None:
    if _language_patched():
        return None
    return [(obj, dict(vars(obj))) for obj in _language_objects()]


_PRISTINE = _snapshot()


def _ensure_pristine_language() -> None:
    """Undoes the interpreter's patches on ``triton.language`` (see the module docstring)."""
    global _PRISTINE
    if not _language_patched():
        if _PRISTINE is None:
            _PRISTINE = _snapshot()
        return
    if _PRISTINE is None:
        raise FrontendStateError(
            "triton.language was patched by the Triton interpreter (a kernel ran with "
            "TRITON_INTERPRET=1) before opgen.evidence.frontend was imported, so the pristine language "
            "is unknown. Import opgen.evidence.frontend before launching interpreted kernels, or run "
            "the front-end check in a separate process.")
    for obj, saved in _PRISTINE:
        current = vars(obj)
        for name, value in saved.items():
            if current.get(name, saved) is not value:
                setattr(obj, name, value)
        if isinstance(obj, type):  # the interpreter adds dunders to tl.tensor
            for name in [n for n in current if n not in saved]:
                delattr(obj, name)
    if _language_patched():
        raise FrontendStateError("could not restore triton.language after the interpreter patched it")


# ----------------------------------------------------------------------------- kernel handling

def _interpreted_function_cls() -> type | None:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - depends on the install
        return None
    return InterpretedFunction


def _needs_rebuild(value: Any, interp_cls: type | None) -> bool:
    return interp_cls is not None and isinstance(value, interp_cls)


class _JitRebuilder:
    """Turns InterpretedFunctions (and the helpers they call) back into JITFunctions.

    Functions that shared a globals dict share one rebuilt copy of it, in which every
    InterpretedFunction is replaced by its JITFunction; cycles are fine (memoised by id).
    """

    _JIT_KWARGS = ("version", "do_not_specialize", "do_not_specialize_on_alignment", "debug",
                   "noinline", "repr", "launch_metadata")

    def __init__(self, interp_cls: type | None) -> None:
        self._interp_cls = interp_cls
        self._globals: dict[int, dict[str, Any]] = {}
        self._done: dict[int, JITFunction] = {}

    def convert(self, kernel: Any) -> JITFunction:
        if id(kernel) in self._done:
            return self._done[id(kernel)]
        fn = kernel.fn
        source = getattr(getattr(kernel, "rewriter", None), "kwargs", None) or {}
        if isinstance(kernel, JITFunction):
            source = {k: getattr(kernel, k, None) for k in self._JIT_KWARGS if k != "repr"}
        jit_kwargs = {k: source[k] for k in self._JIT_KWARGS if source.get(k) is not None}
        fresh = id(fn.__globals__) not in self._globals
        new_globals = self._globals.setdefault(id(fn.__globals__), dict(fn.__globals__))
        clone = types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, fn.__closure__)
        clone.__kwdefaults__ = fn.__kwdefaults__
        clone.__annotations__ = dict(fn.__annotations__)
        clone.__qualname__, clone.__module__, clone.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
        jit_fn = JITFunction(clone, **jit_kwargs)
        self._done[id(kernel)] = jit_fn
        if fresh:
            for name, value in fn.__globals__.items():
                if _needs_rebuild(value, self._interp_cls):
                    new_globals[name] = self.convert(value)
        return jit_fn


def _as_jit_function(kernel: Any, rebuilder: _JitRebuilder) -> JITFunction:
    """Returns a JITFunction for ``kernel`` (JITFunction, InterpretedFunction or autotune wrapper)."""
    interp_cls = _interpreted_function_cls()
    for _ in range(8):
        if isinstance(kernel, JITFunction) or _needs_rebuild(kernel, interp_cls):
            break
        if getattr(kernel, "fn", None) is None:
            break
        kernel = kernel.fn
    if isinstance(kernel, JITFunction):
        if not any(_needs_rebuild(v, interp_cls) for v in kernel.fn.__globals__.values()):
            return kernel
    elif not _needs_rebuild(kernel, interp_cls):
        raise FrontendArgumentError(
            "expected a @triton.jit kernel (JITFunction or InterpretedFunction); "
            f"got {type(kernel).__name__}")
    return rebuilder.convert(kernel)


@contextmanager
def _jit_triton_library(rebuilder: _JitRebuilder) -> Iterator[None]:
    """Temporarily swaps triton's own InterpretedFunctions (``tl.cdiv``, ``tl.sum``, ...) for JITFunctions.

    They exist when triton itself was imported with ``TRITON_INTERPRET=1``; the code generator
    would otherwise run them as plain Python.
    """
    interp_cls = _interpreted_function_cls()
    swapped: list[tuple[Any, str, Any]] = []
    if interp_cls is not None:
        holders = [m for n, m in list(sys.modules.items()) if n.startswith("triton.") and m is not None]
        for holder in [*holders, tl.tensor]:
            for name, value in list(vars(holder).items()):
                if isinstance(value, interp_cls):
                    swapped.append((holder, name, value))
    try:
        for holder, name, value in swapped:
            setattr(holder, name, rebuilder.convert(value))
        yield
    finally:
        for holder, name, value in reversed(swapped):
            setattr(holder, name, value)


def _bind(jit_fn: JITFunction, kwargs: Mapping[str, Any], specialize: bool, backend: Any
          ) -> tuple[dict[str, str], dict[str, Any], Any]:
    """Builds the triton 3.2 signature, constants and attribute descriptor from argument values."""
    names = [p.name for p in jit_fn.params]
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise FrontendArgumentError(
            f"{jit_fn.__name__}: unknown argument(s) {unknown}; parameters are {names}")
    values = []
    for param in jit_fn.params:
        if param.name in kwargs:
            values.append(kwargs[param.name])
        elif param.default is not inspect.Parameter.empty:
            values.append(param.default)
        else:
            raise FrontendArgumentError(f"{jit_fn.__name__}: missing value for parameter {param.name!r}")
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for param, value in zip(jit_fn.params, values):
        if param.is_constexpr:
            signature[param.name], constants[param.name] = "constexpr", value
            continue
        try:
            ty = mangle_type(value)
        except (AttributeError, KeyError) as exc:
            raise FrontendArgumentError(
                f"{jit_fn.__name__}: parameter {param.name!r}: unsupported value of type "
                f"{type(value).__name__}") from exc
        if ty == "none":
            signature[param.name], constants[param.name] = "*i8", None
        else:
            signature[param.name] = ty
    attrs = backend.get_attrs_descriptor(jit_fn.params, values) if specialize else None
    if attrs is not None:
        for num in attrs.get_constants():
            param = jit_fn.params[num]
            constants.setdefault(param.name, values[num])
    return signature, constants, attrs


def _ops_of(linalg: str) -> tuple[str, ...]:
    return tuple(sorted(set(_OP_RE.findall(linalg)) | set(_HIVM_RE.findall(linalg))))


# ----------------------------------------------------------------------------- public API

def ascend_frontend(kernel: Any, kwargs: Mapping[str, Any], *, arch: str = "Ascend910B3",
                    options: Mapping[str, Any] | None = None, specialize: bool = True) -> FrontendResult:
    """Runs triton-ascend's front end and triton-adapter-opt (TTIR -> Linalg) on one kernel.

    Args:
        kernel: a ``@triton.jit`` kernel; an ``InterpretedFunction`` (decorated under
            ``TRITON_INTERPRET=1``) or an autotune/heuristics wrapper is unwrapped.
        kwargs: a value for every kernel parameter (defaults fill the rest): torch tensors
            (pointer types ``*fp16``, ``*bf16``, ...), ints (``i32``, or ``i64`` outside int32),
            floats (``fp32``), bools (``i1``), None (null ``*i8``); ``tl.constexpr`` parameters
            become constants.
        arch: the Ascend target name, e.g. ``Ascend910B3`` or ``Ascend910_9372``. In
            triton-ascend 3.2.0 it does not change these two stages; Ascend 950 lowering is
            selected by ``options={"compile_on_910_95": True}``.
        options: NPU compile options (``NPUOptions`` fields, e.g. ``{"enable_linearize": True}``).
        specialize: mimic a real launch: pointers and ints divisible by 16 get
            ``tt.divisibility``, int arguments equal to 1 become constants.

    Returns:
        The :class:`FrontendResult`.

    Raises:
        FrontendArgumentError: ``kwargs`` or ``options`` do not fit the kernel or the backend.
        FrontendStateError: ``triton.language`` is left patched by the interpreter.
        Exception: anything other than a front-end ``CompilationError`` or an adapter failure
            propagates unchanged.
    """
    _ensure_pristine_language()
    rebuilder = _JitRebuilder(_interpreted_function_cls())
    with _jit_triton_library(rebuilder):
        return _check(_as_jit_function(kernel, rebuilder), kwargs, arch, options, specialize)


def _check(jit_fn: JITFunction, kwargs: Mapping[str, Any], arch: str, options: Mapping[str, Any] | None,
           specialize: bool) -> FrontendResult:
    """Binds the arguments and runs the ttir and ttadapter stages (see :func:`ascend_frontend`)."""
    backend = make_backend(GPUTarget("npu", arch, 0))
    option_fields = getattr(type(backend.parse_options({})), "__dataclass_fields__", {})
    bad = sorted(set(options or {}) - set(option_fields))
    if bad:
        raise FrontendArgumentError(f"unknown NPU compile option(s) {bad}")
    opts = backend.parse_options(dict(options or {}))
    signature, constants, attrs = _bind(jit_fn, kwargs, specialize, backend)
    stages: dict[str, Any] = {}
    backend.add_stages(stages, opts)
    if "ttir" not in stages or "ttadapter" not in stages:
        raise FrontendArgumentError(f"these options skip the Linalg stage (stages: {list(stages)})")
    metadata = {"hash": "opgen-frontend", "target": backend.target, **opts.__dict__}
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(jit_fn, signature, constants, attrs)
    try:
        module = source.make_ir(opts, backend.get_codegen_implementation(), backend.get_module_map(), context)
    except CompilationError as exc:
        return FrontendResult(False, "frontend", str(exc), 0, ())
    ttir = stages["ttir"](module, metadata)
    linalg, failure = run_adapter(stages["ttadapter"], ttir, metadata)
    if failure is not None:
        return FrontendResult(False, "adapter", failure, 0, ())
    return FrontendResult(True, "ok", "", len(linalg), _ops_of(linalg))


def run_adapter(stage: Any, ttir: Any, metadata: dict[str, Any]) -> tuple[Any, str | None]:
    """Run the TTIR -> Linalg stage: (its output, None), or (None, why it failed).

    triton-adapter-opt 3.2.0 was seen to die by SIGSEGV once in a full test run on a loaded
    machine, then accept the same module every time: a death by signal earns one retry; a
    rejection (an exit status) none.
    """
    for attempt in range(2):
        try:
            return stage(ttir, metadata), None
        except subprocess.CalledProcessError as exc:
            rc = exc.returncode
            if rc < 0 and attempt == 0:
                continue
            err = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            how = f"was killed by signal {-rc}" if rc < 0 else f"exited with {rc}"
            return None, f"triton-adapter-opt {how}:\n{err}"
    raise AssertionError("unreachable")


def check_many(items: Iterable[tuple[Any, Mapping[str, Any]]],
               arch: str = "Ascend910B3") -> list[FrontendResult]:
    """Runs :func:`ascend_frontend` on each ``(kernel, kwargs)`` pair, in order."""
    return [ascend_frontend(kernel, kwargs, arch=arch) for kernel, kwargs in items]
