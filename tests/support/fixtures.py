"""Fixtures every test directory may ask for; a plugin of the root conftest.

``workspace`` is an empty directory of the harness's, removed after the test.
``greeter_mirror`` serves the greeter quickstart from its directory. ``config``
runs on the fake backend (no kernel, nothing enforced, allowed explicitly), for
tests of the agent loop and the run rather than of the boundary; ``linux_config``
is the same run on bubblewrap, for tests that judge what the sandbox does.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from firstrun.docs import Mirror
from firstrun.run.runner import RunConfig
from support.agents import DOCS_HOST, GREETER_DOCS


@pytest.fixture
def workspace() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="firstrun-test-ws-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def greeter_mirror() -> dict[str, Mirror]:
    return {DOCS_HOST: Mirror(host=DOCS_HOST, directory=str(GREETER_DOCS.resolve()))}


@pytest.fixture
def config(tmp_path: Path, greeter_mirror: dict[str, Mirror]) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend="fake", allow_unenforced=True,
                     docs_mirrors=greeter_mirror)


@pytest.fixture
def linux_config(tmp_path: Path, greeter_mirror: dict[str, Mirror]) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend="linux", docs_mirrors=greeter_mirror)
