"""Hand-written compositions of generated ops: what a training step calls.

``composed.mamba3_mimo_backward``: the whole Mamba-3 MIMO backward (the generated stages
``mamba3_mimo_bwd_fwd`` and ``mamba3_mimo_bwd_bwd`` plus the reductions of
``docs/mamba3_backward.md``), as a function, the torch custom op ``opgen::mamba3_mimo_backward``
and an autograd path around any forward.
"""
from composed.mamba3_mimo_backward import (GRADIENTS, Mamba3MimoFunction, mamba3_mimo_backward,
                                           with_opgen_backward)

__all__ = ["GRADIENTS", "Mamba3MimoFunction", "mamba3_mimo_backward", "with_opgen_backward"]
