"""The composed Mamba-3 MIMO backward on the CPU interpreter against float64 autograd of the forward.

Every gradient of ``composed.mamba3_mimo_backward`` (the function, the custom op and the autograd
path) is compared with ``forward_grads``, float64 autograd of the chunked reference forward, on
fresh random inputs: tails (S % C != 0), GQA, the Z gate and D on and off, R = 1, 2, 4, 8, N = 16,
32, 64 and 128, theta and per-step angles. The half activations and the float32 parameters are
rounded before both sides see them, so the golden has no input rounding to forgive.

Bars. The float32 gradients: the stages compute in fp32 (bar FP32_BAR = 2^-16 of max |golden| in
their own tests: fp32 rounding over sums of at most a few hundred terms) and the reductions add fp32
sums of at most S or C * C terms of these sizes, so the same 2^-16 (about 128 fp32 unit roundoffs)
holds, in max_abs_rel and rel_l2. The autograd path returns each gradient in its input's dtype:
that rounding (half of the dtype's eps, relative to each element, so at most that of max |golden|)
is added for the half inputs.
"""
import functools
import sys
from pathlib import Path

import pytest
import torch

from opgen.run.accuracy import max_abs_rel, rel_l2
from opgen.references.mamba3_mimo_forward import INPUTS, forward, forward_grads, make_inputs

ROOT = Path(__file__).resolve().parents[2]

FP32_BAR = 2.0 ** -16
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _inputs(B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor, seed):
    """make_inputs with the float64 parameters rounded to the float32 the kernels take."""
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, rotary_dim_divisor=divisor,
                    dtype=DTYPES[dtype], has_z=has_z, has_d=has_d, seed=seed)
    return {n: (t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t)
            for n, t in x.items()}


def _check(grads, x, raw_angles, bar_of=lambda name, dtype: FP32_BAR):
    gold = forward_grads(**x, raw_angles=raw_angles)
    for name in INPUTS:
        g, out = gold["d" + name], grads["d" + name]
        if g is None:
            assert out is None, f"d{name}: given for an absent input"
            continue
        got = None if out is None else tuple(out.shape)
        assert got == tuple(g.shape), f"d{name}: shape {got}, want {tuple(g.shape)}"
        assert g.abs().max() > 0, f"d{name}: the golden is all zero (a vacuous check)"
        err = max(max_abs_rel(out.double(), g), rel_l2(out.double(), g))
        bar = bar_of(name, out.dtype)
        assert err <= bar, f"d{name}: error {err:.3e} of max |golden| above {bar:.3e}"


CASES = [  # (how, B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor, raw_angles)
    ("function", 1, 20, 2, 1, 16, 16, 2, 8, "bfloat16", True, True, 4, True),   # tail 4, Z, D
    ("custom_op", 1, 19, 4, 2, 32, 16, 4, 8, "float16", False, False, 2, False),  # GQA, R = 4
    ("autograd", 2, 12, 2, 1, 16, 16, 1, 8, "bfloat16", True, False, 4, True),  # R = 1, B = 2
    ("function", 1, 9, 2, 1, 64, 16, 8, 8, "bfloat16", False, True, 4, False),  # R = 8, N = 64, tail 1
    ("function", 1, 11, 2, 2, 128, 8, 2, 8, "float16", True, True, 2, True),  # N = 128, G = H, tail 3
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-S{c[2]}C{c[8]}-G{c[4]}of{c[3]}-N{c[5]}-R{c[7]}-"
                                             f"{'Z' if c[10] else 'noZ'}" for c in CASES])
def test_gradients_against_autograd_of_the_float64_forward(case):
    from composed.mamba3_mimo_backward import GRADIENTS, mamba3_mimo_backward, with_opgen_backward

    how, *shape, dtype, has_z, has_d, divisor, raw = case
    C = shape[-1]
    x = _inputs(*shape, dtype, has_z, has_d, divisor, seed=100 + sum(shape))
    options = dict(chunk_size=C, rotary_dim_divisor=divisor, raw_angles=raw)
    tensors = [x[n] for n in INPUTS]
    if how == "function":
        grads = dict(zip(GRADIENTS, mamba3_mimo_backward(x["dout"], *tensors, **options)))
        _check(grads, x, raw)
    elif how == "custom_op":
        outs = torch.ops.opgen.mamba3_mimo_backward(x["dout"], *tensors, **options)
        assert len(outs) == len(GRADIENTS)
        grads = {n: (None if o.numel() == 0 else o) for n, o in zip(GRADIENTS, outs)}
        _check(grads, x, raw)
    else:
        leaves = [t.clone().requires_grad_(True) if t is not None else None for t in tensors]
        layer = with_opgen_backward(functools.partial(forward, chunk_size=C,
                                                      rotary_dim_divisor=divisor, raw_angles=raw),
                                    **options)
        out = layer(*leaves)
        out.backward(x["dout"].double())
        grads = {"d" + n: (t.grad if t is not None else None) for n, t in zip(INPUTS, leaves)}
        for n, t in zip(INPUTS, leaves):
            assert t is None or t.grad.dtype == t.dtype, n
        _check(grads, x, raw, lambda name, dt: FP32_BAR + (torch.finfo(dt).eps / 2
                                                           if dt != torch.float32 else 0.0))


def test_fake_tensors_give_the_gradients_shapes():
    """The custom op's fake implementation (what torch.compile traces) runs the stages' checks
    and returns every gradient's shape; an absent input's gradient is an empty tensor."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import composed  # noqa: F401  (registers the op)

    x = _inputs(1, 10, 4, 2, 16, 8, 2, 8, "bfloat16", False, True, 4, seed=3)
    with FakeTensorMode() as mode:
        fake = {n: (mode.from_tensor(t) if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
        outs = torch.ops.opgen.mamba3_mimo_backward(fake["dout"], *[fake[n] for n in INPUTS], 8, 4,
                                                    False)
        shapes = [tuple(o.shape) for o in outs]
        assert all(o.dtype == torch.float32 for o in outs)
        with pytest.raises(ValueError, match=r"mamba3_mimo_bwd_fwd: k\.shape\[3\]"):
            bad = dict(fake, k=fake["k"][:, :, :, :1])
            torch.ops.opgen.mamba3_mimo_backward(bad["dout"], *[bad[n] for n in INPUTS], 8, 4, False)
    want = [tuple(x[n].shape) if x[n] is not None else (0,) for n in INPUTS]
    assert shapes == want


def test_a_training_loop_lowers_the_loss():
    """Adam through the autograd path (reference forward, opgen's backward) fits a target."""
    from composed import with_opgen_backward

    x = _inputs(1, 10, 2, 1, 16, 8, 1, 8, "float32", False, True, 4, seed=11)
    params = {n: torch.nn.Parameter(x[n].clone()) for n in ("q", "k", "v", "q_bias", "k_bias",
                                                             "mimo_v", "mimo_o", "d")}
    fixed = {n: x[n] for n in ("angles", "dA", "dt", "trap")}
    layer = with_opgen_backward(functools.partial(forward, chunk_size=8), chunk_size=8)
    target = torch.randn(x["v"].shape, generator=torch.Generator().manual_seed(12),
                         dtype=torch.float64)
    optimizer = torch.optim.Adam(params.values(), lr=0.05)
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(layer(**params, **fixed), target)
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().max() > 0 for p in params.values())
        optimizer.step()
        losses.append(loss.item())
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_training_with_opgens_backward_tracks_autograds():
    """scripts/train_mamba3.py's model (projections, a sequence tail, GQA, the Z gate, bf16
    activations, theta formed by torch) trained a few steps with opgen's backward beside the reference
    forward's own autograd, on one seed: the first step's gradients agree to bf16 rounding and the
    loss curves to a thousandth; a backward given to with_opgen_backward is the one that runs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_mamba3", ROOT / "scripts" / "train_mamba3.py")
    train_mamba3 = sys.modules.setdefault("train_mamba3", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(train_mamba3)
    shape = train_mamba3.Shape(B=1, S=21, H=4, G=2, N=16, P=16, R=2, D=24, chunk_size=8)
    result = train_mamba3.train(shape, steps=4, device="cpu", lr=1e-2)
    ours = result["students"]["opgen"]
    assert max(ours["grad_rel_l2"].values()) < 2.0 ** -6, ours["grad_rel_l2"]
    assert ours["max_gap"] < 1e-2 and ours["first"] == result["students"]["autograd"]["first"]

    from composed import mamba3_mimo_backward, with_opgen_backward

    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs["chunk_size"])
        return mamba3_mimo_backward(*args, **kwargs)

    x = _inputs(1, 10, 2, 1, 16, 8, 1, 8, "float32", False, True, 4, seed=13)
    inputs = {n: torch.nn.Parameter(x[n].clone()) if n == "v" else x[n] for n in INPUTS}
    layer = with_opgen_backward(functools.partial(forward, chunk_size=8), chunk_size=8, backward=counted)
    layer(**inputs).sum().backward()
    assert calls == [8] and inputs["v"].grad.abs().max() > 0
    with pytest.raises(TypeError, match=r"mamba3_mimo_backward: backward must be callable or None"):
        with_opgen_backward(forward, backward="opgen")


def test_bad_arguments_are_named():
    from composed import mamba3_mimo_backward, with_opgen_backward

    x = _inputs(1, 10, 2, 1, 16, 8, 1, 8, "bfloat16", False, False, 4, seed=4)
    args = [x["dout"]] + [x[n] for n in INPUTS]
    at = {n: i + 1 for i, n in enumerate(INPUTS)}

    def call(name, value, **options):
        bad = list(args)
        bad[at[name]] = value
        return mamba3_mimo_backward(*bad, chunk_size=8, **options)

    with pytest.raises(ValueError, match=r"mamba3_mimo_backward: dA must have dt's shape"):
        call("dA", x["dA"][..., :-1])
    with pytest.raises(TypeError, match=r"mamba3_mimo_backward: dA\.dtype must be float32"):
        call("dA", x["dA"].double())
    with pytest.raises(ValueError, match=r"mamba3_mimo_backward: angles must be \[B, S, H, NA\]"):
        call("angles", x["angles"][:, :-1])
    with pytest.raises(TypeError, match=r"mamba3_mimo_backward: raw_angles must be a bool"):
        call("dA", x["dA"], raw_angles=1)
    with pytest.raises(TypeError, match=r"mamba3_mimo_backward: forward_fn must be callable"):
        with_opgen_backward(None)
    with pytest.raises(ValueError, match=r"mamba3_mimo_backward: chunk_size must be positive"):
        with_opgen_backward(forward, chunk_size=0)
    layer = with_opgen_backward(lambda *inputs: inputs[0])
    with pytest.raises(TypeError, match=r"mamba3_mimo_backward: forward_fn must return out of v's"):
        layer(*[x[n] for n in INPUTS])
