"""Float64 golden references of opgen's operators, independent of any kernel.

A spec's ``reference`` names four functions of one module (``module:function`` each); their
contract is :class:`Reference` below. The tuner's correctness gate (``opgen.run.worker``) calls them
with keyword arguments only: the op's tensors and scalars that each function's signature names
(an argument it does not take is left out), plus ``device``.
"""
from __future__ import annotations

from typing import Any, Protocol

Tensors = Any
"""One tensor (an op with one output) or a dict of tensors by output name (several outputs)."""


class MakeInputs(Protocol):
    """``reference.inputs``: seeded random inputs of one case, the same on every device."""

    def __call__(self, *, dtype: Any, seed: int, device: str, **dims_and_scalars: Any) -> dict[str, Any]:
        """Args: every dim symbol of the signature and the scalars that shape the inputs.

        Returns: the op's tensors by argument name (and may add scalars such as ``scale``).
        """


class Golden(Protocol):
    """``reference.golden``, ``reference.fp32`` and ``reference.magnitude``: the float64 golden
    outputs, the golden's math in float32 (the dual benchmark's side) and the float64 sum of
    |term| per output element (the cancellation check's scale)."""

    def __call__(self, *, device: str, **args: Any) -> Tensors:
        """Args: the op's tensors and scalars the function names (an absent optional tensor is None)."""


class Reference(Protocol):
    """What one operator's reference module provides (``opgen/references/<op>.py``)."""

    make_inputs: MakeInputs
    golden: Golden
    reference_fp32: Golden
    magnitude: Golden
    # optional (``reference.half``): the op rounded where an upstream half-precision kernel rounds
    # it, the yardstick of ``accuracy.half_ratio``
