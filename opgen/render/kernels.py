"""An op's inputs and its rendered kernel modules: the one place that renders them, for
``opgen build`` (which writes them), ``opgen tune`` (which measures the generated modules and
keys its records and studies by their hashes) and ``opgen records`` (which reports against them).

Uses ``errors``, ``pyformat``, ``records``, ``render``, ``space``, ``spec``.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import jinja2

from ..errors import BuildError, RenderError
from ..space.space import variants_for
from ..spec.spec import OpSpec
from ..storage.records import kernel_hash
from .render import environment, file_hash, header, render
from .pyformat import format_source

GENERATED = "generated"
RENDERINGS = ("cuda", "npu")
DRIVER_TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
"""The driver's own templates (the public API, the tables): package data, shared by every project."""


@dataclass(frozen=True)
class GeneratedFile:
    """One file of ``generated/``: its path relative to the repository root and its text."""

    path: str
    text: str


@dataclass(frozen=True)
class KernelFile:
    """A rendered kernel module: its path, rendering, variant, the template's output (``source``)
    and its content hash (the records' identity, :attr:`hash`).

    :attr:`text` is what the build writes: ``source`` laid out by black
    (:func:`opgen.render.pyformat.format_source`, which changes no statement), formatted only when
    read (a tuning run keys its records by :attr:`hash` alone)."""

    path: str
    rendering: str
    variant: str
    source: str
    strided: bool = False

    @property
    def text(self) -> str:
        """The module as the build writes it."""
        return format_source(self.source)

    @property
    def hash(self) -> str:
        """:func:`opgen.storage.records.kernel_hash` of the template's output (header lines aside), so
        that the layout of the written module is no change of the kernel."""
        return kernel_hash(self.source)


@dataclass(frozen=True)
class OpInputs:
    """The files an op's output depends on, with their hashes for the headers."""

    spec_path: str
    spec_hash: str
    templates_glob: str
    templates_hash: str

    def header(self, records: Sequence[tuple[str, str]] = ()) -> str:
        """The header of the op's generated modules (a table's also names its records files,
        each as (path, hash))."""
        rows = [("spec", self.spec_path, self.spec_hash),
                ("templates", self.templates_glob, self.templates_hash)]
        rows += [("records", *r) for r in records]
        return header(rows)


def template_dirs(root: Path, op: str) -> list[Path]:
    """Where an op's templates are looked up: its own, then the driver's."""
    return [root / "templates" / op, DRIVER_TEMPLATES]


def op_environment(root: Path, op: str) -> jinja2.Environment:
    """The Jinja environment that renders one op."""
    return environment(template_dirs(root, op))


def op_inputs(root: Path, spec: OpSpec, driver: bool = True) -> OpInputs:
    """The spec and template files of ``spec`` with their hashes; the driver's templates too
    unless ``driver`` is False (kernel modules, which do not render through them).

    Raises:
        BuildError: without templates for the op.
    """
    files = sorted((root / "templates" / spec.op).glob("*.j2"))
    if not files:
        raise BuildError(f"no templates for {spec.op} under templates/{spec.op}/")
    label = f"templates/{spec.op}/*.j2"
    if driver:
        files += sorted(DRIVER_TEMPLATES.glob("*.j2"))
        label += ", opgen/templates/*.j2"
    return OpInputs(f"specs/{spec.op}.yaml", file_hash([root / "specs" / f"{spec.op}.yaml"]), label,
                    file_hash(files))


def render_kernels(root: Path, spec: OpSpec, renderings: tuple[str, ...] = RENDERINGS,
                   env: jinja2.Environment | None = None, twins: bool = False) -> list[KernelFile]:
    """Every kernel module of ``spec`` for ``renderings``, in rendering then variant order; with
    ``twins``, each followed by its strided twin where the spec names strided tensors
    (``api.strided``: the template rendered with ``STRIDED`` true, into
    ``kernels/<rendering>/strided/<variant>.py``). The twins have no tuning records: a strided
    call runs the twin of the variant and point the table chose for the contiguous call."""
    env = env or op_environment(root, spec.op)
    head = op_inputs(root, spec, driver=False).header()
    forms = (False, True) if twins and spec.api.strided else (False,)
    out = []
    for rendering in renderings:
        launch = [n for n, t in spec.tunables.items() if t.role == "launch" and rendering in t.domain]
        for variant in variants_for(spec, rendering):
            for strided in forms:
                context = dict(header=head, op=spec.op, variant_name=variant.name, backend=rendering,
                               launch_options=launch, STRIDED=strided, **variant.flags)
                source = render(env, variant.template, context)
                _require_launch(source, variant.template, rendering, variant.name)
                folder = f"{GENERATED}/{spec.op}/kernels/{rendering}" + ("/strided" if strided else "")
                out.append(KernelFile(f"{folder}/{variant.name}.py", rendering, variant.name, source, strided))
    return out


# What the generated API, the tuner's worker and the benchmark call in every kernel module.
KERNEL_ENTRY = "launch"


def _require_launch(source: str, template: str, rendering: str, variant: str) -> None:
    """A kernel module must define ``launch`` at its top level.

    Raises:
        RenderError: naming the template, the rendering and the variant otherwise.
    """
    defined = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    if KERNEL_ENTRY not in defined:
        raise RenderError(f"template {template} rendered the {rendering} kernel module of {variant} "
                          f"without a top-level {KERNEL_ENTRY}() (the generated API calls "
                          f"{KERNEL_ENTRY}(..., num_programs=..., point=...))")


def kernel_hashes(root: Path, spec: OpSpec, rendering: str) -> dict[str, str]:
    """Variant name -> content hash of its kernel module for ``rendering``, as the build renders it."""
    return {k.variant: k.hash for k in render_kernels(root, spec, (rendering,))}


def stale_kernels(root: Path, spec: OpSpec, rendering: str) -> list[str]:
    """The kernel modules of one rendering whose file differs from what the build renders
    (changed or missing): the modules a tuning run would measure are not the ones it records."""
    out = []
    for k in render_kernels(root, spec, (rendering,)):
        target = root / k.path
        if not target.exists() or target.read_bytes() != k.text.encode("utf-8"):
            out.append(k.path)
    return out
