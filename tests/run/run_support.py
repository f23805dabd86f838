"""Support for run tests: their task files (the docs site is ``support.agents``')."""

from __future__ import annotations

from pathlib import Path

from firstrun.tasks.load import load_task
from firstrun.tasks.model import Task

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_task(name: str) -> Task:
    return load_task(FIXTURES / "tasks" / f"{name}.yaml")


def write_task(directory: Path, name: str, text: str) -> Task:
    path = directory / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return load_task(path)
