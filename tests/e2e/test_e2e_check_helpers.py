"""The success check's helpers executed for real: a server started by the check, polled over HTTP.

``serve`` + ``wait_http`` (the harness backgrounds and polls) and the script
helpers ``qs_serve``/``qs_wait_http``/``qs_expect_output`` each start a real
``http.server`` inside the sandbox. A body that does not match makes the
check give up with the server's log, which proves a real server answered;
and no server outlives its run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from e2e_support import DOCS, DOCS_HOST, FIRSTRUN, runs_by_task, task

pytestmark = pytest.mark.e2e

FIXTURES = ["serve-wait-http", "serve-script-helpers", "serve-wrong-body"]


def _servers_running() -> list[str]:
    """Command lines of the fixture servers (``http.server ... --directory site``) still alive."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"http.server" in argv and b"site" in argv and b"--directory" in argv:
            found.append(" ".join(a.decode(errors="replace") for a in argv))
    return found


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("helpers") / "out"
    done = subprocess.run(
        [str(FIRSTRUN), "run", *(task(name) for name in FIXTURES), "--agent", "replay",
         "--docs-mirror", f"{DOCS_HOST}={DOCS}", "--out", str(out)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    return out


def test_serve_and_wait_http_pass_against_the_server_the_check_starts(out: Path) -> None:
    run = runs_by_task(out)["e2e-serve-wait-http"]
    assert (run["classification"], run["check_exit"]) == ("passed", 0)


def test_the_script_helpers_pass_against_the_server_they_start(out: Path) -> None:
    run = runs_by_task(out)["e2e-serve-script-helpers"]
    assert (run["classification"], run["check_exit"]) == ("passed", 0)


def test_a_server_that_answers_wrongly_fails_the_check_with_its_log(out: Path) -> None:
    run = runs_by_task(out)["e2e-serve-wrong-body"]
    assert (run["classification"], run["reason"], run["check_exit"]) == (
        "docs_gap", "check_failed", 1)
    output = run["check_output"]
    # The server's own access log: it was started, and it answered the polls.
    assert "--- server log" in output and '"GET /hello.txt HTTP/1.1" 200' in output
    assert "HTTP 200 but the body lacks text 'hello from the server'; body: goodbye" in output


def test_no_server_outlives_its_run(out: Path) -> None:
    assert _servers_running() == []
