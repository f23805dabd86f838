from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from firstrun.tasks.cli_support import schema_text
from firstrun.tasks.model import TaskSpec
from firstrun.tasks.schema import task_json_schema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"
VALID_FILES = sorted((FIXTURES / "valid").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = task_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", VALID_FILES, ids=lambda p: p.name)
def test_every_valid_fixture_validates_against_the_schema(path: Path, validator) -> None:
    validator.validate(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(
    "name",
    [
        "typo-top-level.yaml",
        "typo-nested.yaml",
        "wrong-type.yaml",
        "setup-not-a-list.yaml",
        "path-and-entrypoint.yaml",
        "script-and-file.yaml",
        "missing-goal.yaml",
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(name: str, validator) -> None:
    data = yaml.safe_load((FIXTURES / "invalid" / name).read_text())
    assert not validator.is_valid(data)


def test_schema_is_the_model() -> None:
    schema = task_json_schema()
    assert set(schema["properties"]) == {f.alias or n for n, f in TaskSpec.model_fields.items()}
    assert schema["additionalProperties"] is False
    assert "json" in schema["$defs"]["WaitHttp"]["properties"]
    assert schema["$defs"]["Budgets"]["properties"]["max_seconds"]["default"] == 480


def test_schema_text_is_stable_json() -> None:
    text = schema_text()
    assert text.endswith("\n") and json.loads(text) == task_json_schema()
    assert schema_text() == text
