"""Session behaviour on a real kernel: state, output, timeouts, teardown, identity, layers."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from sandbox_support import alive, host_processes_with

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.policy.filesystem import SYSTEM_READONLY
from firstrun.policy.process import Limits
from firstrun.policy.profile import LayerName
from firstrun.sandbox.base import Enforcement, Stream
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession
from firstrun.sandbox.linux.spec import PROXY_PORT
from firstrun.sandbox.select import select_backend
from support.profiles import make_profile


def test_state_persists_across_commands(session: LinuxSession) -> None:
    assert session.exec("echo kept > /tmp/state && echo home > ~/note").exit_code == 0
    result = session.exec("cat /tmp/state ~/note")
    assert result.stdout.text() == "kept\nhome\n"


def test_background_server_survives_between_commands(session: LinuxSession) -> None:
    server = (
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 8765)); s.listen(4)\n"
        "open('/tmp/ready', 'w').close()\n"
        "while True:\n"
        "    c, _ = s.accept(); c.sendall(b'pong'); c.close()\n"
    )
    started = session.exec(["python3", "-c", f"import os\nif os.fork() == 0:\n    os.setsid()\n"
                                            f"    exec({server!r})\n"])
    assert started.exit_code == 0
    result = session.exec(
        "while [ ! -e /tmp/ready ]; do sleep 0.01; done; "
        "python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', 8765)); "
        "print(s.recv(4).decode())\""
    )
    assert result.stdout.text().strip() == "pong"


def test_output_cap_keeps_head_and_tail(workspace: str) -> None:
    profile = make_profile(workspace, limits=Limits(output_bytes=1000))
    chunks: list[bytes] = []
    with LinuxBackend().start(profile, proxy=None) as s:
        result = s.exec("echo START; head -c 100000 /dev/zero | tr '\\0' x; echo; echo END",
                        on_output=lambda stream, data: chunks.append(data)
                        if stream is Stream.STDOUT else None)
    out = result.stdout
    assert out.truncated and len(out.data) == 1000
    assert out.total_bytes == len("START\n") + 100000 + 1 + len("END\n")
    assert out.omitted_bytes == out.total_bytes - 1000
    assert out.data.startswith(b"START\nxxx") and out.data.endswith(b"xxx\nEND\n")
    # on_output saw everything, live, uncapped.
    assert b"".join(chunks) == b"START\n" + b"x" * 100000 + b"\nEND\n"


def test_stdout_and_stderr_and_exit_code(session: LinuxSession) -> None:
    result = session.exec("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout.text(), result.stderr.text()) == (7, "out\n", "err\n")
    assert not result.timed_out


def test_command_that_cannot_start_is_a_failed_command(session: LinuxSession) -> None:
    result = session.exec(["/no/such/binary"])
    assert result.exit_code == 127
    assert session.exec("true").exit_code == 0


def test_timeout_kills_the_whole_tree_including_setsid_grandchild(session: LinuxSession,
                                                                  workspace: str) -> None:
    token = f"firstrun-gc-{os.getpid()}-{time.monotonic_ns()}"
    command = (
        f"setsid bash -c 'echo $$ > /workspace/gc.pid; exec -a {token} sleep 2; "
        f"touch /workspace/marker' & "
        "while [ ! -s /workspace/gc.pid ]; do sleep 0.01; done; sleep 100"
    )
    result = session.exec(command, timeout=1)
    assert result.timed_out
    gc_pid = open(os.path.join(workspace, "gc.pid")).read().strip()
    # Evidence: the grandchild is gone inside, and nothing carrying its token exists on the host.
    assert session.exec(f"test -e /proc/{gc_pid}").exit_code == 1
    assert host_processes_with(token) == []
    time.sleep(1.5)
    assert not os.path.exists(os.path.join(workspace, "marker"))


def test_timeout_spares_what_earlier_commands_started(session: LinuxSession) -> None:
    session.exec("(setsid sleep 1000 > /dev/null 2>&1 & echo $! > /tmp/bg.pid)")
    assert session.exec("sleep 100", timeout=0.5).timed_out
    assert session.exec("test -e /proc/$(cat /tmp/bg.pid)").exit_code == 0


def test_close_kills_double_forked_daemon(workspace: str) -> None:
    token = f"firstrun-daemon-{os.getpid()}-{time.monotonic_ns()}"
    s = LinuxBackend().start(make_profile(workspace), proxy=None)
    s.exec(f"(setsid bash -c 'exec -a {token} sleep 1000' > /dev/null 2>&1 &)")
    daemons = host_processes_with(token)
    assert len(daemons) == 1
    s.close()
    assert not alive(*daemons[0])
    assert host_processes_with(token) == []


def test_workspace_comes_back_owned_by_its_owner(workspace: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("ownership lending only happens when the harness is root")
    os.chown(workspace, 4321, 4322)
    with open(os.path.join(workspace, "given"), "w") as f:
        f.write("x")
    os.chown(os.path.join(workspace, "given"), 4321, 4322)
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        assert s.exec("mkdir -p sub/deep && touch sub/deep/f new && ln -s /etc/passwd link "
                      "&& echo y >> given").exit_code == 0
        # While the session runs, the sandbox uid owns the tree, not root nor the owner.
        assert os.stat(os.path.join(workspace, "new")).st_uid not in (0, 4321)
    for path in ("", "given", "new", "sub", "sub/deep", "sub/deep/f", "link"):
        st = os.lstat(os.path.join(workspace, path))
        assert (st.st_uid, st.st_gid) == (4321, 4322), path
    # lchown never followed the symlink out of the tree.
    assert os.stat("/etc/passwd").st_uid == 0


def test_home_is_fresh_and_environment_is_only_the_allowed_names(session: LinuxSession,
                                                                 workspace: str) -> None:
    result = session.exec("echo $HOME; ls -A $HOME | wc -l")
    assert result.stdout.text() == "/home/sandbox\n0\n"
    names = {line.split("=", 1)[0] for line in session.exec(["/usr/bin/env"]).stdout.text()
             .splitlines()}
    allowed = {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "SHELL",
               "PYTHONDONTWRITEBYTECODE", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
               "PIP_CERT", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"}
    # And where each lent toolchain lives (RUSTUP_HOME, PYENV_ROOT), from the policy.
    allowed |= {name for name, _ in make_profile(workspace).fs.toolchain_env}
    assert {"PATH", "HOME", "TMPDIR", "LANG", "TERM"} <= names <= allowed


def test_env_argument_adds_but_never_replaces(session: LinuxSession) -> None:
    result = session.exec("echo $EXTRA $HOME", env={"EXTRA": "added", "HOME": "/root"})
    assert result.stdout.text() == "added /home/sandbox\n"


def test_proxy_variables_point_at_the_relay(workspace: str, proxy) -> None:
    _, endpoint = proxy
    with LinuxBackend().start(make_profile(workspace), proxy=endpoint) as s:
        out = s.exec("echo $http_proxy $HTTPS_PROXY $ALL_PROXY $NO_PROXY").stdout.text()
    assert out.split() == [f"http://127.0.0.1:{PROXY_PORT}"] * 3 + ["localhost,127.0.0.1,::1"]


def test_session_info_records_everything(session: LinuxSession, workspace: str) -> None:
    info = session.info
    assert info.backend == "linux" and info.enforcement is Enforcement.ENFORCED
    assert info.policy_hash.startswith("sha256:")
    assert {layer.name for layer in info.layers} == set(LayerName)
    assert all(layer.applied for layer in info.layers)
    assert info.attestation and all(c.passed for c in info.attestation)
    assert info.downgrades == ()
    toolchains = set(make_profile(workspace).fs.readonly) - set(SYSTEM_READONLY)
    assert toolchains <= set(info.exposed)


def test_landlock_required_but_unavailable_refuses_to_start(workspace: str) -> None:
    # Asking for an ABI above the kernel's makes Landlock unavailable for real.
    owner = 4321 if os.geteuid() == 0 else os.geteuid()
    os.chown(workspace, owner, owner)
    with pytest.raises(SandboxUnavailable) as caught:
        LinuxBackend(landlock_min_abi=99).start(make_profile(workspace), proxy=None)
    assert caught.value.fix
    # Refused before anything ran, and the workspace was given back.
    assert os.stat(workspace).st_uid == owner


def test_landlock_downgrade_is_recorded_and_really_off(workspace: str) -> None:
    profile = make_profile(workspace, downgrades=frozenset({LayerName.LANDLOCK}))
    with LinuxBackend(landlock_min_abi=99).start(profile, proxy=None) as s:
        assert s.info.enforcement is Enforcement.DOWNGRADED
        assert s.info.downgrades == ("landlock",)
        layer = next(l for l in s.info.layers if l.name == LayerName.LANDLOCK)
        assert not layer.applied
        # Only Landlock stopped this write (the sandbox root belongs to the sandbox uid).
        assert s.exec("mkdir /unconfined").exit_code == 0
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        assert s.exec("mkdir /unconfined").exit_code != 0


def test_local_backend_is_refused_without_allow_unenforced() -> None:
    with pytest.raises(SandboxUnavailable):
        select_backend("local", allow_unenforced=False)


def test_local_backend_when_allowed_is_recorded_as_unenforced(workspace: str,
                                                              monkeypatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "local-canary-secret")
    backend = select_backend("local", allow_unenforced=True)
    with backend.start(make_profile(workspace), proxy=None) as s:
        assert s.info.enforcement is Enforcement.UNENFORCED
        assert s.info.layers and not any(layer.applied for layer in s.info.layers)
        result = s.exec("pwd; env")
    assert result.stdout.text().splitlines()[0] == os.path.realpath(workspace)
    assert "local-canary-secret" not in result.stdout.text()


def test_probe_reports_every_capability_with_fixes_when_missing() -> None:
    caps = LinuxBackend().probe()
    assert [c.name for c in caps] == ["user_namespaces", "bubblewrap", "landlock", "seccomp",
                                      "uid_switch", "session_limits", "capture"]
    assert all(c.available or c.fix for c in caps)


@pytest.mark.skipif(os.geteuid() != 0, reason="staging only happens when the harness is root")
def test_a_private_tmpdir_does_not_stop_the_sandbox_uid(tmp_path, monkeypatch) -> None:
    # pytest's own tmp_path parents are 0700: the dropped uid cannot walk them.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    workspace = private / "ws"
    workspace.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr("tempfile.tempdir", None)
    with LinuxBackend().start(make_profile(str(workspace)), proxy=None) as session:
        result = session.exec("echo reached > here && cat here")
    assert result.stdout.text() == "reached\n"
    assert (workspace / "here").stat().st_uid == os.geteuid()
    assert list(private.iterdir()) == [workspace]


def _helper_host_pid(session: LinuxSession) -> int:
    """The helper's pid on the host: the process of bubblewrap's tree that is pid 1 inside."""
    todo = [session._process.pid]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as f:
                nspid = next(line for line in f if line.startswith("NSpid:")).split()
        except (OSError, StopIteration):
            continue
        if len(nspid) > 2 and nspid[-1] == "1":
            return pid
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                todo += [int(c) for c in f.read().split()]
    raise AssertionError("no helper in the sandbox's process tree")


def test_a_command_cannot_stop_or_kill_the_helper(session: LinuxSession) -> None:
    # The helper shares the commands' uid, but it is its namespace's init: the
    # kernel drops every signal from inside that it has no handler for.
    result = session.exec("kill -STOP 1; kill -KILL 1; kill -INT 1; kill -STOP -1; sleep 1; "
                          "grep State /proc/1/status", timeout=30)
    assert result.exit_code == 0 and "(sleeping)" in result.stdout.text(), result
    with open(f"/proc/{_helper_host_pid(session)}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] in ("S", "R")
    assert session.exec("echo alive").stdout.text() == "alive\n"


def test_a_stopped_helper_is_detected_within_its_liveness_not_the_timeout(
        workspace: str) -> None:
    # Stopped from outside (the only place a stop can come from): without
    # beats the harness would wait out the command's hour-long timeout.
    with LinuxBackend().start(make_profile(workspace), proxy=None) as session:
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
        os.kill(_helper_host_pid(session), signal.SIGSTOP)
        worker.join(timeout=120)
        assert not worker.is_alive(), "the stopped helper went unnoticed"
        assert len(caught) == 1 and "sent nothing for 3s" in str(caught[0]), caught
        # Ended at once, not at close: nothing runs on unsupervised meanwhile.
        assert session._process.poll() is not None


def test_kill_all_ends_every_leftover_and_the_session_goes_on(session: LinuxSession) -> None:
    assert session.exec("setsid sleep 3301 >/dev/null 2>&1 < /dev/null & "
                        "(sleep 3302 &) >/dev/null 2>&1; sleep 3303 &").exit_code == 0
    assert session.kill_all() == 3
    assert "sleep 330" not in session.exec(["ps", "-eo", "args"]).stdout.text()
    assert session.kill_all() == 0
    assert session.exec("echo on").stdout.text() == "on\n"
