"""The error tree of opgen: one class per kind of failure, each with its message template.

Every error says where the problem is (a file and a key path, an argument, a variant) and what was
expected. A class's ``template`` formats the fields its constructor takes; the free-text classes
take one ``detail`` and prefix it with the kind of failure. Imports nothing from opgen.
"""
from __future__ import annotations

from typing import ClassVar


class OpgenError(Exception):
    """Base of every error opgen raises on purpose.

    Args:
        detail: what went wrong, where, and what was expected.
    """

    template: ClassVar[str] = "{detail}"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(self.template.format(detail=detail))


class SpecError(OpgenError):
    """A spec file that does not satisfy the schema or its own rules.

    Args:
        file: the spec file, as given (e.g. ``specs/chunk_gla_fwd_o_gk.yaml``).
        key_path: dotted path to the offending key (``variants.axes.scale_path``), or ``<root>``.
        expected: what the schema or rule wanted.
        got: what was found, shown as text.
    """

    template = "{file}: {key_path}: expected {expected}{got}"

    def __init__(self, file: str, key_path: str, expected: str, got: object = None) -> None:
        self.file, self.key_path, self.expected, self.got = file, key_path, expected, got
        got_text = "" if got is None else f"; got {got!r}"
        self.detail = self.template.format(file=file, key_path=key_path, expected=expected, got=got_text)
        Exception.__init__(self, self.detail)


class ExprError(OpgenError):
    """A formula that is malformed or uses something outside the whitelist.

    Args:
        source: the formula text.
        reason: what is wrong with it.
    """

    template = "formula {source!r}: {reason}"

    def __init__(self, source: str, reason: str) -> None:
        self.source, self.reason = source, reason
        self.detail = self.template.format(source=source, reason=reason)
        Exception.__init__(self, self.detail)


class BudgetError(OpgenError):
    """A point or a frozen choice whose on-chip bytes exceed the chip's budget."""

    template = "over the on-chip budget: {detail}"


class RecordError(OpgenError):
    """A tuning record that is malformed, stale or keyed for another op, chip or toolchain."""

    template = "tuning records: {detail}"


class RenderError(OpgenError):
    """A template that fails to render (undefined name, syntax error in the output)."""

    template = "rendering: {detail}"


class BuildError(OpgenError):
    """``opgen build`` cannot produce a consistent ``generated/`` tree."""

    template = "build: {detail}"


class UnsupportedInput(OpgenError):
    """Input that the driver itself (not a generated op) cannot serve: an unknown chip, backend,
    device or variant, a stale kernel to tune, a case a baseline does not take."""

    template = "unsupported: {detail}"


class UsageError(OpgenError):
    """Options of the command line that do not go together or do not parse (``--shard 3``)."""

    template = "usage: {detail}"


class StorageError(OpgenError):
    """A tuning storage that cannot be opened or used: in use by another campaign, unreachable,
    or its connection lost mid-campaign."""

    template = "tuning storage: {detail}"


class WorkerError(OpgenError):
    """A measuring worker process that cannot start (its imports fail or hang)."""

    template = "worker process: {detail}"


class AccuracyError(OpgenError, ValueError):
    """Arguments an accuracy check cannot judge: mismatched shapes, an unsupported output dtype."""

    template = "accuracy check: {detail}"


class FrontendArgumentError(OpgenError, TypeError):
    """The kernel arguments given to the Ascend front-end check do not match the kernel."""

    template = "Ascend front end: {detail}"


class FrontendStateError(OpgenError, RuntimeError):
    """``triton.language`` is patched by the interpreter and cannot be restored here."""

    template = "Ascend front end: {detail}"

