"""The whole Mamba-3 MIMO backward: the two generated stages and the reductions between them.

``mamba3_mimo_backward`` takes the layer's inputs as its forward saw them (the raw-input
convention of ``opgen.references.mamba3_mimo_forward.forward``) and ``dout``, and returns the
gradient of every input::

    q, k [B,S,R,G,N]     v, z, dout [B,S,H,P]     q_bias, k_bias [H,R,N]
    mimo_v (Psi), mimo_o (Phi), mimo_z (Zeta) [H,R,P]     angles [B,S,H,NA]
    dA, dt, trap [B,H,S]     d [H]

It builds the chunk-local decays (da_cs, da_cs_rev, segsum) from dA and, with ``raw_angles``, the
rotation angles theta[t] = sum_{s<=t} pi tanh(angles[s]) dt[s] from per-step angles; runs
``generated.mamba3_mimo_bwd_fwd`` (the states entering each chunk, qk_dot, dmimo_o, dmimo_z, dz)
and ``generated.mamba3_mimo_bwd_bwd`` (the reverse chunk scan); then, as plain torch ops in
float32, sums dq / dk over each group's heads and over B, S for the biases, sums the per-batch
parameter gradients over B and applies the chain rules of trap, dt, dA and the angles
(``docs/mamba3_backward.md``, "The reductions").

The same computation is the torch custom op ``opgen::mamba3_mimo_backward`` (a fake
implementation included, so ``torch.compile`` keeps it as one node), and ``with_opgen_backward``
wraps any forward callable in a ``torch.autograd.Function`` whose backward is this one: opgen has
no forward kernel of this layer, and the backward needs nothing from the forward but its inputs.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import generated.mamba3_mimo_bwd_bwd  # noqa: F401  (registers opgen::mamba3_mimo_bwd_bwd)
import generated.mamba3_mimo_bwd_fwd  # noqa: F401  (registers opgen::mamba3_mimo_bwd_fwd)
from generated.mamba3_mimo_bwd_fwd import _compile_error  # an argument's error as torch.compile shows it first

__all__ = ["GRADIENTS", "Mamba3MimoFunction", "mamba3_mimo_backward", "with_opgen_backward"]

INPUTS = ("q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "angles", "dA", "dt", "trap",
          "mimo_z", "d", "z")
"""The forward's tensor inputs, in the order of the arguments and of the gradients."""
GRADIENTS = tuple("d" + name for name in INPUTS)
"""The names of ``mamba3_mimo_backward``'s results, in order (``ddA`` is dA's gradient)."""
_OPTIONAL = ("mimo_z", "d", "z")
Tensor = torch.Tensor


def _error(kind: type[Exception], message: str) -> Exception:
    return kind(f"mamba3_mimo_backward: {message}")


def _check_options(chunk_size: int, raw_angles: bool) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise _error(TypeError, f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise _error(ValueError, f"chunk_size must be positive, got {chunk_size}")
    if not isinstance(raw_angles, bool):
        raise _error(TypeError, f"raw_angles must be a bool, got {type(raw_angles).__name__}")


def _check(dA: Tensor, dt: Tensor, angles: Tensor, chunk_size: int, raw_angles: bool) -> None:
    """Refuse what the stages cannot name: they see da_cs, segsum and theta, not dA or angles."""
    _check_options(chunk_size, raw_angles)
    for name, x in (("dA", dA), ("dt", dt), ("angles", angles)):
        if not isinstance(x, torch.Tensor):
            raise _error(TypeError, f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.float32:
            raise _error(TypeError, f"{name}.dtype must be float32, got {x.dtype}")
    if dt.dim() != 3:
        raise _error(ValueError, f"dt must have 3 dims [B, H, S], got shape {tuple(dt.shape)}")
    if dA.shape != dt.shape:
        raise _error(ValueError, f"dA must have dt's shape [B, H, S] = {tuple(dt.shape)}, got "
                                 f"{tuple(dA.shape)}")
    if angles.dim() != 4 or (angles.shape[0], angles.shape[2], angles.shape[1]) != dt.shape:
        raise _error(ValueError, f"angles must be [B, S, H, NA] with B, H, S of dt "
                                 f"{tuple(dt.shape)}, got {tuple(angles.shape)}")


def _chunks(x: Tensor, C: int) -> Tensor:
    """[B,H,S] -> [B,H,nc,C], zero past S."""
    S = x.shape[-1]
    nc = -(-S // C)
    return F.pad(x, (0, nc * C - S)).unflatten(-1, (nc, C))


def _decays(dA: Tensor, C: int) -> tuple[Tensor, Tensor, Tensor]:
    """da_cs, da_cs_rev [B,H,S] and segsum [B,H,nc,C,C] of dA, per chunk; dA is 0 past S."""
    S = dA.shape[-1]
    cs = _chunks(dA, C).cumsum(-1)
    low = torch.ones((C, C), dtype=torch.bool, device=dA.device).tril(-1)
    segsum = torch.where(low, cs[..., :, None] - cs[..., None, :], 0.0)
    return cs.flatten(2)[..., :S], (cs[..., -1:] - cs).flatten(2)[..., :S], segsum


def _group(dx: Tensor, G: int) -> tuple[Tensor, Tensor]:
    """Per-head dq or dk [B,S,R,H,N] -> (grouped [B,S,R,G,N], the bias's [H,R,N])."""
    B, S, R, H, N = dx.shape
    return dx.reshape(B, S, R, G, H // G, N).sum(4), dx.sum((0, 1)).permute(1, 0, 2)


def _trap_chain(dfactor: Tensor, dgamma_diag: Tensor, dt: Tensor, trap: Tensor
                ) -> tuple[Tensor, Tensor]:
    """(ddt, dtrap): gamma[t] = dt[t] sig(trap[t]) takes dfactor + dgamma_diag at t, the term
    dt[t] sig(-trap[t]) of trap_scale[t-1] takes dfactor[t-1]."""
    dgamma = dfactor + dgamma_diag
    dprev = F.pad(dfactor[..., :-1], (1, 0))
    sig = torch.sigmoid(trap)
    return dgamma * sig + dprev * (1 - sig), (dgamma - dprev) * dt * sig * (1 - sig)


def _decay_chain(dda: Tensor, dda_cs: Tensor, dda_cs_rev: Tensor, dssda: Tensor,
                 da_cs: Tensor, da_cs_rev: Tensor, segsum: Tensor, C: int) -> Tensor:
    """ddA [B,H,S]: within a chunk dA[i] enters da_cs[j >= i], da_cs_rev[j < i] and
    segsum[t, u] for u < i <= t; dda (the state decay's) already holds each token's share."""
    S = dda.shape[-1]
    g_cs = _chunks(torch.exp(da_cs) * dda_cs, C)
    g_rev = _chunks(torch.exp(da_cs_rev) * dda_cs_rev, C)
    total = g_cs.flip(-1).cumsum(-1).flip(-1) + g_rev.cumsum(-1) - g_rev
    # dssda is a gradient only for u < t < L; a kernel may leave products elsewhere
    valid = _chunks(torch.ones_like(dda[0, 0]), C).bool()  # [nc, C]: t < S
    low = torch.ones((C, C), dtype=torch.bool, device=dda.device).tril(-1)  # [t, u]: u < t
    g_ss = torch.where(low & valid[:, :, None], torch.exp(segsum) * dssda.transpose(-1, -2), 0.0)
    below = g_ss.flip(-2).cumsum(-2).flip(-2)  # [i, u]: the sum over t >= i
    total = total + torch.where(low, below, 0.0).sum(-1)  # over u < i
    return dda + total.flatten(2)[..., :S]


def _angle_chain(dtheta: Tensor, angles: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """(dangles [B,S,H,NA], ddt's term [B,H,S]) of per-step angles from theta's gradient."""
    after = dtheta.flip(1).cumsum(1).flip(1)  # sum over t >= s
    th = torch.tanh(angles)
    dangles = after * math.pi * (1 - th * th) * dt.permute(0, 2, 1)[..., None]
    return dangles, (after * math.pi * th).sum(-1).permute(0, 2, 1)


def _present(x: Tensor) -> Optional[Tensor]:
    return None if x.numel() == 0 else x


def _compose(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, q_bias: Tensor, k_bias: Tensor,
             mimo_v: Tensor, mimo_o: Tensor, angles: Tensor, dA: Tensor, dt: Tensor,
             trap: Tensor, mimo_z: Optional[Tensor], d: Optional[Tensor], z: Optional[Tensor],
             chunk_size: int, rotary_dim_divisor: int, raw_angles: bool
             ) -> tuple[Optional[Tensor], ...]:
    """The gradients in ``GRADIENTS`` order (None for an absent input), through the stages' ops
    (so real tensors run the kernels and fake tensors their fake implementations)."""
    _check(dA, dt, angles, chunk_size, raw_angles)
    C = chunk_size
    theta = (torch.cumsum(math.pi * torch.tanh(angles) * dt.permute(0, 2, 1)[..., None], dim=1)
             if raw_angles else angles)
    da_cs, da_cs_rev, segsum = _decays(dA, C)
    stage = (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, theta, da_cs, da_cs_rev, dt, trap,
             segsum)
    options = (mimo_z, d, z, C, rotary_dim_divisor, torch.float32)
    states, qk_dot, dmimo_o, dmimo_z, dz = torch.ops.opgen.mamba3_mimo_bwd_fwd(*stage, *options)
    (dq, dk, dv, dmimo_v, dtheta, dfactor, dgamma_diag, dda, dssda, dda_cs_rev, dda_cs,
     dd) = torch.ops.opgen.mamba3_mimo_bwd_bwd(*stage, states, qk_dot, *options)
    G = q.shape[3]
    dq, dq_bias = _group(dq, G)
    dk, dk_bias = _group(dk, G)
    ddt, dtrap = _trap_chain(dfactor, dgamma_diag, dt, trap.float())
    dangles = dtheta
    if raw_angles:
        dangles, ddt_angles = _angle_chain(dtheta, angles, dt)
        ddt = ddt + ddt_angles
    ddA = _decay_chain(dda, dda_cs, dda_cs_rev, dssda, da_cs, da_cs_rev, segsum, C)
    dmimo_z, dz, dd = _present(dmimo_z), _present(dz), _present(dd)
    return (dq, dk, dv, dq_bias, dk_bias, dmimo_v.sum(0), dmimo_o.sum(0), dangles, ddA, ddt,
            dtrap, None if dmimo_z is None else dmimo_z.sum(0), None if dd is None else dd.sum(0),
            dz)


def mamba3_mimo_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, q_bias: Tensor,
                         k_bias: Tensor, mimo_v: Tensor, mimo_o: Tensor, angles: Tensor,
                         dA: Tensor, dt: Tensor, trap: Tensor, mimo_z: Optional[Tensor] = None,
                         d: Optional[Tensor] = None, z: Optional[Tensor] = None,
                         chunk_size: int = 16, rotary_dim_divisor: int = 4,
                         raw_angles: bool = False) -> tuple[Optional[Tensor], ...]:
    """The gradient of sum(dout * out) with respect to every input of the MIMO forward.

    Args:
        dout, q, k, v, z: [B,S,H,P] / [B,S,R,G,N] activations, float16, bfloat16 or float32 (q, k,
            v and dout in one dtype).
        q_bias, k_bias, mimo_v, mimo_o, mimo_z, d: the float32 parameters.
        angles: float32 [B,S,H,NA], NA = N // rotary_dim_divisor: theta itself, or per-step
            angles with ``raw_angles``.
        dA, dt: float32 [B,H,S], the per-step log decay and the step; trap [B,H,S] the
            trapezoid logits.
        chunk_size: the stages' chunk length (8, 16, 32 or 64); S need not be a multiple of it.
        rotary_dim_divisor: 2 or 4, as in the forward.
        raw_angles: angles are per-step (theta is their running sum scaled by pi tanh and dt).

    Returns:
        float32 gradients in ``GRADIENTS`` order, each of its input's shape: (dq, dk, dv,
        dq_bias, dk_bias, dmimo_v, dmimo_o, dangles, ddA, ddt, dtrap, dmimo_z, dd, dz); None for
        an absent optional input. The Z gate needs both mimo_z and z.

    Raises:
        TypeError, ValueError: an argument named in the message (the stages' own checks name
            the stages' arguments; dA's chunk decays and theta are built here).
        NotImplementedError: a device or chip without a dispatch table.
    """
    args = (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap, mimo_z, d, z,
            chunk_size, rotary_dim_divisor, raw_angles)
    if torch.compiler.is_compiling():  # one node of the graph: the custom op
        return tuple(_present(x) for x in torch.ops.opgen.mamba3_mimo_backward(*args))
    return _compose(*args)


def _to_op(grads: tuple[Optional[Tensor], ...], like: Tensor) -> tuple[Tensor, ...]:
    return tuple(torch.empty(0, device=like.device) if g is None else g for g in grads)


@torch.library.custom_op("opgen::mamba3_mimo_backward", mutates_args=())
def _custom(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, q_bias: Tensor, k_bias: Tensor,
            mimo_v: Tensor, mimo_o: Tensor, angles: Tensor, dA: Tensor, dt: Tensor, trap: Tensor,
            mimo_z: Optional[Tensor], d: Optional[Tensor], z: Optional[Tensor], chunk_size: int,
            rotary_dim_divisor: int, raw_angles: bool
            ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                       Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _to_op(_compose(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap,
                           mimo_z, d, z, chunk_size, rotary_dim_divisor, raw_angles), dout)


@_custom.register_fake
def _(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap, mimo_z, d, z,
      chunk_size, rotary_dim_divisor, raw_angles):
    # the stages' ops dispatch to their fake implementations: their checks and shapes hold here;
    # an argument's error is raised as torch.compile reports it first (the stages' own already is)
    try:
        return _to_op(_compose(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap,
                               mimo_z, d, z, chunk_size, rotary_dim_divisor, raw_angles), dout)
    except (TypeError, ValueError) as exc:
        raise _compile_error(exc) from None


class Mamba3MimoFunction(torch.autograd.Function):
    """out = forward_fn(*inputs) with opgen's backward as its gradient.

    ``apply(forward_fn, options, q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap,
    mimo_z, d, z)``: forward_fn takes the 14 tensors (None for absent optional ones) positionally
    and returns out [B,S,H,P]; options holds ``mamba3_mimo_backward``'s chunk_size,
    rotary_dim_divisor and raw_angles, and ``backward``: the callable the backward runs with
    ``mamba3_mimo_backward``'s signature (itself unless given). Only the inputs are saved. The
    backward reads dout in q's dtype and returns each gradient in its input's dtype.
    """

    @staticmethod
    def forward(ctx, forward_fn: Callable[..., Tensor], options: dict, *inputs: Optional[Tensor]
                ) -> Tensor:
        out = forward_fn(*inputs)
        q, v = inputs[0], inputs[2]
        if not isinstance(out, torch.Tensor) or out.shape != v.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise _error(TypeError, f"forward_fn must return out of v's shape [B,S,H,P] = "
                                    f"{tuple(v.shape)}, got {got}")
        ctx.save_for_backward(*inputs)
        ctx.options = options
        return out

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Optional[Tensor], ...]:
        inputs = ctx.saved_tensors
        options = dict(ctx.options)
        backward = options.pop("backward", None) or mamba3_mimo_backward
        grads = backward(dout.to(inputs[0].dtype), *inputs, **options)
        wanted = ctx.needs_input_grad[2:]
        return (None, None) + tuple(
            g.to(x.dtype) if g is not None and want else None
            for g, x, want in zip(grads, inputs, wanted))


def with_opgen_backward(forward_fn: Callable[..., Tensor], *, chunk_size: int = 16,
                        rotary_dim_divisor: int = 4, raw_angles: bool = False,
                        backward: Optional[Callable[..., tuple[Optional[Tensor], ...]]] = None
                        ) -> Callable[..., Tensor]:
    """The layer as forward_fn computes it, differentiable through ``mamba3_mimo_backward``.

    Args:
        forward_fn: any forward of the layer (a kernel of another library, a reference), called
            as forward_fn(q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap, mimo_z,
            d, z) and returning out [B,S,H,P]; it runs without autograd.
        chunk_size, rotary_dim_divisor, raw_angles: ``mamba3_mimo_backward``'s; the last two must
            describe what forward_fn computes.
        backward: another backward with ``mamba3_mimo_backward``'s signature and results (a
            baseline's, ``opgen.baselines.mamba3_mimo_backward``, to train beside it on one seed);
            None: ``mamba3_mimo_backward``.

    Returns:
        layer(q, k, v, q_bias, k_bias, mimo_v, mimo_o, angles, dA, dt, trap, mimo_z=None, d=None,
        z=None) -> out.
    """
    if not callable(forward_fn):
        raise _error(TypeError, f"forward_fn must be callable, got {type(forward_fn).__name__}")
    _check_options(chunk_size, raw_angles)
    if backward is not None and not callable(backward):
        raise _error(TypeError, f"backward must be callable or None, got {type(backward).__name__}")
    options = {"chunk_size": chunk_size, "rotary_dim_divisor": rotary_dim_divisor,
               "raw_angles": raw_angles, "backward": backward}

    def layer(q: Tensor, k: Tensor, v: Tensor, q_bias: Tensor, k_bias: Tensor, mimo_v: Tensor,
              mimo_o: Tensor, angles: Tensor, dA: Tensor, dt: Tensor, trap: Tensor,
              mimo_z: Optional[Tensor] = None, d: Optional[Tensor] = None,
              z: Optional[Tensor] = None) -> Tensor:
        return Mamba3MimoFunction.apply(forward_fn, options, q, k, v, q_bias, k_bias, mimo_v,
                                        mimo_o, angles, dA, dt, trap, mimo_z, d, z)

    return layer
