"""opgen: a code-generation and autotuning compiler driver for Triton kernels.

The flow is spec -> space -> render -> tune -> freeze -> generated, one package each: ``opgen.spec``
loads and validates ``specs/<op>.yaml``, ``opgen.space`` enumerates variants and tunables under a
chip's on-chip budget, ``opgen.render`` fills the Jinja templates, ``opgen.tune`` searches offline
(one point measured by ``opgen.run``, the results kept by ``opgen.storage``), ``opgen.table``
freezes the records into dispatch tables and ``opgen.build`` writes them into ``generated/``;
``opgen.evidence`` holds the commands that read what was measured and frozen, ``opgen.cli`` the
command line.
"""

__version__ = "0.1.0"
