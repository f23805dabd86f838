"""The JSON Schema of a task file, generated from the model that validates one.

Guarantee: the schema is derived from ``TaskSpec`` on every call, never kept
beside it, so an editor and the loader cannot disagree about a field's name,
type or default. (The loader is stricter where JSON Schema cannot say it:
host patterns, URLs, patterns that assert nothing.)
"""

from __future__ import annotations

from typing import Any

from firstrun.tasks.model import TaskSpec

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def task_json_schema() -> dict[str, Any]:
    schema = TaskSpec.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = SCHEMA_DIALECT
    schema["title"] = "firstrun task"
    return schema
