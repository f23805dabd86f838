"""The gvisor backend under a real runsc: its own kernel, its channel, its leftovers.

Judged by evidence the host holds: the host's own kernel banner against the
one inside, the exit codes the harness received against the ones commands
really returned, the host's process table, runsc's state directories, the
cgroup tree and the workspace's owners after a SIGKILLed harness.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from firstrun.errors import SandboxError
from firstrun.sandbox.gvisor import backend as gvisor_backend
from firstrun.sandbox.gvisor.backend import SESSIONS_DIR, GvisorBackend, GvisorSession
from firstrun.sandbox.gvisor.spec import CGROUP_PARENT
from firstrun.sandbox.ownership import LEASE_DIR
from support.profiles import make_profile

FIRSTRUN = Path(sys.executable).parent / "firstrun"

pytestmark = pytest.mark.skipif(
    any(not c.available for c in GvisorBackend().probe()),
    reason="the gvisor backend is not available here (scripts/test installs runsc)")


@pytest.fixture(scope="module")
def session() -> Iterator[GvisorSession]:
    workspace = tempfile.mkdtemp(prefix="firstrun-test-gvisor-")
    try:
        profile = make_profile(workspace)
        with GvisorBackend().start(profile, proxy=None) as s:
            yield s
    finally:
        subprocess.run(["rm", "-rf", workspace], check=False)


def test_the_kernel_inside_is_gvisors_not_the_hosts(session: GvisorSession) -> None:
    inside = session.exec("cat /proc/version; uname -r").stdout.text().splitlines()
    host = Path("/proc/version").read_text(encoding="utf-8").strip()
    assert inside[0] != host and inside[1] != os.uname().release
    # What only the host kernel answers, the sandbox's does not.
    probe = session.exec(["python3", "-c", "import ctypes, os; "
                          "print(ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1), "
                          "ctypes.get_errno(), os.path.exists('/proc/sys/kernel/osrelease'))"])
    assert probe.stdout.text().split() == ["-1", "38", "False"], probe.stderr.text()
    [check] = [c for c in session.info.attestation if c.name == "kernel_not_the_hosts"]
    assert check.passed, check.detail
    layers = {layer.name: layer.mechanism for layer in session.info.layers}
    assert "gVisor" in layers["namespaces"] and "read-only root" in layers["landlock"]


def test_the_linux_filter_is_loaded_and_proven_from_inside(session: GvisorSession) -> None:
    checks = {c.name: c for c in session.info.attestation}
    # Inside: the probe's own calls met the filter; outside: runsc's filter on the sentry.
    assert checks["seccomp_loaded"].passed, checks["seccomp_loaded"]
    assert checks["seccomp_loaded"].detail == ("Seccomp 2, unshare(CLONE_NEWUSER): EPERM, "
                                               "process_vm_readv(itself): EPERM")
    assert checks["sentry_seccomp_loaded"].passed, checks["sentry_seccomp_loaded"]
    [layer] = [layer for layer in session.info.layers if layer.name == "seccomp"]
    assert layer.applied and layer.mechanism.startswith("seccomp-bpf in the sentry (")
    # The clone3 refusal answers ENOSYS, as on linux, so libc falls back to
    # clone: threads and subprocesses still start.
    out = session.exec(["python3", "-c", "import ctypes, subprocess, threading; "
                        "libc = ctypes.CDLL(None, use_errno=True); "
                        "print(libc.syscall(435, None, 0), ctypes.get_errno()); "
                        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); "
                        "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout)"])
    assert out.stdout.text().split() == ["-1", "38", "thread", "child"], out.stderr.text()


def test_a_filter_the_sentry_will_not_load_refuses_the_session(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One instruction with an opcode BPF does not have: the helper's load fails.
    monkeypatch.setattr(gvisor_backend.seccomp, "filter_program", lambda: b"\xff" * 8)
    before = _own_session_dirs()
    workspace = tempfile.mkdtemp(prefix="firstrun-test-gvisor-")
    try:
        profile = make_profile(workspace)
        with pytest.raises(SandboxError, match="PR_SET_SECCOMP"):
            GvisorBackend().start(profile, proxy=None)
    finally:
        subprocess.run(["rm", "-rf", workspace], check=False)
    # Torn down: no session directory of this harness is left but those it had.
    assert _own_session_dirs() <= before


def _own_session_dirs() -> set[str]:
    """This harness's session directories (other harnesses may share the host)."""
    mine = f"{os.getpid()}:"
    return {name for name in os.listdir(SESSIONS_DIR)
            if Path(SESSIONS_DIR, name, "owner").is_file()
            and Path(SESSIONS_DIR, name, "owner").read_text().startswith(mine)}


def test_the_start_is_profiled_phase_by_phase(session: GvisorSession) -> None:
    assert session.start_phases is not None
    ends = session.start_phases.ends
    assert list(ends) == ["probed", "reaped", "staged", "launched", "ready", "attested"]
    assert list(ends.values()) == sorted(ends.values())


def test_a_forged_frame_on_the_helpers_descriptors_never_becomes_a_result(
        session: GvisorSession) -> None:
    forged = '{"op":"exit","id":99,"code":0,"timed_out":false,"duration_s":0}'
    result = session.exec(
        f"for fd in /proc/1/fd/*; do printf '%s\\n' '{forged}' > \"$fd\" && echo opened $fd; "
        "done 2>/dev/null; exit 3")
    assert result.exit_code == 3
    assert "opened" not in result.stdout.text()
    # The session is whole afterwards: the next command gets its own answer.
    assert session.exec("echo on").stdout.text() == "on\n"


def test_everyday_tools_work_on_the_read_only_root(session: GvisorSession) -> None:
    done = session.exec("ls -l / >/dev/null && stat /etc/passwd >/dev/null && "
                        "git --version >/dev/null && python3 -m venv --without-pip v && echo ok")
    assert (done.exit_code, done.stdout.text()) == (0, "ok\n"), done.stderr.text()
    refused = session.exec("touch /usr/firstrun-gvisor-x")
    assert refused.exit_code != 0 and not os.path.exists("/usr/firstrun-gvisor-x")


def _host_processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _cgroups_of(container_id: str) -> list[str]:
    return [str(p) for p in Path("/sys/fs/cgroup").glob(f"*{CGROUP_PARENT}/{container_id}")]


@pytest.mark.skipif(os.geteuid() != 0, reason="the gvisor backend runs as root")
def test_after_a_sigkilled_harness_the_next_start_leaves_nothing_behind(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "mine").write_text("the owner's file\n")
    before = set(os.listdir(SESSIONS_DIR)) if os.path.isdir(SESSIONS_DIR) else set()
    # A SIGKILLed harness leaves its private temporary directories: keep them here.
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen(
        [str(FIRSTRUN), "sandbox", "--backend", "gvisor", "--workspace", str(workspace), "--",
         "sh", "-c", "touch started; (setsid sleep 600 &); sleep 600"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    deadline = time.monotonic() + 120
    while not (workspace / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    [container_id] = set(os.listdir(SESSIONS_DIR)) - before
    lent = os.stat(workspace).st_uid
    assert lent != 0 and _host_processes_naming(container_id)
    proc.kill()
    proc.wait()
    later = subprocess.run([str(FIRSTRUN), "sandbox", "--backend", "gvisor", "--", "true"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert later.returncode == 0, later.stderr
    assert not os.path.exists(os.path.join(SESSIONS_DIR, container_id))
    assert _host_processes_naming(container_id) == []
    assert _cgroups_of(container_id) == []
    assert {os.lstat(p).st_uid for p in (workspace, *workspace.rglob("*"))} == {0}
    assert (workspace / "mine").read_text() == "the owner's file\n"
    assert not any(json.loads(p.read_text())["workspace"] == str(workspace)
                   for p in Path(LEASE_DIR).glob("*.json"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_mid_command_ends_the_sandbox_and_leaves_nothing(
        tmp_path: Path, signum: int) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    before = set(os.listdir(SESSIONS_DIR)) if os.path.isdir(SESSIONS_DIR) else set()
    proc = subprocess.Popen(
        [str(FIRSTRUN), "sandbox", "--backend", "gvisor", "--workspace", str(workspace), "--",
         "sh", "-c", "touch started; sleep 600"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (workspace / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    [container_id] = set(os.listdir(SESSIONS_DIR)) - before
    proc.send_signal(signum)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum
    assert _host_processes_naming(container_id) == []
    assert not os.path.exists(os.path.join(SESSIONS_DIR, container_id))
    assert _cgroups_of(container_id) == []


def test_node_fetch_which_ignores_the_proxy_variables_passes_by_capture(tmp_path: Path) -> None:
    # Control for the capture: node's fetch reads no proxy variable, so
    # without the sentry's nat rules this run failed and read as docs_gap.
    out = tmp_path / "out"
    done = subprocess.run([str(FIRSTRUN), "run", "--example", "node-fetch", "--agent", "replay",
                           "--backend", "gvisor", "--out", str(out)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "does not capture" not in done.stderr
    [run] = json.loads((out / "results.json").read_text())["runs"]
    assert (run["classification"], run["backend"]) == ("passed", "gvisor"), run
    assert {c["name"] for c in run["attestation"]} >= {"capture_in_force", "kernel_not_the_hosts"}
    trace = [json.loads(line) for line in (out / run["trace"]).read_text().splitlines()]
    registry = [e["record"] for e in trace if e["kind"] == "egress"
                and e["record"]["host"] == "registry.npmjs.org"]
    assert registry and {r["capture"] for r in registry} == {"transparent"}, registry
