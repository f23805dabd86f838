"""The VM's lifecycle on the host: ownership given back, nothing left after close, interrupt or SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from microvm_support import (
    ACCEL,
    alive,
    qemu_pids,
    wait_gone,
)

from firstrun.errors import SandboxError
from firstrun.sandbox.microvm.backend import MicrovmBackend
from support.profiles import make_profile

FOREIGN_OWNER = 43210



def test_files_come_back_owned_by_the_workspace_owner_and_close_ends_qemu(
        workspace: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("lending the workspace to a per-session uid needs a root harness")
    os.chown(workspace, FOREIGN_OWNER, FOREIGN_OWNER)
    session = MicrovmBackend(accel=ACCEL).start(make_profile(workspace), proxy=None)
    with session:
        result = session.exec("mkdir -p sub && echo x > sub/file && id -u")
        lent = int(result.stdout.text())
        assert lent not in (0, FOREIGN_OWNER)
        # Mid-session the host sees the lent uid: QEMU wrote as that uid, not as root.
        assert os.stat(os.path.join(workspace, "sub", "file")).st_uid == lent
    assert not alive(session.pid)
    for path in ("sub", "sub/file"):
        st = os.stat(os.path.join(workspace, path))
        assert (st.st_uid, st.st_gid) == (FOREIGN_OWNER, FOREIGN_OWNER)
    assert os.stat(workspace).st_uid == FOREIGN_OWNER


def test_interrupt_ends_a_running_command_and_the_vm(workspace: str) -> None:
    session = MicrovmBackend(accel=ACCEL).start(make_profile(workspace), proxy=None)
    errors: list[BaseException] = []
    started = threading.Event()

    def run() -> None:
        try:
            session.exec("echo started; sleep 1000", on_output=lambda *_: started.set())
        except SandboxError as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(timeout=120)
    session.interrupt()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(errors) == 1
    assert wait_gone(session.pid)
    session.close()


_HARNESS = """
import sys
from firstrun.policy.process import Limits
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.microvm.backend import MicrovmBackend
import os
session = MicrovmBackend(accel=sys.argv[2]).start(
    SandboxProfile(fs=host_filesystem_policy(sys.argv[1], os.environ, protect=False)), proxy=None)
print(session.pid, flush=True)
session.exec("echo up")
print("ready", flush=True)
sys.stdin.read()
"""


def test_sigkill_of_the_harness_takes_the_vm_with_it(workspace: str) -> None:
    harness = subprocess.Popen([sys.executable, "-c", _HARNESS, workspace, ACCEL],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert harness.stdout is not None
    qemu_pid = int(harness.stdout.readline())
    assert harness.stdout.readline().strip() == "ready"
    assert alive(qemu_pid)
    os.kill(harness.pid, signal.SIGKILL)
    harness.wait()
    assert wait_gone(qemu_pid)


def test_an_agent_that_dies_at_boot_is_reported_and_leaves_nothing(
        workspace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from firstrun.sandbox.microvm import backend as backend_module

    monkeypatch.setattr(backend_module, "AGENT_SOURCE", b"raise SystemExit('agent-boom')\n")
    before = qemu_pids()
    owner = os.stat(workspace).st_uid
    with pytest.raises(SandboxError) as caught:
        MicrovmBackend(accel=ACCEL).start(make_profile(workspace), proxy=None)
    assert "agent-boom" in str(caught.value)
    assert all(wait_gone(pid) for pid in qemu_pids() - before)
    assert os.stat(workspace).st_uid == owner
