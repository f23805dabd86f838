"""The generated profile under the real sandbox-exec, judged by evidence (macOS only)."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.seatbelt.profile import SeatbeltHost, build_seatbelt_spec

pytestmark = pytest.mark.macos


def _run(tmp_path: Path, script: str, *, proxy_port: int | None) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    home = Path(os.path.realpath(tmp_path / "home"))
    workspace = home / "ws"
    workspace.mkdir(parents=True)
    (home / "secret.txt").write_text("canary-secret")
    sandbox_tmp = Path(os.path.realpath(tempfile.mkdtemp(prefix="firstrun-sb-")))
    harness = Path(os.path.realpath(tempfile.mkdtemp(prefix="firstrun-profile-")))
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=str(workspace),
                                                 real_homes=(str(home),)))
    spec = build_seatbelt_spec(profile, host=SeatbeltHost(
        tmpdir=str(sandbox_tmp), profile_file=str(harness / "profile.sb")), proxy_port=proxy_port)
    Path(spec.profile_file).write_text(spec.profile_text)
    script = script.replace("PROFILE_FILE", spec.profile_file)
    done = subprocess.run(spec.argv(["/bin/bash", "-c", script]), capture_output=True, text=True,
                          cwd=workspace, timeout=60)
    return done, workspace, Path(spec.profile_file)


def test_home_unreadable_workspace_writable(tmp_path: Path) -> None:
    done, workspace, _ = _run(tmp_path, "cat ../secret.txt; echo made > made.txt", proxy_port=None)
    assert "canary-secret" not in done.stdout
    assert (workspace / "made.txt").read_text() == "made\n"


def test_profile_file_cannot_be_replaced_from_inside(tmp_path: Path) -> None:
    done, _, profile_file = _run(
        tmp_path, "echo '(version 1)(allow default)' > 'PROFILE_FILE'; rm -f 'PROFILE_FILE'",
        proxy_port=None)
    assert profile_file.read_text().startswith("(version 1)\n(deny default)\n")


def test_only_the_proxy_port_is_reachable(tmp_path: Path) -> None:
    with socket.socket() as canary, socket.socket() as proxy:
        canary.bind(("127.0.0.1", 0))
        canary.listen(4)
        canary.setblocking(False)
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(4)
        port = canary.getsockname()[1]
        _run(tmp_path, f"exec 3<>/dev/tcp/127.0.0.1/{port}", proxy_port=proxy.getsockname()[1])
        with pytest.raises(BlockingIOError):
            canary.accept()
