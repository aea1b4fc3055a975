"""opgen: a code-generation and autotuning compiler driver for Triton kernels.

The flow is spec -> space -> render -> tune -> freeze -> generated: ``opgen.spec`` loads and
validates ``specs/<op>.yaml``, ``opgen.space`` enumerates variants and tunables under a chip's
on-chip budget, ``opgen.render`` fills the Jinja templates, ``opgen.tune`` searches offline,
``opgen.freeze`` writes the dispatch tables into ``generated/``.
"""

__version__ = "0.1.0"
