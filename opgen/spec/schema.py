"""The JSON Schema of the spec format (``opgen schema``), from the pydantic models of
``opgen.spec.spec_model``: editors validate ``specs/*.yaml`` against it (each spec names it in a
``yaml-language-server`` modeline), and the tests check every spec of the repository with it.
Uses ``spec_model``.
"""
from __future__ import annotations

import json
import warnings
from typing import Any

from pydantic.json_schema import PydanticJsonSchemaWarning

from .spec_model import OpSpec

SCHEMA_FILE = "specs/spec.schema.json"
"""Where the repository keeps the schema, beside the specs that name it."""


def spec_schema() -> dict[str, Any]:
    """The schema of one ``specs/<op>.yaml`` (the loader's own ``path`` field left out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)  # formula defaults have no JSON form
        schema = OpSpec.model_json_schema()
    schema["properties"].pop("path", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema,
            "title": "opgen operator spec (specs/<op>.yaml)"}


def schema_text() -> str:
    """:func:`spec_schema` as the text ``opgen schema`` writes (stable: sorted keys)."""
    return json.dumps(spec_schema(), indent=1, sort_keys=True) + "\n"
