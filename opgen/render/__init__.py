"""Rendering: Jinja templates in a bounded environment (``render``), generated Python laid out by
black (``pyformat``), an op's kernel modules and their hashes (``kernels``)."""
