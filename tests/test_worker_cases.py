"""The tuner's case preparation: the case row decides which optional inputs exist, and the
precision bar of its first output (raised where the upstream half-precision computation errs more)."""
from pathlib import Path

from opgen.spec.spec import load_spec
from opgen.run.worker import prepare_case

ROOT = Path(__file__).resolve().parents[1]
SPEC = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
ROW = dict(B=1, S=16, H=2, G=1, N=8, P=8, R=2, chunk_size=8, dtype="bfloat16")


def test_optional_inputs_absent_unless_the_case_gives_them():
    case = prepare_case(SPEC, {**ROW, "d_given": True}, 0, "cpu")
    assert case["inputs"]["z"] is None and case["inputs"]["mimo_z"] is None
    assert case["inputs"]["d"] is not None
    assert case["golden"]["dz"] is None and case["params"]["has_z"] is False


def test_z_gate_given_by_the_case():
    case = prepare_case(SPEC, {**ROW, "z_given": True, "mimo_z_given": True}, 0, "cpu")
    assert case["inputs"]["z"] is not None and case["inputs"]["d"] is None
    assert case["golden"]["dz"] is not None and case["params"]["has_z"] is True
    assert case["inputs"]["output_dtype"].is_floating_point  # a torch dtype, as the API takes


GLA = load_spec(ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml", ROOT)
# scale 2: the inter-chunk term carries the output, and no half-precision kernel meets the fixed bar
SCALE_TWO = dict(B=1, H=2, K=64, T=100, V=32, chunk_size=32, dtype="bfloat16", scale=2.0, use_exp2=True)


def test_the_bar_rises_to_the_half_references_error_where_that_is_higher():
    from opgen.run.worker import precision_bar

    case = prepare_case(GLA, SCALE_TWO, 0, "cpu")
    fixed = GLA.accuracy.max_rel_l2["bfloat16"]
    assert case["half_rel_l2"] * GLA.accuracy.half_ratio > fixed
    assert precision_bar(GLA, case, fixed) == GLA.accuracy.half_ratio * case["half_rel_l2"]
    assert precision_bar(GLA, {**case, "half_rel_l2": fixed / 2}, fixed) == fixed
    assert precision_bar(GLA, case, None) is None  # no bar for the dtype: nothing to raise
    assert prepare_case(SPEC, ROW, 0, "cpu")["half_rel_l2"] is None  # mamba3 names no half reference


def test_a_half_point_at_scale_two_passes_the_raised_bar_and_fails_the_fixed_one():
    """On the interpreter, fold_general_tiled at scale 2 errs more than the fixed bf16 bar but no
    more than the raised one; the spec without half_ratio refuses it, naming the bar."""
    from opgen.run.interpreter import patch_bf16
    from opgen.run.worker import Task, WorkerState, run_task

    patch_bf16()
    point = dict(A_PAIR=True, BK=64, BV=32, DOT_PRECISION="ieee", EARLY_INTRA=True, EVICT_H=True, TRIL_LOAD=False,
                 num_stages=1, num_warps=4, occupancy=1)
    fixed = GLA.accuracy.max_rel_l2["bfloat16"]
    task = Task(op=GLA.op, rendering="cuda", variant="fold_general_tiled", point=tuple(point.items()),
                case=tuple(SCALE_TWO.items()), backend="interpreter", device="cpu", programs=4, timed=False,
                max_rel_l2=fixed)
    state = WorkerState(GLA)
    raised = run_task(task, state)
    assert raised.status == "ok" and raised.error["rel_l2"] > fixed
    plain = GLA.model_copy(update={"accuracy": GLA.accuracy.model_copy(update={"half_ratio": None})})
    refused = run_task(task, WorkerState(plain))
    assert refused.status == "wrong_result" and refused.reason.startswith(f"rel_l2 {raised.error['rel_l2']:.3g} above the bar {fixed:.3g}")
