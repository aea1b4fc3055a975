"""The kernel launches one call of a generated variant makes, recorded instead of run.

:func:`record` calls the variant module's ``launch`` (as the generated API and the tuner's worker
call it) on uninitialised CPU tensors of a case's shapes (``torch.empty``: no memory is touched),
with Triton's ``JITFunction.run`` replaced for the call by a recorder: each ``kernel[grid](...)``
the module makes is kept as ``(kernel, args, kwargs)``, kernel parameters and launch options
together, and nothing is compiled or run. What a compiler then makes of them
(``opgen.evidence.cuda_compile``, the Ascend front end) is what a launch of that shape would get: the
constexprs, the integer and pointer specialisation and the launch options are the real ones.
Works under upstream Triton and triton-ascend alike. :func:`intercepted` is the replacement
itself, with any callable in the launch's place (``opgen host-time`` counts launches with it).
Uses ``spec``, ``space``, ``worker``, ``compiled`` (its method swap).
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, NamedTuple

from ..run.compiled import swapped
from ..run.worker import _outputs
from ..space.space import case_inputs, evaluate_params
from ..spec.spec import OpSpec


class Launch(NamedTuple):
    """One recorded ``kernel[grid](*args, **kwargs)``: the JITFunction, its positional and keyword
    arguments (kernel parameters and launch options together, as the module passed them)."""

    kernel: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        """The kernel's function name."""
        return self.kernel.__name__

    def split(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(kernel parameters by name, launch options)`` of a launch made by keywords alone."""
        names = set(self.kernel.arg_names)
        values = dict(zip(self.kernel.arg_names, self.args))
        values.update({k: v for k, v in self.kwargs.items() if k in names})
        return values, {k: v for k, v in self.kwargs.items() if k not in names}


def launch_args(spec: OpSpec, case: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments ``launch`` takes (the spec's ``api.launch_args``) for ``case``: every input
    and output an uninitialised contiguous CPU tensor of its shape and dtype (None where the case
    leaves an optional input or a ``when`` output out), scalars as the case or the spec's defaults
    give them."""
    import torch

    params = evaluate_params(spec, case_inputs(spec, case))
    values: dict[str, Any] = dict(params)
    for name, arg in spec.signature.tensors.items():
        dtype = params[f"{name}_dtype"]
        values[name] = None if dtype is None else torch.empty(tuple(params[d] for d in arg.dims),
                                                              dtype=getattr(torch, dtype))
    for name, scalar in spec.signature.scalars.items():
        if scalar.type == "dtype":
            values[name] = getattr(torch, params[name])
    inputs = {name: values[name] for name in spec.signature.tensors}
    values.update(_outputs(spec, params, inputs, "cpu"))
    return {name: values.get(name) for name in spec.api.launch_args}


@contextmanager
def intercepted(on_launch: Callable[[Any, tuple[Any, ...], dict[str, Any]], object]) -> Iterator[None]:
    """While open, a kernel's launch calls ``on_launch(kernel, args, kwargs)`` instead of compiling
    and running it (a JIT kernel's, and an interpreted one's: a module imported under
    ``TRITON_INTERPRET=1``). Everything up to the launch runs as it would: the ``kernel[grid]``
    of a JIT kernel included, its ``run`` replaced."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def run_instead(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        on_launch(self, args, kwargs)

    def getitem_instead(self: Any, grid: Any) -> Any:
        return lambda *args, **kwargs: on_launch(self, args, kwargs)

    with swapped(JITFunction, "run", lambda _run: run_instead), \
            swapped(InterpretedFunction, "__getitem__", lambda _getitem: getitem_instead):
        yield


@contextmanager
def recording() -> Iterator[list[Launch]]:
    """While open, a kernel's launch is appended to the yielded list instead of compiled and run
    (:func:`intercepted`)."""
    launches: list[Launch] = []
    with intercepted(lambda kernel, args, kwargs: launches.append(Launch(kernel, args, kwargs))):
        yield launches


def record(spec: OpSpec, rendering: str, variant: str, config: Mapping[str, Any], case: Mapping[str, Any],
           programs: int) -> list[Launch]:
    """The launches, in order, that ``generated.<op>.kernels.<rendering>.<variant>`` makes for one
    call on ``case`` with the tunables ``config`` and a persistent grid of ``programs``."""
    module = importlib.import_module(f"generated.{spec.op}.kernels.{rendering}.{variant}")
    kwargs = launch_args(spec, case)
    with recording() as launches:
        module.launch(**kwargs, num_programs=programs, point=dict(config))
    return launches
