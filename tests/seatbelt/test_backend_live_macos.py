"""The Seatbelt backend end to end under the real sandbox-exec (macOS only).

Every escape is attempted for real and judged by evidence the harness holds:
a canary file unchanged, a canary listener that accepted nothing, a pid that
no longer runs. Off macOS these are skipped with the reason; the parts that
need no macOS are in ``test_backend_spec.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from firstrun.errors import SandboxUnavailable
from firstrun.policy.filesystem import SYSTEM_READONLY, FilesystemPolicy
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.proxy.server import EgressProxy
from firstrun.sandbox.base import Enforcement, ProxyEndpoint
from firstrun.sandbox.seatbelt.backend import SeatbeltBackend, SeatbeltSession

pytestmark = [
    pytest.mark.macos,
    pytest.mark.skipif(sys.platform != "darwin",
                       reason=f"Seatbelt (sandbox-exec) exists only on macOS; this is {sys.platform}"),
]

DOWNGRADED = frozenset({LayerName.NAMESPACES, LayerName.LIMITS})
PYTHON = os.path.realpath(sys.executable)
# A double-forked, setsid daemon that records its pid, then outlives its parent.
DAEMON = """
import os, sys, time
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    sys.exit(0)
devnull = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(devnull, fd)
with open("daemon.pid.tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename("daemon.pid.tmp", "daemon.pid")
time.sleep(1000)
"""


@dataclass(frozen=True, kw_only=True)
class World:
    session: SeatbeltSession
    proxy: EgressProxy
    home: Path
    workspace: Path
    outside: Path


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    root = Path(os.path.realpath(tmp_path))
    home = root / "home"
    workspace = home / "src" / "ws"
    workspace.mkdir(parents=True)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("canary-private-key")
    (home / "secret.txt").write_text("canary-secret")
    outside = root / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("unchanged")
    profile = SandboxProfile(
        fs=FilesystemPolicy(
            workspace=str(workspace),
            readonly=tuple(p for p in SYSTEM_READONLY if os.path.lexists(p)),
            real_homes=(str(home), os.path.realpath(Path.home())),
        ),
        downgrades=DOWNGRADED,
    )
    with tempfile.TemporaryDirectory(prefix="fr-sb-") as sockdir, \
            EgressProxy(NetworkPolicy.build()) as proxy:
        path = proxy.listen_unix(os.path.join(sockdir, "proxy.sock"), Channel.SHELL)
        with SeatbeltBackend().start(
                profile, proxy=ProxyEndpoint(socket_path=path, nonce=proxy.nonce)) as session:
            yield World(session=session, proxy=proxy, home=home, workspace=workspace,
                        outside=outside)


def _running(pid: int) -> bool:
    """Alive and not a zombie, by the process table."""
    out = subprocess.run(["/bin/ps", "-o", "stat=", "-p", str(pid)],
                         capture_output=True, text=True).stdout.strip()
    return bool(out) and not out.startswith("Z")


def test_the_session_is_attested_and_says_what_it_could_not_enforce(world: World) -> None:
    info = world.session.info
    assert all(c.passed for c in info.attestation), info.attestation
    names = {c.name for c in info.attestation}
    assert {"direct_egress_refused", "host_loopback_unreachable_inside", "proxy_answers",
            "real_homes_unreadable", "writes_confined", "seatbelt_applied"} <= names
    assert info.enforcement is Enforcement.DOWNGRADED
    assert set(info.downgrades) == {"namespaces", "limits"}


def test_without_the_downgrades_the_backend_refuses(tmp_path: Path) -> None:
    profile = SandboxProfile(fs=FilesystemPolicy(workspace=os.path.realpath(tmp_path)))
    with pytest.raises(SandboxUnavailable) as refused:
        SeatbeltBackend().start(profile, proxy=None)
    assert "--allow-downgrade" in (refused.value.fix or "")


def test_writes_outside_the_workspace_fail(world: World) -> None:
    profile_file = world.session.spec.profile_file
    result = world.session.exec(
        f"echo pwned > '{world.outside}/canary.txt'; echo pwned > '{world.outside}/new.txt'; "
        f"echo pwned > '{world.home}/new.txt'; mkdir '{os.path.dirname(profile_file)}/x'; "
        "echo made > made.txt")
    assert result.exit_code == 0
    assert (world.outside / "canary.txt").read_text() == "unchanged"
    assert not (world.outside / "new.txt").exists()
    assert not (world.home / "new.txt").exists()
    assert not Path(os.path.dirname(profile_file), "x").exists()
    assert (world.workspace / "made.txt").read_text() == "made\n"


def test_the_profile_file_cannot_be_replaced_from_inside(world: World) -> None:
    profile_file = world.session.spec.profile_file
    before = Path(profile_file).read_text()
    world.session.exec(f"chmod 600 '{profile_file}'; echo '(version 1)(allow default)' > "
                       f"'{profile_file}'; mv '{profile_file}' '{profile_file}.x'; "
                       f"rm -f '{profile_file}'")
    assert Path(profile_file).read_text() == before
    assert os.stat(profile_file).st_mode & 0o777 == 0o400


def test_home_secrets_are_unreadable_even_through_a_link(world: World) -> None:
    # A hard link is the classic way round a path-based sandbox: the same
    # vnode under a workspace name. The home is on the workspace's disk here.
    result = world.session.exec(
        f"cat '{world.home}/secret.txt' '{world.home}/.ssh/id_ed25519'; ls -a '{world.home}'; "
        f"ln -s '{world.home}/secret.txt' link; cat link; "
        f"ln '{world.home}/secret.txt' hard; cat hard; "
        f"cp '{world.home}/.ssh/id_ed25519' copy; cat copy")
    assert "canary-secret" not in result.stdout.text()
    assert "canary-private-key" not in result.stdout.text()
    assert ".ssh" not in result.stdout.text()


def test_a_direct_dial_reaches_nothing_while_the_proxy_answers(world: World) -> None:
    with socket.socket() as canary:
        canary.bind(("127.0.0.1", 0))
        canary.listen(8)
        canary.setblocking(False)
        port = canary.getsockname()[1]
        result = world.session.exec(
            f"(exec 3<>/dev/tcp/127.0.0.1/{port}); "
            f"'{PYTHON}' -I -S -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5)'; "
            "curl -sS --max-time 20 http://attest.firstrun.invalid/")
        with pytest.raises(BlockingIOError):
            canary.accept()
    # The control: the one port the profile allows does answer, with this proxy's nonce.
    assert world.proxy.nonce in result.stdout.text()


def test_a_timeout_kills_the_command_and_the_daemon_it_left(world: World) -> None:
    result = world.session.exec(
        [PYTHON, "-I", "-S", "-c",
         f"import subprocess, os, time\nsubprocess.run([{PYTHON!r}, '-I', '-S', '-c', {DAEMON!r}])\n"
         "while not os.path.exists('daemon.pid'):\n    time.sleep(0.05)\ntime.sleep(1000)"],
        timeout=20)
    assert result.timed_out
    pid = int((world.workspace / "daemon.pid").read_text())
    assert not _running(pid)


def test_close_kills_a_daemon_that_left_its_process_group(world: World) -> None:
    result = world.session.exec([PYTHON, "-I", "-S", "-c", DAEMON], timeout=60)
    assert result.exit_code == 0
    pid_file = world.workspace / "daemon.pid"
    world.session.exec("while [ ! -s daemon.pid ]; do sleep 0.05; done", timeout=60)
    pid = int(pid_file.read_text())
    assert _running(pid)
    world.session.close()
    assert not _running(pid)


def test_a_timeout_spares_a_daemon_an_earlier_command_started(world: World) -> None:
    world.session.exec([PYTHON, "-I", "-S", "-c", DAEMON], timeout=60)
    world.session.exec("while [ ! -s daemon.pid ]; do sleep 0.05; done", timeout=60)
    pid = int((world.workspace / "daemon.pid").read_text())
    assert world.session.exec("sleep 1000", timeout=2).timed_out
    assert _running(pid)
    world.session.close()
    assert not _running(pid)
