"""Red-team escapes: what a hostile command tries after reading the enforcement code.

Each test is an attack made for real inside a linux session and judged by
evidence the host can see (a host process that is gone, a file that never
appeared, a tmpfs that refused bytes, a process the kernel killed), never by
an exit code alone. The suite in ``test_escapes.py`` covers the issue's list;
these cover holes found, and boundaries probed, by reading the code.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import pytest
from sandbox_support import host_processes_with, make_profile

from firstrun.errors import SandboxError
from firstrun.policy.process import Limits
from firstrun.sandbox.base import Stream
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession

pytestmark = pytest.mark.escape

# Writes to stdout without end through a pipe enlarged to 1 MiB: the helper
# reads 64 KiB per round, so the pipe is never empty when it looks again.
# ``flooding`` appears in the working directory once the pipe is full.
FLOOD = (
    "import fcntl, os\n"
    "fcntl.fcntl(1, 1031, 1 << 20)\n"  # F_SETPIPE_SZ
    "chunk = b'y' * (1 << 16)\n"
    "for _ in range(16):\n"
    "    os.write(1, chunk)\n"
    "open('flooding', 'w').close()\n"
    "while True:\n"
    "    os.write(1, chunk)\n"
)


@pytest.fixture
def small(workspace: str) -> Iterator[LinuxSession]:
    """A session with a small memory limit, so filling it is cheap and bounded."""
    profile = make_profile(workspace, limits=Limits(memory_bytes=32 << 20))
    with LinuxBackend().start(profile, proxy=None) as s:
        yield s


def _drop_output(stream: Stream, data: bytes) -> None:
    del stream, data


def test_timeout_holds_while_the_command_keeps_its_pipe_full(session: LinuxSession,
                                                               workspace: str) -> None:
    # The hole: the deadline was only looked at when the pipes went quiet,
    # so a command that never let them go quiet never timed out; the harness
    # gave up on the helper instead and the command ran on.
    token = f"firstrun-flood-{secrets.token_hex(6)}"
    sentinel = os.path.join(workspace, "outlived-its-timeout")
    with open(os.path.join(workspace, "flood.py"), "w") as f:
        f.write(FLOOD)
    result = session.exec(
        f"bash -c 'exec -a {token} python3 flood.py' & sleep 8; touch {os.path.basename(sentinel)}",
        timeout=1, on_output=_drop_output,
    )
    assert result.timed_out
    assert host_processes_with(token) == []
    assert not os.path.exists(sentinel)


def test_a_background_writer_cannot_hold_the_exec(session: LinuxSession, workspace: str) -> None:
    # The command exits at once; what it left behind floods the same pipe.
    # The exec must come back as a finished command, not wait on the writer
    # until the harness declares the sandbox lost.
    with open(os.path.join(workspace, "flood.py"), "w") as f:
        f.write(FLOOD)
    result = session.exec("python3 flood.py & until [ -e flooding ]; do sleep 0.01; done; "
                          "echo started >&2", timeout=20,
                          on_output=_drop_output)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert result.stderr.text() == "started\n"
    # The session is still usable: the flood lost its pipe with the exec.
    assert session.exec("echo next", timeout=20).stdout.text() == "next\n"


def test_dev_shm_is_capped_like_every_other_tmpfs(small: LinuxSession) -> None:
    # /dev/shm was a directory of bubblewrap's /dev tmpfs, which has no size
    # option: half the host's RAM for a command whose memory limit is 32 MiB.
    result = small.exec("head -c 64M /dev/zero > /dev/shm/fill; stat -c %s /dev/shm/fill",
                        timeout=60)
    assert "No space left on device" in result.stderr.text()
    assert int(result.stdout.text()) <= 32 << 20


def test_a_command_that_stops_the_helper_takes_the_sandbox_down(workspace: str) -> None:
    # The helper is the command's parent and shares its uid and Landlock
    # domain, so the command may signal it. A stopped helper enforces
    # nothing (no timeout, no kill): the hole was that the sandbox ran on,
    # unsupervised, after the harness gave up on the helper, until close.
    token = f"firstrun-unsupervised-{secrets.token_hex(6)}"
    session = LinuxBackend().start(make_profile(workspace), proxy=None)
    try:
        with pytest.raises(SandboxError):
            session.exec(f"kill -STOP $PPID; exec -a {token} sleep 1000", timeout=1)
        # Bounds a broken run only: the fix ends the sandbox before exec raises.
        stop = time.monotonic() + 10
        while host_processes_with(token) and time.monotonic() < stop:
            time.sleep(0.05)
        assert host_processes_with(token) == []
    finally:
        session.close()
