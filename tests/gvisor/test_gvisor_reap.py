"""A gvisor session's directory is never reaped while it is being made, nor while its harness lives.

Two gvisor runs of one sweep start at once, and each start reaps what dead
harnesses left: a directory seen without its owner file must not be taken
for a dead harness's. Judged by what is left on disk.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from firstrun.sandbox.gvisor import backend
from firstrun.sandbox.ownership import process_identity


@pytest.fixture
def sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "gvisor"
    monkeypatch.setattr(backend, "SESSIONS_DIR", str(where))
    return where


def _dead_identity() -> str:
    child = subprocess.Popen(["sleep", "60"])
    identity = process_identity(child.pid)
    child.kill()
    child.wait()
    assert identity is not None
    return identity


def test_a_claimed_directory_appears_with_its_owner_and_survives_a_reap(sessions: Path) -> None:
    claimed = Path(backend._claim_session_dir("firstrun-claimed"))
    assert claimed == sessions / "firstrun-claimed"
    assert (claimed / "owner").read_text().strip() == process_identity(os.getpid())
    assert backend.reap("/nonexistent/runsc") == ()
    assert claimed.is_dir() and os.listdir(sessions) == ["firstrun-claimed"]


def test_a_claim_in_flight_is_left_and_a_dead_harness_s_session_is_reaped(sessions: Path) -> None:
    sessions.mkdir()
    in_flight = sessions / ".staging-abc123"
    in_flight.mkdir()
    dead = sessions / "firstrun-dead"
    dead.mkdir()
    (dead / "owner").write_text(_dead_identity() + "\n")
    dead_claim = sessions / ".staging-def456"
    dead_claim.mkdir()
    (dead_claim / "owner").write_text(_dead_identity() + "\n")
    assert sorted(backend.reap("/nonexistent/runsc")) == [".staging-def456", "firstrun-dead"]
    assert os.listdir(sessions) == [".staging-abc123"]
