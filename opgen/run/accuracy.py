"""Accuracy of kernel outputs against float64 goldens: metrics, dual benchmark, domain check.

Every function accepts tensors of any device and floating dtype and computes in float64 on the
golden's device (the CPU for a CPU golden; the tuner keeps large goldens on the GPU).
Imports nothing from opgen but ``errors``. Thresholds live in one table, ``CRITERIA`` (a frozen
``Criteria`` per output dtype), derived from the dtype's unit roundoff u (2^-11 fp16, 2^-8 bf16,
2^-24 fp32) and one elementwise error model of an acceptable kernel:

    |out - golden| <= u * |golden| + e * magnitude

``magnitude`` is the sum of |term| of the computation (sum |a_i * b_i| for a dot product),
u * |golden| the final rounding to the output dtype, e the relative error allowed on each term:

- fp16, bf16: e = 3u. A kernel may round both operands of every product to the output dtype (half
  dot operands with fp32 accumulation, as the FLA baseline does: at most 2u per term); the third u
  covers fp32 arithmetic (exp, scale, accumulation) and second-order terms. The domain check's
  thresholds are this model's bounds, so such a kernel cannot fail them (measured on
  chunk_gla_fwd_o_gk, 1M outputs: an FLA-style kernel reaches 1.1u * magnitude at worst).
- fp32: e = 32u. fp32 operands and accumulation; rounding in sums of n terms grows about as
  sqrt(n) u (measured: 5.2u at worst for n ~ 200, 3-pass tf32 included). A kernel with single-pass
  tf32/hf32 dots (2^-11 per operand) fails, as it should for an fp32 output.

The checks: ``dual_benchmark`` (global errors of the kernel next to an fp32 reference's, floored
by the rounding of the golden to the output dtype), ``domain_check`` (elementwise; cancellation
elements judged against their magnitude, the others against |golden|), ``check_all`` (both).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from opgen.errors import AccuracyError

__all__ = [
    "AccuracyError", "Criteria", "CRITERIA", "criteria_for", "rel_l2", "max_abs_rel", "mere",
    "max_rel", "DualResult", "dual_benchmark", "WorstCase", "DomainResult", "domain_check",
    "AccuracyReport", "check_all",
]


# -- the criteria table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Criteria:
    """Thresholds for one output dtype, all derived in ``_derive``; look up with ``criteria_for``.

    Attributes:
        dtype: output dtype name (``float16``, ``bfloat16``, ``float32``).
        unit_roundoff: u, half the distance from 1.0 to the next value of the dtype.
        term_error: e, relative error allowed on every term of the computation (module docstring).
        dual_ratio: a kernel's global error may be up to this many times the fp32 reference's ...
        dual_floor: ... or up to this many times the error of the golden rounded to the dtype.
        cancel_ratio: c; an element is special (cancellation) when |golden| < c * magnitude, i.e.
            when its condition number magnitude / |golden| exceeds 1 / c.
        rtol: normal elements pass when |out - golden| <= rtol * |golden| + atol; rtol = u + e / c
            is the model's bound at the worst normal element (|golden| = c * magnitude).
        rtol_special: special elements pass when |out - golden| <= rtol_special * magnitude + atol;
            rtol_special = e + c * u is the model's bound at the worst special element.
        atol: u * the dtype's smallest normal number, the largest rounding error of a subnormal
            result (and the only slack of an element whose golden and magnitude are both 0).
        mere_floor_rel: ``check_all`` floors MERE's denominators at this fraction of max |golden|.
    """

    dtype: str
    unit_roundoff: float
    term_error: float
    dual_ratio: float
    dual_floor: float
    cancel_ratio: float
    rtol: float
    rtol_special: float
    atol: float
    mere_floor_rel: float


def _derive(dtype: torch.dtype, term_mult: float) -> Criteria:
    """Criteria of ``dtype`` with e = term_mult * u."""
    info = torch.finfo(dtype)
    u = info.eps / 2
    e = term_mult * u
    c = 2.0 ** -4  # condition number above 16 is cancellation (~20% of chunk_gla's outputs)
    return Criteria(
        dtype=str(dtype).removeprefix("torch."),
        unit_roundoff=u,
        term_error=e,
        # 4x an fp32 computation: binding for fp32 outputs only (another summation order or
        # 3-pass tf32 measures 1.0-1.3x on >= 1k outputs, up to 2.7x on 80).
        dual_ratio=4.0,
        # 3x the unavoidable rounding: binding for fp16/bf16 (FLA-style kernels measure 1.4x,
        # up to 2.1x on 80 outputs; an fp32-operand kernel 1.0x).
        dual_floor=3.0,
        cancel_ratio=c,
        rtol=u + e / c,
        rtol_special=e + c * u,
        atol=info.tiny * u,
        mere_floor_rel=2.0 ** -8,
    )


CRITERIA: dict[torch.dtype, Criteria] = {
    torch.float16: _derive(torch.float16, 3.0),    # rtol 49u = 2.4e-2, rtol_special 3.06u = 1.5e-3
    torch.bfloat16: _derive(torch.bfloat16, 3.0),  # rtol 49u = 0.19, rtol_special 3.06u = 1.2e-2
    torch.float32: _derive(torch.float32, 32.0),   # rtol 513u = 3.1e-5, rtol_special 32u = 1.9e-6
}


def criteria_for(dtype: torch.dtype) -> Criteria:
    """The criteria of an output dtype.

    Raises:
        AccuracyError: for a dtype outside ``CRITERIA``.
    """
    try:
        return CRITERIA[dtype]
    except KeyError:
        names = ", ".join(c.dtype for c in CRITERIA.values())
        raise AccuracyError(f"no accuracy criteria for output dtype {dtype}; "
                            f"expected one of {names}") from None


# -- metrics ---------------------------------------------------------------------------------------


def _f64(t: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    return t.detach().to(device=device, dtype=torch.float64)


def _pair(out: torch.Tensor, golden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both in float64 on the golden's device (a GPU golden keeps the tuner's checks on the GPU)."""
    if tuple(out.shape) != tuple(golden.shape):
        raise AccuracyError(f"output shape {tuple(out.shape)} differs from golden shape "
                            f"{tuple(golden.shape)}")
    return _f64(out, golden.device), _f64(golden, golden.device)


def _ratio(num: float, den: float) -> float:
    """num / den, with 0 / 0 = 0 and x / 0 = inf (an error against an all-zero golden)."""
    if den > 0:
        return num / den
    if math.isnan(num):
        return math.nan
    return 0.0 if num == 0 else math.inf


def rel_l2(out: torch.Tensor, golden: torch.Tensor) -> float:
    """||out - golden||_2 / ||golden||_2 (0 when both are zero, inf when only golden is)."""
    o, g = _pair(out, golden)
    return _ratio(torch.linalg.vector_norm(o - g).item(), torch.linalg.vector_norm(g).item())


def max_abs_rel(out: torch.Tensor, golden: torch.Tensor) -> float:
    """max |out - golden| / max |golden|: the global metric for outputs whose values are near 0."""
    o, g = _pair(out, golden)
    if o.numel() == 0:
        return 0.0
    return _ratio((o - g).abs().max().item(), g.abs().max().item())


def _elementwise_rel(out: torch.Tensor, golden: torch.Tensor, floor: float) -> torch.Tensor:
    if not floor > 0:
        raise AccuracyError(f"relative-error floor must be positive, got {floor}")
    o, g = _pair(out, golden)
    return (o - g).abs() / g.abs().clamp_min(floor)


def mere(out: torch.Tensor, golden: torch.Tensor, floor: float) -> float:
    """Mean elementwise relative error, mean(|out - golden| / max(|golden|, floor)); floor > 0."""
    r = _elementwise_rel(out, golden, floor)
    return r.mean().item() if r.numel() else 0.0


def max_rel(out: torch.Tensor, golden: torch.Tensor, floor: float) -> float:
    """Max elementwise relative error, max(|out - golden| / max(|golden|, floor)); floor > 0."""
    r = _elementwise_rel(out, golden, floor)
    return r.max().item() if r.numel() else 0.0


# -- dual benchmark --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DualResult:
    """The kernel's and the fp32 reference's global errors against the golden, and the verdict.

    ``*_rms`` are relative L2 errors, ``*_max`` are max |x - golden| / max |golden|; ``round_*`` are
    the errors of the golden rounded to the output dtype, ``allowed_*`` the kernel's thresholds.
    """

    dtype: str
    kernel_rms: float
    ref32_rms: float
    round_rms: float
    allowed_rms: float
    kernel_max: float
    ref32_max: float
    round_max: float
    allowed_max: float
    nonfinite: int
    passed: bool
    reason: str


def dual_benchmark(out: torch.Tensor, ref32: torch.Tensor, golden: torch.Tensor, *,
                   dtype: torch.dtype | None = None,
                   criteria: Criteria | None = None) -> DualResult:
    """Judge the kernel's global error next to an fp32 reference's, both against the golden.

    For each metric M in (rel_l2, max_abs_rel), with u the output dtype's unit roundoff::

        allowed = max(dual_ratio * M(ref32), dual_floor * max(M(golden.to(dtype)), lower))
        pass    = M(out) <= allowed for both metrics, and every output finite

    with lower = u / 4 for rel_l2 and u for max_abs_rel. The first term accepts a kernel not much
    worse than an fp32 computation of the same math (binding for fp32 outputs); the second one
    within a few times the error that rounding the exact result to the output dtype makes anyway
    (binding for fp16/bf16 outputs, which cannot beat that rounding). ``lower`` keeps a golden that
    happens to be nearly representable, or a small tensor whose largest elements round luckily,
    from demanding a bit-exact kernel; rounding never moves an element by more than
    u * max |golden|, so the max_abs_rel floor is in practice dual_floor * u.

    Args:
        out: the kernel's output.
        ref32: the fp32 reference's output (not rounded to the output dtype).
        golden: the float64 golden.
        dtype: the output dtype judged; defaults to ``out.dtype``.
        criteria: overrides ``criteria_for(dtype)``.
    """
    dtype = out.dtype if dtype is None else dtype
    cr = criteria_for(dtype) if criteria is None else criteria
    u = cr.unit_roundoff
    rounded = _f64(golden, golden.device).to(dtype)
    k_rms, r_rms, o_rms = (rel_l2(x, golden) for x in (out, ref32, rounded))
    k_max, r_max, o_max = (max_abs_rel(x, golden) for x in (out, ref32, rounded))
    allowed_rms = max(cr.dual_ratio * r_rms, cr.dual_floor * max(o_rms, u / 4))
    allowed_max = max(cr.dual_ratio * r_max, cr.dual_floor * max(o_max, u))
    bad = int((~torch.isfinite(out.detach())).sum().item())
    fails = [f"{bad} non-finite outputs"] if bad else []
    for name, k, allowed, r, o in (("rel_l2", k_rms, allowed_rms, r_rms, o_rms),
                                   ("max_abs_rel", k_max, allowed_max, r_max, o_max)):
        if not k <= allowed:
            fails.append(f"{name} {k:.3g} > {allowed:.3g} (fp32 ref {r:.3g}, "
                         f"{cr.dtype} rounding {o:.3g})")
    if fails:
        reason = "dual FAIL: " + "; ".join(fails)
    else:
        reason = (f"dual ok: rel_l2 {k_rms:.3g} <= {allowed_rms:.3g}, "
                  f"max_abs_rel {k_max:.3g} <= {allowed_max:.3g}")
    return DualResult(cr.dtype, k_rms, r_rms, o_rms, allowed_rms, k_max, r_max, o_max,
                      allowed_max, bad, not fails, reason)


# -- domain-aware check ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorstCase:
    """One element of a domain check, with its error next to its tolerance."""

    index: tuple[int, ...]
    out: float
    golden: float
    magnitude: float
    abs_err: float
    tol: float

    @property
    def ratio(self) -> float:
        """abs_err / tol: above 1 is a mismatch (NaN for a NaN output)."""
        return _ratio(self.abs_err, self.tol)


@dataclass(frozen=True)
class DomainResult:
    """Counts and worst elements of ``domain_check`` (worst first, ``n_worst`` per domain)."""

    dtype: str
    cancel_ratio: float
    rtol: float
    atol: float
    rtol_special: float
    n_total: int
    n_normal: int
    n_special: int
    normal_mismatch_count: int
    special_mismatch_count: int
    nonfinite: int
    max_diff: float
    worst_normal: tuple[WorstCase, ...]
    worst_special: tuple[WorstCase, ...]
    passed: bool
    reason: str


def _worst(ratio: torch.Tensor, mask: torch.Tensor, n: int, o: torch.Tensor, g: torch.Tensor,
           m: torch.Tensor, tol: torch.Tensor) -> tuple[WorstCase, ...]:
    """The n elements of ``mask`` with the largest error / tolerance (NaN ranks first)."""
    k = min(n, int(mask.sum().item()))
    if k == 0:
        return ()
    key = torch.where(mask, ratio.nan_to_num(nan=math.inf, posinf=math.inf), -math.inf)
    flat = [o.flatten(), g.flatten(), m.flatten(), tol.flatten()]
    cases = []
    for i in torch.topk(key.flatten(), k).indices.tolist():
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), tuple(g.shape)))
        of, gf, mf, tf = (t[i].item() for t in flat)
        cases.append(WorstCase(idx, of, gf, mf, abs(of - gf), tf))
    return tuple(cases)


def domain_check(out: torch.Tensor, golden: torch.Tensor, magnitude: torch.Tensor, *,
                 dtype: torch.dtype | None = None, criteria: Criteria | None = None,
                 n_worst: int = 3) -> DomainResult:
    """Elementwise check that tells cancellation apart from real mismatch.

    With m = magnitude (the reference's sum of |term| per element) and the dtype's criteria::

        special: |golden| <  c * m   passes when |out - golden| <= rtol_special * m + atol
        normal:  |golden| >= c * m   passes when |out - golden| <= rtol * |golden| + atol

    A special element's true value is a small difference of large terms: no kernel that rounds its
    terms is accurate relative to |golden| there, so it is held to an error small against the terms.
    Normal elements are held to a relative error. Thresholds: ``Criteria`` and the module docstring.
    Passes when no element mismatches (a non-finite output is a mismatch of its domain).

    Args:
        out: the kernel's output.
        golden: the float64 golden.
        magnitude: the reference's sum of |term|, golden's shape, non-negative.
        dtype: the output dtype judged; defaults to ``out.dtype``.
        criteria: overrides ``criteria_for(dtype)``.
        n_worst: how many worst elements to keep per domain.
    """
    dtype = out.dtype if dtype is None else dtype
    cr = criteria_for(dtype) if criteria is None else criteria
    o, g = _pair(out, golden)
    if tuple(magnitude.shape) != tuple(g.shape):
        raise AccuracyError(f"magnitude shape {tuple(magnitude.shape)} differs from golden shape "
                            f"{tuple(g.shape)}")
    m = _f64(magnitude, golden.device)
    if bool((m < 0).any()):
        raise AccuracyError("magnitude has negative elements; expected sum of |term| per element")
    diff = (o - g).abs()
    special = g.abs() < cr.cancel_ratio * m
    normal = ~special
    tol = torch.where(special, cr.rtol_special * m, cr.rtol * g.abs()) + cr.atol
    bad_el = ~(diff <= tol)  # NaN counts as bad
    n_norm_bad = int((normal & bad_el).sum().item())
    n_spec_bad = int((special & bad_el).sum().item())
    n_special = int(special.sum().item())
    nonfinite = int((~torch.isfinite(o)).sum().item())
    passed = n_norm_bad == 0 and n_spec_bad == 0
    reason = (f"domain {'ok' if passed else 'FAIL'}: normal {n_norm_bad}/{g.numel() - n_special},"
              f" special {n_spec_bad}/{n_special} mismatched")
    if nonfinite:
        reason += f"; {nonfinite} non-finite outputs"
    ratio = diff / tol
    return DomainResult(
        dtype=cr.dtype, cancel_ratio=cr.cancel_ratio, rtol=cr.rtol, atol=cr.atol,
        rtol_special=cr.rtol_special, n_total=g.numel(), n_normal=g.numel() - n_special,
        n_special=n_special, normal_mismatch_count=n_norm_bad, special_mismatch_count=n_spec_bad,
        nonfinite=nonfinite, max_diff=diff.max().item() if diff.numel() else 0.0,
        worst_normal=_worst(ratio, normal, n_worst, o, g, m, tol),
        worst_special=_worst(ratio, special, n_worst, o, g, m, tol),
        passed=passed, reason=reason)


# -- everything at once ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AccuracyReport:
    """Headline metrics and the verdicts of the dual benchmark and, given a magnitude, the domain
    check for one output. ``passed`` requires every check that ran to pass."""

    dtype: str
    shape: tuple[int, ...]
    rel_l2: float
    max_abs_rel: float
    max_diff: float
    mere: float
    dual: DualResult
    domain: DomainResult | None
    passed: bool
    notes: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        """One line: verdict, headline metrics, and each check's reason."""
        parts = [f"{'PASS' if self.passed else 'FAIL'} {self.dtype}{list(self.shape)}",
                 f"rel_l2={self.rel_l2:.3e} max_abs_rel={self.max_abs_rel:.3e} "
                 f"max_diff={self.max_diff:.3e} mere={self.mere:.3e}",
                 self.dual.reason]
        if self.domain is not None:
            parts.append(self.domain.reason)
        return " | ".join(parts + list(self.notes))


def check_all(out: torch.Tensor, golden: torch.Tensor, ref32: torch.Tensor,
              magnitude: torch.Tensor | None = None, *, dtype: torch.dtype | None = None,
              criteria: Criteria | None = None) -> AccuracyReport:
    """Run the headline metrics, ``dual_benchmark`` and, given a magnitude, ``domain_check``.

    Args:
        out: the kernel's output.
        golden: the float64 golden.
        ref32: the fp32 reference's output.
        magnitude: the reference's sum of |term| per element; None skips the domain check (noted).
        dtype: the output dtype judged; defaults to ``out.dtype``.
        criteria: overrides ``criteria_for(dtype)``.
    """
    dtype = out.dtype if dtype is None else dtype
    cr = criteria_for(dtype) if criteria is None else criteria
    o, g = _pair(out, golden)
    dual = dual_benchmark(out, ref32, golden, dtype=dtype, criteria=cr)
    domain = None
    if magnitude is not None:
        domain = domain_check(out, golden, magnitude, dtype=dtype, criteria=cr)
    gmax = g.abs().max().item() if g.numel() else 0.0
    return AccuracyReport(
        dtype=cr.dtype, shape=tuple(g.shape), rel_l2=dual.kernel_rms, max_abs_rel=dual.kernel_max,
        max_diff=(o - g).abs().max().item() if g.numel() else 0.0,
        mere=mere(o, g, cr.mere_floor_rel * gmax if gmax > 0 else cr.atol),
        dual=dual, domain=domain, passed=dual.passed and (domain is None or domain.passed),
        notes=() if magnitude is not None else ("domain check skipped: no magnitude",))
