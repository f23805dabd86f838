"""What every bad-input test asserts of a refusal, and the small task they run it against."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

Run = Callable[..., subprocess.CompletedProcess[str]]

# Everything but the check, for tests that vary it.
HEAD = (
    "name: t\n"
    "goal: Do the thing.\n"
    "docs:\n"
    "  entrypoint: https://greeter.docs.example/index.html\n"
    "replay:\n"
    "  - echo hi\n"
)
SCRIPT = "success:\n  script: |\n    test -f x || qs_fail no\n"
TASK = HEAD + SCRIPT


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The refusal's one line: exit 3, no traceback, ``firstrun: error: ...``."""
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("firstrun: error: ")
    return lines[0]
