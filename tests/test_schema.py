"""The JSON Schema of the spec format: the committed copy is what `opgen schema` writes, every spec
of the repository (and of the toy project) validates against it, and it refuses what the loader
refuses by shape."""
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from opgen.spec.schema import SCHEMA_FILE, schema_text, spec_schema

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.yaml")) + [ROOT / "tests" / "toy_project" / "specs" / "toy_op.yaml"]


def test_the_committed_schema_is_current():
    assert (ROOT / SCHEMA_FILE).read_text() == schema_text(), "run `opgen schema --out specs/spec.schema.json`"


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_spec_validates_and_names_the_schema(path):
    schema = json.loads((ROOT / SCHEMA_FILE).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(path.read_text()), schema, cls=jsonschema.Draft202012Validator)
    if path.parent == ROOT / "specs":
        assert path.read_text().startswith("# yaml-language-server: $schema=spec.schema.json\n")


@pytest.mark.parametrize("change", [
    lambda d: d.update(unknown_key=1),
    lambda d: d["signature"]["scalars"]["scale"].update(type="complex"),
    lambda d: d["tunables"]["BK"].update(role="sometimes"),
    lambda d: d.pop("dispatch"),
])
def test_the_schema_refuses_what_the_loader_refuses(change):
    data = yaml.safe_load((ROOT / "specs" / "chunk_gla_fwd_o_gk.yaml").read_text())
    change(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, spec_schema(), cls=jsonschema.Draft202012Validator)
