"""Rendering: Jinja templates in a bounded environment (``render``), every generated line within 100
characters (``wrap``), an op's kernel modules and their hashes (``kernels``)."""
