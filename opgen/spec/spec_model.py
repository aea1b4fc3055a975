"""The schema of ``specs/<op>.yaml``: frozen pydantic models (``extra="forbid"``), the dtype
and backend names a spec may use, and the translation of a schema violation into a
:class:`~opgen.errors.SpecError` naming the file, the key path and what was expected.
No torch, no triton. Uses ``errors`` and ``expr``.
"""
from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema,
                      model_validator)

from ..errors import ExprError, SpecError, UsageError
from .expr import Expr, parse

BACKENDS = ("cuda", "npu", "interpreter")
"""Backends a spec may name. ``interpreter`` runs the npu rendering on the CPU."""

RENDERED_BACKENDS = ("cuda", "npu")
"""Backends with a rendering of their own."""

DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "int64": 8}
"""Dtype names a spec may use, with their sizes in bytes."""

MAX_DRAW = 10000
"""Cases a sampling section may draw, and extra measure cases it may add (each runs through every
formula of the spec, a millisecond or so: a larger draw would take hours)."""

Backend = Literal["cuda", "npu", "interpreter"]
DType = Literal["float16", "bfloat16", "float32", "int32", "int64"]
Scalar = Union[bool, int, float, str]


def _to_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    try:
        return parse(value)
    except ExprError as exc:
        raise ValueError(exc.reason) from None


# In the JSON Schema of the format (``opgen schema``), a formula is its source: a string or a number.
Formula = Annotated[Expr, BeforeValidator(_to_expr),
                    WithJsonSchema({"type": ["string", "number", "boolean"],
                                    "description": "a formula (opgen/spec/expr.py), or a constant"})]
Ident = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class TensorArg(_Model):
    """A tensor input: its dims (symbols bound from the first tensor that names them) and dtypes.

    An ``optional`` tensor defaults to None; formulas see ``<name>_given`` and its dims are
    checked only when it is given (it may not be the first to bind a dim).
    """

    dims: tuple[Ident, ...] = Field(min_length=1)
    dtypes: tuple[DType, ...] = Field(min_length=1)
    optional: bool = False
    doc: str = ""


class ScalarArg(_Model):
    """A Python scalar input with its type, default and allowed values.

    A ``dtype`` scalar takes a torch dtype; formulas see its name (``'float32'``).
    """

    type: Literal["int", "float", "bool", "dtype"]
    default: Union[bool, int, float, str]
    choices: tuple[Union[bool, int, float, str], ...] | None = None
    doc: str = ""


class OutputArg(_Model):
    """An output tensor: dims, and the input tensor or dtype scalar whose dtype it takes (or a
    dtype name); with ``when``, it is produced only where the formula holds (else None)."""

    dims: tuple[Ident, ...] = Field(min_length=1)
    dtype: str
    when: Formula | None = None
    doc: str = ""


class Signature(_Model):
    """The public signature: tensors first, then scalars with defaults; outputs are returned."""

    tensors: dict[Ident, TensorArg] = Field(min_length=1)
    scalars: dict[Ident, ScalarArg] = {}
    outputs: dict[Ident, OutputArg] = Field(min_length=1)


class Check(_Model):
    """A cross-argument rule with the error type and message a user sees when it fails."""

    rule: Formula
    error: Literal["TypeError", "ValueError", "NotImplementedError"]
    message: str = Field(min_length=1)


class Tunable(_Model):
    """A tunable: where it goes (kernel constexpr, launch option, grid size) and its domains."""

    role: Literal["constexpr", "launch", "grid"]
    domain: dict[Backend, tuple[Scalar, ...]]
    doc: str = ""


class AxisOption(_Model):
    """One option of a variant axis: when it is legal, where it renders, tunables it fixes, the
    kernel template of its variants when not the axes' own (a family of its own kernels), and
    whether their launches take host-side tensor descriptors (``host_descriptors``: torch.compile
    cannot trace those launches, so the generated op keeps such a call one opaque node)."""

    doc: str = ""
    when: Formula = parse("True")
    backends: tuple[Literal["cuda", "npu"], ...] = RENDERED_BACKENDS
    fixed: dict[Ident, Formula] = {}
    template: str | None = None
    host_descriptors: bool = False


class Variants(_Model):
    """Variant axes; a variant picks one option per axis; its name joins the option names.

    ``exclude`` lists formulas over the axis names: a combination for which one holds is not a
    variant (e.g. an axis that another option ignores). ``template`` renders every variant whose
    options name no template of their own.
    """

    template: str
    axes: dict[Ident, dict[Ident, AxisOption]] = Field(min_length=1)
    exclude: tuple[Formula, ...] = ()


class KeyField(_Model):
    """A dispatch key field: a formula, optionally bucketed by ascending upper edges."""

    expr: Formula
    buckets: tuple[int, ...] | None = None


DefaultValue = Union[Formula, tuple[Formula, ...]]
"""A default: one formula, or a list of them of which the first that fits the budget is taken."""


class Dispatch(_Model):
    """The dispatch key and the per-backend default choice (formulas of the params)."""

    key: dict[Ident, Union[KeyField, Formula]] = Field(min_length=1)
    defaults: dict[Backend, dict[Ident, DefaultValue]] = Field(min_length=1)
    # How far (L1 distance in bucket indices, a crossed field of fill_across counting 1) an
    # untuned bucket may take a tuned bucket's row; farther, or at 0, it runs the spec's default.
    # None: any distance.
    fill_distance: Union[int, None] = Field(default=None, ge=0)
    # Unbucketed key fields whose other values may fill an untuned bucket of the same buckets
    # (``dtype``): the nearest fill takes such a row before any at a bucket step from it; the
    # source's case takes the target's value as its case row field of that name.
    fill_across: tuple[Ident, ...] = ()
    # Bucketed key fields a fill may move (empty: every one it can): an untuned bucket takes a row
    # only from a bucket that differs from it in these fields alone (mamba3: the grid's size, not
    # the shapes its tiles and kernels follow).
    fill_moves: tuple[Ident, ...] = ()
    # How an untuned bucket the measure step never timed is filled: ``nearest``, the nearest tuned
    # or measured bucket's row; ``ranked``, the candidate the records timed nearest the fastest on
    # the buckets around it, weighed by distance (:mod:`opgen.table.fill_rank`).
    fill_rule: Literal["nearest", "ranked"] = "nearest"


class Reference(_Model):
    """``module:function`` paths of the float64 golden and its companions; ``half``, where given,
    computes the op as an upstream half-precision kernel does (its operands rounded where that
    kernel rounds them), the yardstick of :attr:`Accuracy.half_ratio`."""

    golden: str
    fp32: str
    magnitude: str
    inputs: str
    half: str | None = None


class Accuracy(_Model):
    """What a tuned point must meet: the golden checks (the dual benchmark, and the domain-aware
    cancellation check unless ``domain_check`` is off) and a rel-L2 bar per dtype on the first
    output. With ``half_ratio``, a case on which the upstream half-precision computation
    (``reference.half``) errs more raises the bar to ``half_ratio`` times that error."""

    max_rel_l2: dict[DType, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = {}
    half_ratio: float | None = Field(default=None, gt=0)
    domain_check: bool = True


class Api(_Model):
    """How the public function calls a variant module's ``launch``; ``strided``: the tensors the
    kernel templates also render to take through their strides (``STRIDED``, a twin module per
    variant under ``kernels/<rendering>/strided/``), read in place where their last stride is 1."""

    launch_args: tuple[Ident, ...] = Field(min_length=1)
    strided: tuple[Ident, ...] = ()
    template: str = "api.py.j2"


class SampleValues(_Model):
    """How a case input is drawn: uniformly from ``choices``, or log-uniformly from the integers
    of ``log_range`` (both ends included)."""

    choices: tuple[Scalar, ...] | None = Field(default=None, min_length=1)
    log_range: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "SampleValues":
        if (self.choices is None) == (self.log_range is None):
            raise ValueError("exactly one of choices and log_range")
        if self.log_range is not None and not 1 <= self.log_range[0] <= self.log_range[1]:
            raise ValueError(f"log_range [low, high] with 1 <= low <= high, got {list(self.log_range)}")
        return self


class SampleTails(_Model):
    """Sequences that are no multiple of the chunk: ``symbol`` is rounded to a multiple of
    ``multiple_of`` in every drawn case, except in a ``share`` of them, where it falls strictly
    between two multiples."""

    symbol: Ident
    multiple_of: Ident
    share: float = Field(ge=0.0, le=1.0)


class SamplePin(_Model):
    """Values set in a ``share`` of the drawn cases (e.g. ``{H: 1}``), after the draw."""

    share: float = Field(ge=0.0, le=1.0)
    values: dict[Ident, Scalar] = Field(min_length=1)


class Sampling(_Model):
    """Case sets drawn from the supported space (``opgen cases``), written to ``file`` (relative
    to the spec's folder) as ``<name>_tune``, ``<name>_measure`` and ``<name>_holdout``; the spec
    reads them from there as case sets of its own.

    ``count`` cases are drawn with ``seed``; a draw that fails the spec's checks, ``limit`` or a
    chip's defaults, or repeats a case, is drawn again. Every variant of ``rendering`` is legal
    for at least ``cover`` cases (more are drawn where the first draw misses one). ``holdout``
    and ``measure`` are the shares split off the tune part; the ``include`` case sets join it.
    ``measure_extra`` more cases, drawn after all of those from the same generator, join the
    measure part alone: a denser measure step that leaves the tune and holdout parts as drawn.
    """

    name: Ident
    file: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.yaml$")
    count: int = Field(ge=1, le=MAX_DRAW)
    seed: int = 0
    holdout: float = Field(default=0.0, ge=0.0, lt=1.0)
    measure: float = Field(default=0.0, ge=0.0, lt=1.0)
    measure_extra: int = Field(default=0, ge=0, le=MAX_DRAW)
    values: dict[Ident, SampleValues] = Field(min_length=1)
    tails: SampleTails | None = None
    pins: tuple[SamplePin, ...] = ()
    limit: Formula | None = None
    cover: int = Field(default=1, ge=0)
    rendering: Literal["cuda", "npu"] = "cuda"
    include: tuple[Ident, ...] = ()

    @model_validator(mode="after")
    def _shares(self) -> "Sampling":
        if self.holdout + self.measure >= 1.0:
            raise ValueError(f"holdout + measure below 1 (the tune part keeps the rest), got "
                             f"{self.holdout} + {self.measure}")
        if ".." in self.file.split("/"):
            raise ValueError(f"a file under the spec's folder, got {self.file!r}")
        return self

    def part_names(self) -> tuple[str, str, str]:
        """The case sets it writes: tune, measure and holdout parts."""
        return f"{self.name}_tune", f"{self.name}_measure", f"{self.name}_holdout"


class OpSpec(_Model):
    """A whole operator spec, validated. ``path`` is where it was loaded from."""

    op: Ident
    doc: str
    signature: Signature
    params: dict[Ident, Formula] = {}
    checks: tuple[Check, ...] = ()
    tunables: dict[Ident, Tunable] = Field(min_length=1)
    constraints: tuple[Formula, ...] = ()
    variants: Variants
    # One formula per budget kind, or one per kernel ({kernel: formula}): a point fits when every
    # kernel does, and a cut names the kernel that overflows.
    budgets: dict[Literal["cuda", "npu"], dict[Literal["ub_bytes", "smem_bytes"], Formula | dict[Ident, Formula]]]
    dispatch: Dispatch
    reference: Reference
    api: Api
    accuracy: Accuracy = Accuracy()
    baselines: dict[Ident, str] = {}
    traffic_bytes: Formula | None = None
    cases: dict[Ident, tuple[dict[Ident, Union[Scalar, tuple[Scalar, ...]]], ...]] = {}
    sampling: Sampling | None = None
    path: str = ""

    @model_validator(mode="after")
    def _half_reference(self) -> "OpSpec":
        if self.accuracy.half_ratio is not None and self.reference.half is None:
            raise ValueError("accuracy.half_ratio needs reference.half, the computation it is a ratio of")
        return self

    # --- derived views -------------------------------------------------------------------
    def dim_symbols(self) -> tuple[str, ...]:
        """Dim symbols bound from tensor shapes (those not computed as params), in order."""
        seen: dict[str, None] = {}
        for arg in self.signature.tensors.values():
            for dim in arg.dims:
                if dim not in self.params:
                    seen.setdefault(dim)
        return tuple(seen)

    def call_dtypes(self) -> list[str]:
        """The dtypes a call's (a case's) ``dtype`` may name: those every tensor of several dtypes
        allows (the tensors that follow the call's dtype), or where each tensor has one, any of theirs."""
        following = [set(arg.dtypes) for arg in self.signature.tensors.values() if len(arg.dtypes) > 1]
        if following:
            return sorted(set.intersection(*following))
        return sorted({d for arg in self.signature.tensors.values() for d in arg.dtypes})

    def input_names(self) -> tuple[str, ...]:
        """Names visible to params and checks: dims, scalars, ``<tensor>_dtype``, ``<tensor>_given``."""
        tensors = self.signature.tensors
        dtypes = tuple(f"{t}_dtype" for t in tensors)
        given = tuple(f"{t}_given" for t, arg in tensors.items() if arg.optional)
        return self.dim_symbols() + tuple(self.signature.scalars) + dtypes + given

    def param_names(self) -> tuple[str, ...]:
        """Everything the dispatch formulas may read: inputs plus params."""
        return self.input_names() + tuple(self.params)

    def tunables_for(self, backend: str) -> tuple[str, ...]:
        """Tunables with a domain on ``backend``. The interpreter tunes like npu, without the
        launch options (it has no compiler to pass them to, and refuses them)."""
        if backend == "interpreter":
            return tuple(n for n, t in self.tunables.items() if "npu" in t.domain and t.role != "launch")
        return tuple(n for n, t in self.tunables.items() if backend in t.domain)

    def expand_cases(self, name: str, where: str | None = None) -> list[dict[str, Scalar]]:
        """The named case set with list values expanded to their cross product, in order; with
        ``where`` (a formula of a case's fields), only the cases it passes.

        Raises:
            SpecError: no such case set.
            ExprError: ``where`` is malformed or reads a name no case has.
            UsageError: no case passes ``where``.
        """
        if name not in self.cases:
            raise SpecError(self.path, f"cases.{name}", f"one of {sorted(self.cases)}", name)
        out: list[dict[str, Scalar]] = []
        for row in self.cases[name]:
            keys = list(row)
            values = [v if isinstance(v, tuple) else (v,) for v in row.values()]
            out.extend(dict(zip(keys, combo)) for combo in itertools.product(*values))
        if where is None:
            return out
        test = parse(where)
        kept = [row for row in out if test.evaluate(row)]
        if not kept:
            raise UsageError(f"where {where!r}: none of the {len(out)} cases of {name!r} passes")
        return kept


_LOC_NOISE = {"[key]", "bool", "int", "float", "str"}


def _key_path(loc: tuple[Any, ...]) -> str:
    """The YAML key path of a pydantic error location, without union-member and validator tags."""
    models = {cls.__name__ for cls in _Model.__subclasses__()}
    parts = [str(p) for p in loc
             if not (isinstance(p, str) and (p in _LOC_NOISE or p in models or "[" in p
                                             or p.startswith(("function-", "tagged-"))))]
    return ".".join(parts) or "<root>"


def schema_error(file: str, err: ValidationError) -> SpecError:
    """The spec error of a schema violation: the first error, preferring one on content."""
    errors = err.errors()
    # In a union (formula or mapping), the member that failed on content beats one of wrong shape.
    shaped = [e for e in errors if e["type"] not in ("model_type", "dict_type", "model_attributes_type")]
    first = (shaped or errors)[0]
    got = first.get("input")
    got_text = None if isinstance(got, dict) else got
    return SpecError(file, _key_path(first["loc"]), first["msg"], got_text)

