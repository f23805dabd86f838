"""Ctrl-C in the middle of a suite: the CLI exits 130 and results.json keeps every finished run.

The suite is three tasks: one that finishes, one interrupted while its
documented step runs, and one that must never start. SIGINT goes to the CLI
process alone, as a signal from outside would (the sandbox runs in its own
session). The CLI runs with its own TMPDIR, so whatever a run leaves behind
on the host is in plain sight.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_support import DOCS, DOCS_HOST, FIRSTRUN, runs_by_task, task

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Interrupted:
    returncode: int
    output: str
    out: Path
    tmpdir: Path


def _wait_for(condition, what: str, *, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def _trace(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    # Append-only and flushed per line; a line still being written is skipped.
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return found


def _sleepers() -> list[int]:
    """Processes running the fixture's documented step (``sleep 10``)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read().split(b"\0")[:2] == [b"sleep", b"10"]:
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Interrupted]:
    out = tmp_path_factory.mktemp("interrupt") / "out"
    # Not under pytest's own (0700) directory: the sandbox's unprivileged uid
    # must be able to reach the staging directories the harness makes here.
    tmpdir = Path(tempfile.mkdtemp(prefix="firstrun-e2e-tmpdir-", dir="/tmp"))
    tmpdir.chmod(0o755)
    cli = subprocess.Popen(
        [str(FIRSTRUN), "run", task("passes"), task("sleeps"), task("check-fails"),
         "--docs-mirror", f"{DOCS_HOST}={DOCS}", "--out", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, TMPDIR=str(tmpdir)),
    )
    try:
        sleeper = out / "runs" / "e2e-sleeps" / "1" / "trace.jsonl"
        _wait_for(lambda: (out / "results.json").exists()
                  and runs_by_task(out), "the first run to be saved")
        _wait_for(lambda: any(e["kind"] == "docs_read" for e in _trace(sleeper)),
                  "the second run's agent to start")
        cli.send_signal(signal.SIGINT)
        output, _ = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    yield Interrupted(returncode=cli.returncode, output=output, out=out, tmpdir=tmpdir)
    shutil.rmtree(tmpdir, ignore_errors=True)


def test_sigint_exits_130_and_keeps_exactly_the_finished_runs(interrupted: Interrupted) -> None:
    assert interrupted.returncode == 130, interrupted.output
    runs = runs_by_task(interrupted.out)
    assert list(runs) == ["e2e-passes"]
    assert runs["e2e-passes"]["classification"] == "passed"
    # No new run started after the signal.
    assert not (interrupted.out / "runs" / "e2e-check-fails").exists()
    assert _sleepers() == []


def test_the_run_in_flight_ends_cleanly_and_leaves_nothing_behind(
    interrupted: Interrupted,
) -> None:
    assert interrupted.returncode == 130, interrupted.output
    trace = _trace(interrupted.out / "runs" / "e2e-sleeps" / "1" / "trace.jsonl")
    assert any(e["kind"] == "sandbox_started" for e in trace)
    failures = [e["reason"] for e in trace if e["kind"] == "failure"]
    finished = [(e["classification"], e["reason"]) for e in trace if e["kind"] == "run_finished"]
    assert failures == ["interrupted"]
    assert finished == [("infra_error", "interrupted")]
    # Its temporary workspace and staging directories were removed.
    assert sorted(os.listdir(interrupted.tmpdir)) == []
