"""bf16 by value in the Triton CPU interpreter (``TRITON_INTERPRET=1``).

Why this exists: numpy has no bfloat16, so the interpreter keeps bf16 tensors as their raw
``uint16`` bit patterns and hands those bits straight to numpy. Every bf16 arithmetic op then
acts on integers, not on numbers: ``tl.dot(bf16, bf16)`` is off by about 1e10, bf16 ``+``, ``*``
and comparisons are garbage, and only the ``.to()`` casts between bf16 and fp32 are right.
Upstream documents this as a limitation ("the interpreter does not support operations on
bfloat16; cast to float32", triton-lang/triton#4972); fixes were proposed and closed unmerged.
The same holds for triton-ascend 3.2.0, whose interpreter is a copy of upstream's.

:func:`patch_bf16` wraps the few ``InterpreterBuilder`` methods that compute on values so that
bf16 operands are widened to fp32 (exact), the op runs in fp32, and the result is rounded back
to bf16 bits with round-to-nearest-even (NaN stays NaN). Covered: ``tl.dot`` (bf16 operands or
accumulator), every binary op going through ``binary_op`` (``+ - * / %``, min/max and all
comparisons, which return ``int1``), every unary op going through ``unary_op`` (exp, log, sqrt,
...), ``fma``, ``clamp``, ``rsqrt``, ``erf`` and casts from or to bf16 (fp32 -> bf16 rounds to
nearest even, as the hardware does, instead of truncating); ``get_bf16`` (bf16 constants, as in
``x * 2.0``) is added where the interpreter lacks it (triton-ascend 3.2). Bit-level ops (loads,
stores, ``where``, ``abs``, reshapes) already work on bits and are left alone. Reductions: the numpy
fast paths (``ReduceOps.sum``/``min_max``, ``ScanOps.cumsum``/``cumprod``) reduce a bf16 input
in fp32 and round once (triton 3.2 already widens bf16 before ``tl.sum``; upstream 3.6 does
not, and its ``tl.sum`` of bf16 is garbage without this); the generic paths go through the
patched binary ops.

opgen applies it wherever it runs kernels under the interpreter: its worker processes, and the
generated API, which imports the copy ``opgen build`` writes to ``generated/_interpreter.py``
(this module needs no other opgen module, so the copy runs alone). The patch is process-wide and
cannot be undone. Tested on triton-ascend 3.2.0 and upstream triton 3.6.0 (the same
``InterpreterBuilder``/``ReduceOps``/``ScanOps`` names). A missing
method raises :class:`InterpreterPatchError` naming it; nothing is patched in that case.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np


class InterpreterPatchError(RuntimeError):
    """The installed Triton interpreter lacks something the bf16 patch needs."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"Triton interpreter patch: {detail}")

__all__ = ["InterpreterPatchError", "patch_bf16", "is_bf16_patched", "bf16_bits_to_f32",
           "f32_to_bf16_bits"]

_FLAG = "_opgen_bf16_by_value"
# Methods wrapped with the generic by-value wrapper: name -> index of the argument (after self)
# whose dtype the result takes.
_RESULT_LIKE = {
    "binary_op": 0,
    "unary_op": 0,
    "create_dot": 2,
    "create_fma": 2,
    "create_clampf": 0,
    "create_rsqrt": 0,
    "create_erf": 0,
}
# Fast-path reductions and scans that call numpy on the raw data: class -> methods.
_REDUCTIONS = {"ReduceOps": ("sum", "min_max"), "ScanOps": ("cumsum", "cumprod")}
_REQUIRED_MODULE_ATTRS = ("InterpreterBuilder", "TensorHandle", "_get_np_dtype", *_REDUCTIONS)



def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widens bf16 bit patterns (uint16) to float32 values, exactly.

    Args:
        bits: array of bf16 bit patterns (any integer dtype holding 16-bit values).

    Returns:
        A float32 array of the same shape.
    """
    wide = np.asarray(bits).astype(np.uint32) << np.uint32(16)
    return np.ascontiguousarray(wide).view(np.float32)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Rounds float values to bf16 bit patterns, round-to-nearest-even; NaN stays a quiet NaN.

    Args:
        values: array of floats (converted to float32 first).

    Returns:
        A uint16 array of the same shape.
    """
    f32 = np.ascontiguousarray(values, dtype=np.float32)
    u = f32.view(np.uint32)
    with np.errstate(over="ignore"):
        lsb = (u >> np.uint32(16)) & np.uint32(1)
        rounded = ((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    quiet_nan = ((u >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return np.where(np.isnan(f32), quiet_nan, rounded).astype(np.uint16)


def _interp() -> Any:
    try:
        from triton.runtime import interpreter
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise InterpreterPatchError(f"cannot import triton.runtime.interpreter: {exc}") from exc
    return interpreter


def is_bf16_patched() -> bool:
    """Returns True once :func:`patch_bf16` has been applied in this process."""
    return bool(getattr(_interp().InterpreterBuilder, _FLAG, False))


def _check_api(interp: Any) -> None:
    missing = [f"triton.runtime.interpreter.{a}" for a in _REQUIRED_MODULE_ATTRS
               if not hasattr(interp, a)]
    if not missing:
        wanted = {"InterpreterBuilder": (*_RESULT_LIKE, "cast_impl"), **_REDUCTIONS}
        missing = [f"{cls}.{m}" for cls, methods in wanted.items() for m in methods
                   if not callable(getattr(getattr(interp, cls), m, None))]
    if missing:
        raise InterpreterPatchError(
            "the installed Triton interpreter lacks " + ", ".join(missing)
            + "; the bf16 patch supports triton-ascend 3.2 and upstream triton 3.5/3.6")
    import triton.language as tl
    if not hasattr(tl, "bfloat16"):
        raise InterpreterPatchError("triton.language has no attribute bfloat16")


def _make_helpers(interp: Any) -> tuple[Callable[[Any], bool], Callable[[Any], Any]]:
    import triton.language as tl
    handle_cls = interp.TensorHandle

    def is_bf16(handle: Any) -> bool:
        if not isinstance(handle, handle_cls):
            return False
        dtype = getattr(handle.dtype, "scalar", handle.dtype)
        return dtype == tl.bfloat16 and np.asarray(handle.data).dtype == np.uint16

    def widen(handle: Any) -> Any:
        return handle_cls(bf16_bits_to_f32(handle.data), tl.float32) if is_bf16(handle) else handle

    return is_bf16, widen


def _by_value(orig: Callable[..., Any], result_like: int, interp: Any) -> Callable[..., Any]:
    """Wraps a builder method so bf16 handle arguments are computed by value in fp32."""
    import triton.language as tl
    handle_cls = interp.TensorHandle
    is_bf16, widen = _make_helpers(interp)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not any(is_bf16(a) for a in (*args, *kwargs.values())):
            return orig(self, *args, **kwargs)
        out_bf16 = result_like < len(args) and is_bf16(args[result_like])
        result = orig(self, *(widen(a) for a in args), **{k: widen(v) for k, v in kwargs.items()})
        if not isinstance(result, handle_cls):
            return result
        data = np.asarray(result.data)
        if data.dtype == np.bool_:
            return handle_cls(result.data, tl.int1)
        if out_bf16 and np.issubdtype(data.dtype, np.floating):
            return handle_cls(f32_to_bf16_bits(data), tl.bfloat16)
        return result

    wrapped.__name__ = getattr(orig, "__name__", "wrapped")
    wrapped.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapped


def _cast_by_value(orig: Callable[..., Any], interp: Any) -> Callable[..., Any]:
    """Wraps ``cast_impl``: casts from bf16 read values, casts to bf16 round to nearest even."""
    import triton.language as tl
    handle_cls = interp.TensorHandle
    is_bf16, _ = _make_helpers(interp)

    def cast_impl(self: Any, src: Any, dst_type: Any, *args: Any, **kwargs: Any) -> Any:
        dst = getattr(dst_type, "scalar", dst_type)
        src_bf16 = is_bf16(src)
        to_bf16 = dst == tl.bfloat16 and not isinstance(dst, tl.pointer_type)
        if src_bf16 and to_bf16:
            return handle_cls(src.data, tl.bfloat16)
        if src_bf16:
            values = bf16_bits_to_f32(src.data)
            return handle_cls(values.astype(interp._get_np_dtype(dst)), dst)
        if to_bf16 and isinstance(src, handle_cls) and np.asarray(src.data).dtype != np.uint16:
            bits = f32_to_bf16_bits(np.asarray(src.data).astype(np.float32))
            return handle_cls(bits, tl.bfloat16)
        return orig(self, src, dst_type, *args, **kwargs)

    cast_impl.__wrapped__ = orig  # type: ignore[attr-defined]
    return cast_impl


def _reduction_by_value(orig: Callable[..., Any], interp: Any) -> Callable[..., Any]:
    """Wraps a ReduceOps/ScanOps fast path so a bf16 input is reduced in fp32, then rounded once."""
    import triton.language as tl
    handle_cls = interp.TensorHandle
    is_bf16, _ = _make_helpers(interp)

    def retype(t: Any, data: np.ndarray, dtype: Any) -> Any:
        ty = tl.block_type(dtype, list(t.type.shape)) if t.type.is_block() else dtype
        return tl.core.tensor(handle_cls(data, dtype), ty)

    def narrow(result: Any) -> Any:
        if isinstance(result, (list, tuple)):
            return type(result)(narrow(r) for r in result)
        if isinstance(result, tl.core.tensor) and result.dtype == tl.float32:
            return retype(result, f32_to_bf16_bits(result.handle.data), tl.bfloat16)
        return result

    def wrapped(self: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        first = input[0] if isinstance(input, tuple) else input
        if not (isinstance(first, tl.core.tensor) and is_bf16(first.handle)):
            return orig(self, input, *args, **kwargs)
        wide = retype(first, bf16_bits_to_f32(first.handle.data), tl.float32)
        arg = (wide, *input[1:]) if isinstance(input, tuple) else wide
        return narrow(orig(self, arg, *args, **kwargs))

    wrapped.__name__ = getattr(orig, "__name__", "wrapped")
    wrapped.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapped


def _make_get_bf16(interp: Any) -> Callable[..., Any]:
    """Builds the bf16 scalar constructor that ``tl.full`` and ``x * 2.0`` need (3.2 lacks it)."""
    import triton.language as tl
    handle_cls = interp.TensorHandle

    def get_bf16(self: Any, value: float) -> Any:
        return handle_cls(f32_to_bf16_bits(np.array([value], dtype=np.float32)), tl.bfloat16)

    return get_bf16


def patch_bf16() -> None:
    """Makes the Triton interpreter compute bf16 ops by value; a second call does nothing.

    Raises:
        InterpreterPatchError: the interpreter lacks a method or attribute the patch wraps
            (the message names it); nothing has been patched then.
    """
    interp = _interp()
    builder = interp.InterpreterBuilder
    if getattr(builder, _FLAG, False):
        return
    _check_api(interp)
    replacements = {name: _by_value(getattr(builder, name), idx, interp)
                    for name, idx in _RESULT_LIKE.items()}
    replacements["cast_impl"] = _cast_by_value(getattr(builder, "cast_impl"), interp)
    if not callable(getattr(builder, "get_bf16", None)):
        replacements["get_bf16"] = _make_get_bf16(interp)
    targets = [(builder, name, fn) for name, fn in replacements.items()]
    for cls_name, methods in _REDUCTIONS.items():
        cls = getattr(interp, cls_name)
        targets += [(cls, m, _reduction_by_value(getattr(cls, m), interp)) for m in methods]
    for owner, name, fn in targets:
        setattr(owner, name, fn)
    setattr(builder, _FLAG, True)
