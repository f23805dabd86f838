"""Fixtures for the agent tests: the fixture docs site on a directory mirror, and run configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_support import DOCS_HOST, FIXTURES

from firstrun.docs import Mirror
from firstrun.run.runner import RunConfig


@pytest.fixture
def config(tmp_path: Path) -> RunConfig:
    mirror = Mirror(host=DOCS_HOST, directory=str((FIXTURES / "docs").resolve()))
    return RunConfig(out_dir=tmp_path / "out", backend="linux", docs_mirrors={DOCS_HOST: mirror})
