"""Fixtures for run tests: the fixture docs site served by a directory mirror, and run configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.docs import Mirror
from firstrun.run.runner import RunConfig
from firstrun.tasks.load import load_task
from firstrun.tasks.model import Task

FIXTURES = Path(__file__).parent / "fixtures"
DOCS_HOST = "docs.greeter.test"


def fixture_task(name: str) -> Task:
    return load_task(FIXTURES / "tasks" / f"{name}.yaml")


def write_task(directory: Path, name: str, text: str) -> Task:
    path = directory / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return load_task(path)


@pytest.fixture
def mirror() -> dict[str, Mirror]:
    return {DOCS_HOST: Mirror(host=DOCS_HOST, directory=str((FIXTURES / "docs").resolve()))}


@pytest.fixture
def config(tmp_path: Path, mirror: dict[str, Mirror]) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend="linux", docs_mirrors=mirror)
