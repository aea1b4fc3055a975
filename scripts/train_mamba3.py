"""A training check of the whole Mamba-3 MIMO backward: one small model trained by students that
differ only in their backward, on one seed.

The model (:class:`TinyMamba3`): x [B,S,D] -> one linear projection to the layer's per-token inputs
(q, k [B,S,R,G,N], v, z [B,S,H,P], the step dt = softplus(.), the log decay dA = -exp(a_log) dt,
the trapezoid logits and the rotation angles theta, the running sum of pi tanh(.) dt, formed by
torch before the layer, as upstream's layer does), the per-head parameters (q_bias,
k_bias, Psi, Phi, Zeta, D, a_log), the layer's forward (``opgen.references.mamba3_mimo_forward``'s,
float64 math), and a linear map of out [B,S,H,P] back to D. q, k, v and z enter the layer in the
activations' dtype. A teacher of the same form gives the targets: the students' initial parameters,
each moved by random steps of ``TEACHER_MOVE`` times its tensor's spread. Each student starts from
the same parameters and sees the same batches, and minimises the mean squared error with Adam. The students:

- ``autograd``: the reference forward's own autograd (float64), the golden training run;
- ``opgen``: the same forward, its gradient from ``composed.mamba3_mimo_backward`` (the generated
  stages and the reductions), through ``with_opgen_backward``;
- ``upstream`` (``--upstream``, an NVIDIA GPU with the TileLang bundle: ``source
  .tilelang/activate.sh``): the gradient from upstream's ``mamba_mimo_bwd_combined``
  (``opgen.baselines.mamba3_mimo_backward.tilelang``); it takes G = 1, whole chunks and N >= 32.

Prints each student's loss on a held-out set of batches every ``--every`` steps, then per student
that loss before training and after it, the largest relative gap of its training loss to
``autograd``'s over the run and, at the first step, each parameter's gradient against
``autograd``'s (rel. L2).
``--json FILE`` writes all of it. On the CPU the kernels run under the Triton interpreter (set
here when ``--device cpu``).

    python scripts/train_mamba3.py [--steps 300] [--device cpu|cuda] [--upstream] [--json FILE]
        [--B 2 --S 40 --H 2 --G 1 --N 16 --P 16 --R 2 --D 32 --chunk-size 16 --dtype bfloat16]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


TEACHER_MOVE = 0.5
"""How far the teacher's parameters lie from the students' start, in units of each tensor's spread."""
EVAL_BATCHES = 4
"""Batches of the held-out set each student's loss is measured on, before and during training."""


@dataclass(frozen=True)
class Shape:
    """The model's sizes: the layer's B, S, H, G, N, P, R, the width D of x, the chunk size, the
    rotary divisor and the activations' dtype."""

    B: int = 2
    S: int = 40
    H: int = 2
    G: int = 1
    N: int = 16
    P: int = 16
    R: int = 2
    D: int = 32
    chunk_size: int = 16
    rotary_dim_divisor: int = 4
    dtype: str = "bfloat16"


def _model_class():
    """:class:`TinyMamba3`, defined once torch is imported (after the interpreter's switch)."""
    import torch

    from opgen.references.mamba3_mimo_forward import cumulative_angles

    class TinyMamba3(torch.nn.Module):
        """x [B,S,D] -> the layer's inputs -> ``layer`` -> y [B,S,D] (module docstring)."""

        def __init__(self, shape: Shape, seed: int) -> None:
            super().__init__()
            self.shape = shape
            s = shape
            gen = torch.Generator().manual_seed(seed)
            NA = s.N // s.rotary_dim_divisor
            self.widths = [s.R * s.G * s.N, s.R * s.G * s.N, s.H * s.P, s.H * s.P, s.H, s.H, s.H * NA]

            def draw(*size, scale=1.0):
                return torch.nn.Parameter(torch.randn(*size, generator=gen) * scale)

            self.w_in = draw(s.D, sum(self.widths), scale=s.D ** -0.5)
            self.dt_bias = draw(s.H, scale=0.5)
            self.a_log = draw(s.H, scale=0.5)
            self.q_bias, self.k_bias = draw(s.H, s.R, s.N, scale=0.1), draw(s.H, s.R, s.N, scale=0.1)
            self.mimo_v, self.mimo_o = draw(s.H, s.R, s.P, scale=s.R ** -1), draw(s.H, s.R, s.P, scale=s.R ** -1)
            self.mimo_z, self.d = draw(s.H, s.R, s.P, scale=0.5), draw(s.H, scale=0.5)
            self.w_out = draw(s.H * s.P, s.D, scale=(s.H * s.P) ** -0.5)

        def layer_inputs(self, x: "torch.Tensor") -> dict[str, "torch.Tensor"]:
            """The layer's 14 inputs from x, q, k, v and z in the activations' dtype."""
            s, (B, S) = self.shape, x.shape[:2]
            q, k, v, z, dt, trap, angles = torch.split(x @ self.w_in, self.widths, dim=-1)
            act = getattr(torch, s.dtype)
            dt = torch.nn.functional.softplus(dt - 2.0 + self.dt_bias).transpose(1, 2).contiguous()
            theta = cumulative_angles(angles.reshape(B, S, s.H, -1), dt)
            return dict(
                q=q.reshape(B, S, s.R, s.G, s.N).to(act), k=k.reshape(B, S, s.R, s.G, s.N).to(act),
                v=v.reshape(B, S, s.H, s.P).to(act), q_bias=self.q_bias, k_bias=self.k_bias,
                mimo_v=self.mimo_v, mimo_o=self.mimo_o, angles=theta.contiguous(),
                dA=-torch.exp(self.a_log)[None, :, None] * dt, dt=dt,
                trap=trap.transpose(1, 2).contiguous().to(act), mimo_z=self.mimo_z, d=self.d,
                z=z.reshape(B, S, s.H, s.P).to(act))

        def forward(self, x: "torch.Tensor", layer: Callable[..., "torch.Tensor"]) -> "torch.Tensor":
            out = layer(**self.layer_inputs(x))
            return out.to(torch.float32).reshape(*x.shape[:2], -1) @ self.w_out

    return TinyMamba3


def layers(shape: Shape, upstream: bool) -> dict[str, Callable]:
    """Each student's layer: the reference forward with its own autograd, or with the gradient
    of opgen's (and upstream's) backward."""
    from composed.mamba3_mimo_backward import with_opgen_backward
    from opgen.references.mamba3_mimo_forward import forward

    options = dict(chunk_size=shape.chunk_size, rotary_dim_divisor=shape.rotary_dim_divisor)
    ref = partial(forward, **options)
    out = {"autograd": ref, "opgen": _keywords(with_opgen_backward(ref, **options))}
    if upstream:
        from opgen.baselines.mamba3_mimo_backward import tilelang

        out["upstream"] = _keywords(with_opgen_backward(ref, **options, backward=tilelang))
    return out


def _keywords(layer: Callable) -> Callable:
    """``with_opgen_backward``'s layer called with the inputs by name."""
    from composed.mamba3_mimo_backward import INPUTS

    return lambda **inputs: layer(*(inputs[n] for n in INPUTS))


def train(shape: Shape, steps: int, device: str, upstream: bool = False, lr: float = 3e-3, seed: int = 0,
          every: int = 0) -> dict:
    """Train every student ``steps`` steps; the losses, the gaps to autograd's and the first
    step's gradient agreement (module docstring)."""
    import torch

    model_class = _model_class()
    teacher = model_class(shape, seed)
    with torch.no_grad():  # the students' parameters, each moved by half its tensor's spread
        moves = torch.Generator().manual_seed(seed + 1)
        for p in teacher.parameters():
            p.add_(torch.randn(p.shape, generator=moves) * p.std() * TEACHER_MOVE)
    teacher = teacher.to(device)
    students = {name: (model_class(shape, seed).to(device), layer) for name, layer in layers(shape, upstream).items()}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=lr) for name, (m, _layer) in students.items()}
    data = torch.Generator().manual_seed(seed + 2)
    reference = students["autograd"][1]

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(shape.B, shape.S, shape.D, generator=data).to(device)
        with torch.no_grad():
            return x, teacher(x, reference)

    held_out = [batch() for _ in range(EVAL_BATCHES)]

    def evaluate(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return sum(torch.nn.functional.mse_loss(model(x, reference), y).item() for x, y in held_out) / len(held_out)

    losses: dict[str, list[float]] = {name: [] for name in students}
    held: dict[str, list[tuple[int, float]]] = {name: [(0, evaluate(m))] for name, (m, _layer) in students.items()}
    first_grads: dict[str, dict[str, torch.Tensor]] = {}
    for step in range(steps):
        x, target = batch()
        for name, (model, layer) in students.items():
            optimizers[name].zero_grad()
            loss = torch.nn.functional.mse_loss(model(x, layer), target)
            loss.backward()
            if step == 0:
                first_grads[name] = {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()}
            optimizers[name].step()
            losses[name].append(loss.item())
            if every and ((step + 1) % every == 0 or step == steps - 1):
                held[name].append((step + 1, evaluate(model)))
        if every and ((step + 1) % every == 0 or step == steps - 1):
            print(f"after {step + 1:4d} steps, held-out loss  "
                  + "  ".join(f"{n} {held[n][-1][1]:.5f}" for n in students), flush=True)
    return _summary(shape, steps, losses, held, first_grads)


def _summary(shape: Shape, steps: int, losses: dict[str, list[float]], held: dict[str, list[tuple[int, float]]],
             first_grads: dict[str, dict[str, "torch.Tensor"]]) -> dict:
    from opgen.run.accuracy import rel_l2

    gold, grads0 = losses["autograd"], first_grads["autograd"]
    out = {"shape": asdict(shape), "steps": steps, "losses": losses, "held_out": held, "students": {}}
    for name, curve in losses.items():
        out["students"][name] = {
            "first": curve[0],
            "start": held[name][0][1],
            "end": held[name][-1][1],
            "max_gap": max(abs(a - b) / b for a, b in zip(curve, gold)),
            "grad_rel_l2": {n: rel_l2(g, grads0[n]) for n, g in first_grads[name].items()},
        }
    return out


def report(result: dict) -> str:
    """The summary as a table: per student its held-out loss before and after training, the
    largest gap of its training loss to autograd's, and the worst first-step gradient against
    autograd's."""
    lines = [f"{'student':<10} {'held-out loss: start':>20} {'end':>9} {'max gap':>9}  worst first-step grad (rel. L2)"]
    for name, s in result["students"].items():
        worst = max(s["grad_rel_l2"].items(), key=lambda kv: kv[1])
        lines.append(f"{name:<10} {s['start']:>20.5f} {s['end']:>9.5f} {s['max_gap']:>9.2e}  "
                     f"{worst[0]} {worst[1]:.2e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field, default in asdict(Shape()).items():
        flag = "--" + field.replace("_", "-")
        parser.add_argument(flag, type=type(default), default=default)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=25, help="print the losses every this many steps")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--upstream", action="store_true", help="also train with upstream's backward (GPU)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    shape = Shape(**{f: getattr(args, f) for f in asdict(Shape())})
    result = train(shape, args.steps, args.device, args.upstream, args.lr, args.seed, args.every)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    end = {n: s["end"] for n, s in result["students"].items()}
    return 0 if all(math.isfinite(v) for v in end.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
