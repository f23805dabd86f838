"""Fixtures for run tests: the fixture docs site served by a directory mirror, and run configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_support import DOCS_HOST, FIXTURES

from firstrun.docs import Mirror
from firstrun.run.runner import RunConfig


@pytest.fixture
def mirror() -> dict[str, Mirror]:
    return {DOCS_HOST: Mirror(host=DOCS_HOST, directory=str((FIXTURES / "docs").resolve()))}


@pytest.fixture
def config(tmp_path: Path, mirror: dict[str, Mirror]) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend="linux", docs_mirrors=mirror)
