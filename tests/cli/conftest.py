"""Fixtures for driving the real ``firstrun`` console script as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

FIRSTRUN = Path(sys.executable).parent / "firstrun"


@pytest.fixture
def firstrun() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the installed console script; never through a shell, stdin closed."""
    assert FIRSTRUN.exists(), f"{FIRSTRUN} missing: run scripts/install"

    def run(*args: str, timeout: float = 180, env: dict[str, str] | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(FIRSTRUN), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
            timeout=timeout, env=env if env is not None else dict(os.environ), cwd=cwd,
        )

    return run
