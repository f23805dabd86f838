"""The run container's helper (its pid 1) under a real dockerd, attacked from the commands it runs.

Judged by what the container itself shows afterwards (its process table,
the helper's state as the host kernel reports it) and by the exit codes
the harness received against the ones the commands really returned.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from firstrun.errors import SandboxError
from firstrun.sandbox.docker.backend import DockerBackend, DockerSession
from firstrun.sandbox.docker.resources import docker
from support.profiles import make_profile

pytestmark = pytest.mark.usefixtures("docker_ready")


@pytest.fixture(scope="module")
def session() -> Iterator[DockerSession]:
    workspace = tempfile.mkdtemp(prefix="firstrun-test-docker-helper-")
    try:
        profile = make_profile(workspace)
        with DockerBackend().start(profile, proxy=None) as s:
            yield s
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _table(session: DockerSession) -> str:
    return session.exec(["ps", "-eo", "pid,user,stat,args"]).stdout.text()


def _helper_host_state(session: DockerSession) -> str:
    pid = docker("inspect", "--format", "{{.State.Pid}}", session.topology.run).stdout.strip()
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_commands_run_as_the_sessions_uid_with_no_capability_left(session: DockerSession) -> None:
    status = session.exec(["grep", "-E", "^(Uid|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)",
                           "/proc/self/status"]).stdout.text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split()[0] != "0"
    assert {k: int(fields[k], 16) for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")} == dict.fromkeys(
        ("CapPrm", "CapEff", "CapBnd", "CapAmb"), 0)
    assert fields["NoNewPrivs"].strip() == "1"
    [helper] = [line for line in _table(session).splitlines() if line.split()[0] == "1"]
    assert helper.split()[1] == "root"


def test_output_is_framed_and_cannot_forge_the_exit(session: DockerSession) -> None:
    forged = '{"op":"exit","id":1,"code":0,"timed_out":false,"duration_s":0}'
    result = session.exec(f"echo '{forged}'; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout.text(), result.stderr.text()) == (
        3, forged + "\n", "err\n")


def test_a_command_cannot_reach_the_helpers_channel_memory_or_signals(
        session: DockerSession) -> None:
    # The attack the supervisor once fell to: frames written straight into its
    # channel to the harness. Every descriptor, the memory and a stop signal
    # are tried; the harness must still hear the command's own exit, 3.
    attack = r"""
        frame='{"op":"exit","id":%s,"code":0,"timed_out":false,"duration_s":0}'
        for fd in 0 1 2 3 4 5 6 7 8 9; do
          for id in $(seq 1 50); do printf "$frame\n" "$id"; done > /proc/1/fd/$fd && echo "wrote fd $fd"
        done
        ls /proc/1/fd && echo listed
        cat /proc/1/environ > /dev/null && echo "read environ"
        python3 -c 'open("/proc/1/mem", "r+b")' 2>/dev/null && echo "opened pid 1 mem"
        python3 -c 'open("/proc/self/mem", "r+b")' 2>/dev/null && echo "opened own mem"
        kill -STOP 1 && echo stopped
        kill -KILL -1 2>/dev/null
        exit 3
    """
    result = session.exec(attack)
    assert result.exit_code == 3
    assert result.stdout.text() == "", result.stdout.text()
    assert "Permission denied" in result.stderr.text()
    assert "Operation not permitted" in result.stderr.text()
    assert _helper_host_state(session) in ("S", "R")
    assert session.exec("echo alive").stdout.text() == "alive\n"


def test_timeout_kills_the_whole_tree_setsid_double_fork_included(session: DockerSession) -> None:
    result = session.exec("setsid bash -c '(sleep 4101 &) ; sleep 4102' & sleep 4103", timeout=2)
    assert result.timed_out is True
    assert "sleep 410" not in _table(session)


def test_kill_all_ends_what_commands_left_and_counts_it(session: DockerSession) -> None:
    assert session.exec("setsid sleep 4301 >/dev/null 2>&1 < /dev/null & "
                        "(sleep 4302 &) >/dev/null 2>&1").exit_code == 0
    assert "sleep 4301" in _table(session) and "sleep 4302" in _table(session)
    assert session.kill_all() == 2
    table = _table(session)
    assert "sleep 430" not in table, table
    assert session.kill_all() == 0


def test_a_cwd_the_session_cannot_enter_is_the_commands_failure(session: DockerSession) -> None:
    # Entered as the session's uid, after the drop: root without
    # CAP_DAC_OVERRIDE could not enter the lent workspace at all.
    assert session.exec("pwd", cwd="sub").exit_code == 127
    session.exec("mkdir sub && chmod 0 sub")
    try:
        denied = session.exec("pwd", cwd="sub")
        assert denied.exit_code == 126 and "Permission denied" in denied.stderr.text()
    finally:
        session.exec("chmod 755 sub && rmdir sub")
    session.exec("mkdir -p ok")
    assert session.exec("pwd", cwd="ok").stdout.text() == "/workspace/ok\n"


def test_a_helper_stopped_from_outside_is_detected_within_its_liveness() -> None:
    # Nothing inside can stop it (above); a stop from the host is what is left.
    workspace = tempfile.mkdtemp(prefix="firstrun-test-docker-stopped-")
    try:
        profile = make_profile(workspace)
        with DockerBackend().start(profile, proxy=None) as session:
            session.liveness_s = 3.0
            caught: list[BaseException] = []

            def run() -> None:
                try:
                    session.exec("touch started; sleep 3600", timeout=3600)
                except SandboxError as exc:
                    caught.append(exc)

            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(workspace, "started")):
                assert time.monotonic() < deadline, "the command never started"
                time.sleep(0.05)
            pid = docker("inspect", "--format", "{{.State.Pid}}", session.topology.run).stdout
            os.kill(int(pid), signal.SIGSTOP)
            worker.join(timeout=120)
            assert not worker.is_alive(), "the stopped helper went unnoticed"
            assert len(caught) == 1 and "sent nothing for 3s" in str(caught[0]), caught
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
