"""Each generated op called with strided views of its activations, the layout a fused projection
hands over (q, k and v as slices of one wider tensor): ``opgen bench <op> --baseline strided``
times that call beside the contiguous one, so its speed-up column is the cost of a strided call
(the strided twins reading the views in place) and its agreement column shows the outputs are
equal.

A view is made once per input tensor and reused, so the timed calls hold only the op's own work.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

import torch

from opgen.spec.spec import load_spec


def strided_view(x: torch.Tensor) -> torch.Tensor:
    """x's values as the first half of a tensor twice as wide in its last dim (not contiguous)."""
    wide = torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype, device=x.device)
    view = wide[..., : x.shape[-1]]
    view.copy_(x)
    return view


def activations(op: str) -> set[str]:
    """The tensor inputs of ``op`` a model hands over as views: those its spec's ``api.strided``
    names (read in place), else those with a batch dim first (its spec's ``B``)."""
    root = Path(importlib.import_module(f"generated.{op}").__file__).resolve().parents[2]
    spec = load_spec(root / "specs" / f"{op}.yaml", root)
    if spec.api.strided:
        return set(spec.api.strided)
    return {name for name, arg in spec.signature.tensors.items() if arg.dims[0] == "B"}


def strided_call(op: str) -> Callable[..., Any]:
    """A function with ``op``'s signature that passes each activation (:func:`activations`) as a
    strided view of its values."""
    views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    names: set[str] = set()

    def view_of(name: str, x: Any) -> Any:
        if not names:
            names.update(activations(op))
        if not isinstance(x, torch.Tensor) or name not in names:
            return x
        held = views.get(id(x))
        if held is None or held[0] is not x:
            held = views[id(x)] = (x, strided_view(x))
        return held[1]

    def run(**args: Any) -> Any:
        fn = getattr(importlib.import_module(f"generated.{op}"), op)
        return fn(**{name: view_of(name, value) for name, value in args.items()})
    run.__name__ = f"{op}_strided"
    return run


chunk_gla_fwd_o_gk = strided_call("chunk_gla_fwd_o_gk")
mamba3_mimo_bwd_fwd = strided_call("mamba3_mimo_bwd_fwd")
mamba3_mimo_bwd_bwd = strided_call("mamba3_mimo_bwd_bwd")
