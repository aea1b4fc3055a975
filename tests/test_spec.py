"""Spec loading: the real specs load; each kind of malformed spec names its file and key path."""
import copy
from pathlib import Path

import pytest
import yaml

from opgen.errors import SpecError
from opgen.spec.spec import load_spec, load_specs

ROOT = Path(__file__).resolve().parents[1]
GLA = ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml"


def _base() -> dict:
    return yaml.safe_load(GLA.read_text())


def _write(tmp_path: Path, data: dict | str, stem: str = "chunk_gla_fwd_o_gk") -> Path:
    path = tmp_path / f"{stem}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def test_real_specs_load():
    specs = load_specs(ROOT / "specs", ROOT)
    assert [s.op for s in specs] == sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))
    gla = next(s for s in specs if s.op == "chunk_gla_fwd_o_gk")
    assert gla.dim_symbols() == ("B", "T", "H", "K", "V")
    assert set(gla.variants.axes) == {"SCALE_PATH", "SHAPE", "GRID"}
    assert gla.path == "specs/chunk_gla_fwd_o_gk.yaml"


def _set(path: str, value):
    def mutate(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        elif value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return mutate


_DELETE = object()

# (id, mutation, key path the error must name, fragment of what was expected)
MALFORMED = [
    ("missing-top-key", _set("variants", _DELETE), "variants", "Field required"),
    ("missing-nested-key", _set("signature.tensors.q.dims", _DELETE), "signature.tensors.q.dims", "Field required"),
    ("unknown-key", _set("signature.tensors.q.shape", [1]), "signature.tensors.q.shape", "Extra inputs"),
    ("wrong-type-domain", _set("tunables.BK.domain.npu", "32"), "tunables.BK.domain.npu", "tuple"),
    ("wrong-type-scalar", _set("signature.scalars.chunk_size.type", "integer"), "signature.scalars.chunk_size.type", "'int'"),
    ("unknown-dtype", _set("signature.tensors.q.dtypes", ["float8"]), "signature.tensors.q.dtypes.0", "float16"),
    ("unknown-backend", _set("tunables.BK.domain.tpu", [32]), "tunables.BK.domain.tpu", "cuda"),
    ("unknown-role", _set("tunables.BK.role", "runtime"), "tunables.BK.role", "constexpr"),
    ("formula-calls-import", _set("params.NT", "__import__('os').getcwd()"), "params.NT", "not allowed"),
    ("formula-calls-open", _set("constraints.0", "open('x') > 0"), "constraints.0", "call of 'open'"),
    ("formula-attribute", _set("params.NT", "q.shape[1]"), "params.NT", "not allowed"),
    ("formula-lambda", _set("dispatch.key.H1", "(lambda: 1)()"), "dispatch.key.H1", "not allowed"),
    ("formula-unknown-name", _set("params.NT", "cdiv(T, CHUNK)"), "params.NT", "formula names"),
    ("formula-syntax", _set("budgets.npu.ub_bytes", "BT * (BK +"), "budgets.npu.ub_bytes", "syntax error"),
    ("budget-kernel-unknown-name", _set("budgets.npu.ub_bytes", {"inter": "BT * BQ", "intra": "BT * BT"}),
     "budgets.npu.ub_bytes.inter", "formula names"),
    ("budget-kernels-empty", _set("budgets.npu.ub_bytes", {}), "budgets.npu.ub_bytes", "a formula or"),
    ("unknown-variant-option", _set("dispatch.defaults.npu.SCALE_PATH", "'fused'"), "dispatch.defaults.npu.SCALE_PATH", "option of axis SCALE_PATH"),
    ("default-for-unknown-name", _set("dispatch.defaults.npu.BQ", "32"), "dispatch.defaults.npu.BQ", "an axis or a npu tunable"),
    ("default-reads-a-later-axis", _set("dispatch.defaults.npu.SCALE_PATH", "'fold' if SHAPE == 'h1' else 'post'"),
     "dispatch.defaults.npu.SCALE_PATH", "formula names"),
    ("default-missing-axis", _set("dispatch.defaults.npu.SHAPE", _DELETE), "dispatch.defaults.npu", "a default for 'SHAPE'"),
    ("fixed-unknown-tunable", _set("variants.axes.SHAPE.single.fixed.BQ", "32"), "variants.axes.SHAPE.single.fixed.BQ", "a tunable"),
    ("buckets-not-ascending", _set("dispatch.key.K.buckets", [64, 32]), "dispatch.key.K.buckets", "ascending"),
    ("fill-across-a-bucketed-field", _set("dispatch.fill_across", ["K"]), "dispatch.fill_across", "unbucketed key fields"),
    ("fill-across-no-case-field", _set("dispatch.fill_across", ["H1"]), "dispatch.fill_across", "case row fields"),
    ("fill-across-unknown", _set("dispatch.fill_across", ["layout"]), "dispatch.fill_across", "unbucketed key fields"),
    ("fill-across-another-formula", _set("dispatch.key.dtype", "q_dtype"), "dispatch.fill_across", "its own formula"),
    ("default-not-in-choices", _set("signature.scalars.chunk_size.default", 48), "signature.scalars.chunk_size.default", "choices"),
    ("output-dtype-unknown", _set("signature.outputs.o.dtype", "w"), "signature.outputs.o.dtype", "tensor name"),
    ("launch-arg-unknown", _set("api.launch_args", ["q", "w"]), "api.launch_args", "tensor, output"),
    ("case-key-unknown", _set("cases.bench.0.Z", 3), "cases.bench.0.Z", "dim symbol"),
    ("empty-axes", _set("variants.axes", {}), "variants.axes", "at least 1"),
    ("bad-identifier", _set("params.2x", "1"), "params.2x", "pattern"),
    ("exclude-unknown-axis", _set("variants.exclude", ["ALGO == 'x'"]), "variants.exclude.0", "formula names"),
    ("optional-before-required", _set("signature.tensors.g.optional", True), "signature.tensors.A.optional", "optional tensors after"),
    ("optional-binds-a-dim", _set("signature.tensors.q.optional", True), "signature.tensors.q.dims", "bound by a required tensor"),
    ("dtype-scalar-bad-default", _set("signature.scalars.out", {"type": "dtype", "default": "float8"}), "signature.scalars.out", "dtype names"),
    ("half-ratio-not-positive", _set("accuracy.half_ratio", 0), "accuracy.half_ratio", "greater than 0"),
    ("half-ratio-without-its-reference", _set("reference.half", _DELETE), "<root>", "needs reference.half"),
]


@pytest.mark.parametrize("mutate, key_path, expected", [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_spec_names_file_and_key(tmp_path, mutate, key_path, expected):
    data = copy.deepcopy(_base())
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_spec(path, tmp_path)
    err = info.value
    assert err.file == "chunk_gla_fwd_o_gk.yaml"
    assert err.key_path == key_path
    assert expected in err.expected or expected in str(err.got)
    assert str(err).startswith(f"chunk_gla_fwd_o_gk.yaml: {key_path}: expected ")


def test_yaml_syntax_error(tmp_path):
    path = _write(tmp_path, "op: x\nsignature: [unclosed\n", stem="x")
    with pytest.raises(SpecError, match=r"x\.yaml: <root>: expected valid YAML"):
        load_spec(path, tmp_path)


def test_not_a_mapping(tmp_path):
    path = _write(tmp_path, "- 1\n- 2\n", stem="x")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(path, tmp_path)


def test_op_must_match_file_stem(tmp_path):
    path = _write(tmp_path, _base(), stem="other_op")
    with pytest.raises(SpecError) as info:
        load_spec(path, tmp_path)
    assert info.value.key_path == "op"
    assert "other_op" in info.value.expected


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="readable file"):
        load_spec(tmp_path / "nope.yaml", tmp_path)


def test_expand_cases_cross_product():
    spec = load_spec(GLA, ROOT)
    rows = spec.expand_cases("bench")
    assert len(rows) == 22
    assert rows[0] == {"B": 1, "T": 4096, "H": 16, "K": 128, "V": 128, "chunk_size": 64, "dtype": "bfloat16"}
    with pytest.raises(SpecError, match="cases.nope"):
        spec.expand_cases("nope")
