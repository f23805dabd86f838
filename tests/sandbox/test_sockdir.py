"""Proxy socket directories: a SIGKILLed harness's is removed by the next, a live one's is not.

Each harness here is a real process that makes its directory and binds a
Unix socket in it, as the proxy does; one is killed with SIGKILL, one keeps
running. Judged by what is left in the temporary directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from firstrun.sandbox.sockdir import PREFIX, socket_directory

# A harness: its socket directory in argv[1], a socket bound there, its path
# printed, then it waits to be killed (or for its stdin to close).
HARNESS = r"""
import os, socket, sys
from firstrun.sandbox.sockdir import socket_directory
with socket_directory(sys.argv[1]) as path:
    socket.socket(socket.AF_UNIX).bind(os.path.join(path, "proxy.sock"))
    print(path, flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def harnesses() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _harness(parent: Path, started: list[subprocess.Popen[str]]) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, str(parent)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    started.append(proc)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_harnesss_directory_is_removed_by_the_next_and_a_live_ones_kept(
        tmp_path: Path, harnesses: list[subprocess.Popen[str]]) -> None:
    killed, killed_dir = _harness(tmp_path, harnesses)
    live, live_dir = _harness(tmp_path, harnesses)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (killed_dir / "proxy.sock").is_socket()
    with socket_directory(str(tmp_path)) as mine:
        assert not killed_dir.exists()
        assert (live_dir / "proxy.sock").is_socket()
        assert Path(mine).is_dir()
    assert not Path(mine).exists()
    # The live harness's exit removes its own.
    assert live.stdin is not None
    live.stdin.close()
    assert live.wait() == 0
    assert sorted(os.listdir(tmp_path)) == []


def test_what_names_no_dead_owner_is_left_alone(tmp_path: Path) -> None:
    # An older firstrun's directory (no owner file), and a symlink by the name.
    unowned = tmp_path / f"{PREFIX}old"
    unowned.mkdir()
    (unowned / "proxy.sock").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "owner").write_text("1:1\n")
    (tmp_path / f"{PREFIX}link").symlink_to(elsewhere)
    with socket_directory(str(tmp_path)):
        pass
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", f"{PREFIX}link", f"{PREFIX}old"]
    assert (elsewhere / "owner").exists() and (unowned / "proxy.sock").exists()


def test_a_reaper_that_runs_while_the_owner_is_being_written_keeps_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another harness's reaper runs at the worst moment: the owner's bytes are not yet in
    # place. It must see no owner (and leave the directory), never an empty one.
    from firstrun.sandbox import sockdir

    rename = os.rename
    reaped: list[tuple[str, ...]] = []

    def reap_then_rename(src: str, dst: str) -> None:
        reaped.append(sockdir.reap_socket_directories(str(tmp_path)))
        rename(src, dst)

    monkeypatch.setattr(sockdir.os, "rename", reap_then_rename)
    with socket_directory(str(tmp_path)) as mine:
        assert reaped == [()]
        assert Path(mine).is_dir()
        assert (Path(mine) / "owner").read_text().strip()
