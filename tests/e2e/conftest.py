"""Fixtures for end-to-end runs (helpers live in ``e2e_support``: conftest names collide across test directories)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator

import pytest
from e2e_support import FIRSTRUN, Answer, DocsServer, Run


@pytest.fixture
def firstrun() -> Run:
    """Run the installed console script; never through a shell, stdin closed."""
    assert FIRSTRUN.exists(), f"{FIRSTRUN} missing: run scripts/install"

    def run(*args: str, timeout: float = 600, env: dict[str, str] | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(FIRSTRUN), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
            timeout=timeout, env=env if env is not None else dict(os.environ), cwd=cwd,
        )

    return run


@pytest.fixture
def docs_server() -> Iterator[Callable[[dict[str, Answer]], DocsServer]]:
    started: list[DocsServer] = []

    def start(answers: dict[str, Answer]) -> DocsServer:
        server = DocsServer(answers).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__()
