"""The tuner's case preparation: the case row decides which optional inputs exist."""
from pathlib import Path

from opgen.spec import load_spec
from opgen.worker import prepare_case

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
