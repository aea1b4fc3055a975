"""The error tree of opgen: one class per kind of failure, each with a message template.

Every error says where the problem is (a file and a key path, an argument, a variant) and what was
expected. Imports nothing from opgen.
"""
from __future__ import annotations


class OpgenError(Exception):
    """Base of every error opgen raises on purpose."""


class SpecError(OpgenError):
    """A spec file that does not satisfy the schema or its own rules.

    Args:
        file: the spec file, as given (e.g. ``specs/chunk_gla_fwd_o_gk.yaml``).
        key_path: dotted path to the offending key (``variants.axes.scale_path``), or ``<root>``.
        expected: what the schema or rule wanted.
        got: what was found, shown as text.
    """

    def __init__(self, file: str, key_path: str, expected: str, got: object = None) -> None:
        self.file, self.key_path, self.expected, self.got = file, key_path, expected, got
        got_text = "" if got is None else f"; got {got!r}"
        super().__init__(f"{file}: {key_path}: expected {expected}{got_text}")


class ExprError(OpgenError):
    """A formula that is malformed or uses something outside the whitelist.

    Args:
        source: the formula text.
        reason: what is wrong with it.
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source, self.reason = source, reason
        super().__init__(f"formula {source!r}: {reason}")


class BudgetError(OpgenError):
    """A point or a frozen choice whose on-chip bytes exceed the chip's budget."""


class RecordError(OpgenError):
    """A tuning record that is malformed, stale or keyed for another op, chip or toolchain."""


class RenderError(OpgenError):
    """A template that fails to render (undefined name, syntax error in the output)."""


class BuildError(OpgenError):
    """``opgen build`` cannot produce a consistent ``generated/`` tree."""


class UnsupportedInput(OpgenError):
    """Input that the driver itself (not a generated op) cannot serve: an unknown chip or backend."""
