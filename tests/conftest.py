"""pytest set-up: the Triton interpreter for every kernel launch, with bf16 by value.

TRITON_INTERPRET must be set before any kernel module is imported (``triton.jit`` reads it at
decoration time); ``opgen.frontend`` must be imported before the first interpreted launch so it
can snapshot the pristine ``triton.language`` it compiles with.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import opgen.frontend  # noqa: E402,F401  (see the module docstring)
from opgen.interpreter import patch_bf16  # noqa: E402

patch_bf16()
