"""mamba3_mimo_bwd_bwd on the CPU interpreter against the float64 golden.

Each variant runs in both renderings on fresh random inputs (tails, GQA, the Z gate and D on and
off, R in 1, 2, 4 (blocked also 3 and 8), N 16 to 64, both half dtypes, at least three chunks so
that every output is nonzero; blocked with its N, P and dS tiles below the whole dims); the public
function on a case of its own, with fp32 and bf16 outputs.

fp32 outputs: the kernel computes in fp32 from the same (half-rounded) inputs as the golden, so its
error is fp32 rounding over sums of at most a few hundred terms (C * R * P, C * R * N): at most
FP32_BAR = 2^-16 (about 128 fp32 unit roundoffs) of max |golden|, in max_abs_rel and rel_l2. The dual
benchmark's 4x of the fp32 reference's error is too tight a ratio here: on a [B,H,S] output of 40
elements one element decides it. Narrower outputs: the dual benchmark, whose bar there is 3x the
rounding of the golden to the output dtype.
"""
import importlib

import pytest
import torch

from opgen.run.accuracy import dual_benchmark, max_abs_rel, rel_l2
from opgen.references.mamba3_mimo_bwd_bwd import OUTPUTS, golden, make_inputs, reference_fp32

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
FP32_BAR = 2.0 ** -16


def _check(outs, x, output_dtype=torch.float32):
    gold, ref = golden(**x), reference_fp32(**x)
    for name in OUTPUTS:
        if gold[name] is None:
            assert outs[name] is None, name
            continue
        out = outs[name]
        assert out.dtype == output_dtype and out.shape == gold[name].shape, name
        assert gold[name].abs().max() > 0, f"{name}: the golden is all zero (a vacuous check)"
        if output_dtype == torch.float32:
            err = max(max_abs_rel(out, gold[name]), rel_l2(out, gold[name]))
            assert err <= FP32_BAR, f"{name}: error {err:.3e} of max |golden|"
        else:
            result = dual_benchmark(out, ref[name], gold[name])
            assert result.passed, f"{name}: {result.reason}"


CASES = [  # (rendering, B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor)
    ("npu", 1, 20, 2, 1, 16, 16, 2, 8, "bfloat16", True, True, 4),     # a tail of 4, N = 16
    ("cuda", 2, 24, 4, 2, 16, 16, 1, 8, "float16", False, False, 2),   # GQA, R = 1, no Z nor D
    ("npu", 1, 24, 4, 2, 32, 16, 4, 8, "bfloat16", False, True, 4),    # GQA, R = 4
    ("cuda", 1, 40, 2, 1, 64, 32, 2, 16, "float16", True, True, 4),    # a tail of 8; L = 32 tl.dots
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-S{c[2]}-G{c[4]}of{c[3]}-N{c[5]}-R{c[7]}-C{c[8]}-"
                                             f"{'Z' if c[10] else 'noZ'}" for c in CASES])
def test_serial_variant(case):
    rendering, B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor = case
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_bwd.kernels.{rendering}.serial")
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, rotary_dim_divisor=divisor, dtype=DTYPES[dtype],
                    has_z=has_z, has_d=has_d, seed=1000 + S * N + R)
    gold = golden(**x)
    outs = {n: torch.empty(gold[n].shape) if gold[n] is not None else None for n in OUTPUTS}
    module.launch(**x, **outs, num_programs=1, point={})
    _check(outs, x)


BLOCKED_CASES = [  # (rendering, B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor, point)
    # a tail of 4, two N steps of 32 (16 of each rotation half) and two P steps
    ("cuda", 1, 20, 2, 1, 64, 32, 2, 8, "bfloat16", True, True, 4,
     {"BLOCK_N": 32, "BLOCK_P": 16, "DS_BLOCK_N": 16, "DS_BLOCK_P": 16}),
    # GQA, R = 1, no Z nor D, N = 16: the half steps padded to 16 and masked; a tail of 8
    ("npu", 2, 40, 4, 2, 16, 32, 1, 16, "float16", False, False, 2,
     {"BLOCK_N": 16, "BLOCK_P": 16, "DS_BLOCK_N": 16, "DS_BLOCK_P": 16}),
    # GQA, R = 4, whole chunks, the dS scan on [16, 16] tiles of [32, 32]
    ("cuda", 1, 24, 4, 2, 32, 32, 4, 8, "bfloat16", False, True, 4,
     {"BLOCK_N": 16, "BLOCK_P": 16, "DS_BLOCK_N": 16, "DS_BLOCK_P": 16}),
    # R = 3 (ranks padded to 4), a tail of 1
    ("npu", 1, 17, 2, 1, 32, 16, 3, 8, "float16", True, True, 4, {"DS_BLOCK_N": 16}),
    # R = 8 (C * R = 64), a tail of 5
    ("cuda", 1, 21, 2, 1, 16, 16, 8, 8, "float16", True, False, 4, {}),
]


@pytest.mark.parametrize("case", BLOCKED_CASES, ids=[f"{c[0]}-S{c[2]}-G{c[4]}of{c[3]}-N{c[5]}-P{c[6]}-R{c[7]}-C{c[8]}-"
                                                     f"{'Z' if c[10] else 'noZ'}-{'D' if c[11] else 'noD'}"
                                                     for c in BLOCKED_CASES])
def test_blocked_variant(case):
    """blocked against the golden, its N, P and dS tiles below the whole dims."""
    _blocked_run("blocked", case, ["ds", "chunk", "chunk", "reduce"], [0, 1])


@pytest.mark.parametrize("case", BLOCKED_CASES, ids=[f"{c[0]}-S{c[2]}-G{c[4]}of{c[3]}-N{c[5]}-R{c[7]}"
                                                     for c in BLOCKED_CASES])
def test_blocked_pairs_variant(case):
    """blocked_pairs against the golden: the pair matrices' launch first, then the P-wide and the
    N-wide launches that read them."""
    _blocked_run("blocked_pairs", case, ["ds", "chunk", "chunk", "chunk", "reduce"], [0, 2, 1])


@pytest.mark.parametrize("case", BLOCKED_CASES[::2], ids=[f"{c[0]}-S{c[2]}-N{c[5]}-R{c[7]}" for c in BLOCKED_CASES[::2]])
def test_blocked_pairs_with_the_products_apart(case):
    """blocked_pairs with PAIR_PRODUCTS: A and M in a launch of their own before the pairs'."""
    *shape, point = case
    _blocked_run("blocked_pairs", (*shape, dict(point, PAIR_PRODUCTS=True)),
                 ["ds", "chunk", "chunk", "chunk", "chunk", "reduce"], [3, 0, 2, 1])


def _blocked_run(variant, case, kernels, parts):
    """One of blocked's family on ``case``: its launches' kernels and chunk parts in order, then
    every output against the golden."""
    rendering, B, S, H, G, N, P, R, C, dtype, has_z, has_d, divisor, point = case
    module = importlib.import_module(f"generated.mamba3_mimo_bwd_bwd.kernels.{rendering}.{variant}")
    x = make_inputs(B, S, H, G, N, P, R, chunk_size=C, rotary_dim_divisor=divisor, dtype=DTYPES[dtype],
                    has_z=has_z, has_d=has_d, seed=2000 + S * N + R)
    gold = golden(**x)
    outs = {n: torch.empty(gold[n].shape) if gold[n] is not None else None for n in OUTPUTS}
    calls = module.kernel_calls(**x, **outs, num_programs=1, point=point)
    names = [kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__ for kernel, *_ in calls]
    assert names == [f"mamba3_mimo_bwd_bwd_{k}_kernel" for k in kernels]
    assert [kwargs["PART"] for _kernel, _grid, kwargs, _options in calls if "PART" in kwargs] == parts
    module.launch(**x, **outs, num_programs=1, point=point)
    _check(outs, x)


@pytest.mark.parametrize("output_dtype", [torch.float32, torch.bfloat16])
def test_public_api(output_dtype):
    from generated.mamba3_mimo_bwd_bwd import mamba3_mimo_bwd_bwd

    x = make_inputs(1, 19, 4, 2, 16, 16, 2, chunk_size=8, dtype=torch.bfloat16, seed=7)
    outs = mamba3_mimo_bwd_bwd(**x, output_dtype=output_dtype)
    assert len(outs) == len(OUTPUTS)
    _check(dict(zip(OUTPUTS, outs)), x, output_dtype)


def test_first_stage_outputs_feed_the_second():
    """The states and qk_dot the generated first stage writes (fp32) are what this stage reads."""
    from generated.mamba3_mimo_bwd_bwd import mamba3_mimo_bwd_bwd
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = make_inputs(1, 21, 2, 1, 16, 16, 4, chunk_size=8, dtype=torch.float16, has_d=True, seed=5)
    stage_one = {n: t for n, t in x.items() if n not in ("states", "qk_dot")}
    states, qk_dot, *_ = mamba3_mimo_bwd_fwd(**stage_one)
    x = dict(x, states=states, qk_dot=qk_dot)
    _check(dict(zip(OUTPUTS, mamba3_mimo_bwd_bwd(**x))), x)
