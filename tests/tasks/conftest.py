from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_task(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a task file (dedented) into a fresh directory and return its path."""

    def write(text: str, name: str = "task.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write
