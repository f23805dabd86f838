"""Each real backend's readers of its supervisor, fed garbage over a socket pair.

The linux helper, the docker run container's helper and the micro-VM's
guest agent run beside untrusted code, so whatever they send is read as if
hostile: a line that is not JSON, JSON that is not an object, an object
with a field missing or of the wrong type, an op nobody knows. Each must end
as a ``SandboxError`` naming the backend (and, mid-session, end the
sandbox), never escape as a bare ``KeyError``, ``TypeError`` or
``ValueError``. The sessions here are each backend's own session class and
ready reader, with a harmless process in place of the sandbox and the
test's thread as the supervisor; ``test_supervised_session`` pins the
protocol they share, and ``tests/docker/test_sidecar_reader.py`` docker's
other reader, of its proxy sidecar.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from firstrun.errors import SandboxError
from firstrun.sandbox.base import Enforcement, SessionInfo
from firstrun.sandbox.channel import SupervisedSession
from firstrun.sandbox.docker import backend as docker_backend
from firstrun.sandbox.docker.topology import Topology
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession
from firstrun.sandbox.microvm import backend as microvm_backend
from support.profiles import make_profile

BACKENDS = ("linux", "docker", "microvm")

# A reply to the command in flight (its id filled in), or raw bytes sent as they are.
Garbage = dict[str, object] | bytes

COMMAND_GARBAGE: dict[str, Garbage] = {
    "not json": b"{'op': 'exit'}\n",
    "not an object": b"[1, 2]\n",
    "no op": {},
    "exit without its code": {"op": "exit", "duration_s": 0, "timed_out": False},
    "exit with a code that is not a number": {"op": "exit", "code": "zero", "duration_s": 0,
                                             "timed_out": False},
    "output on no known stream": {"op": "out", "stream": "sideways", "data": ""},
    "output that is not base64 text": {"op": "out", "stream": "stdout", "data": 5},
    "an unknown op": {"op": "teleport"},
}

KILL_GARBAGE: dict[str, Garbage] = {
    "not json": b"killed\n",
    "not an object": b'"killed"\n',
    "killed without its count": {"op": "killed"},
    "a count that is not a number": {"op": "killed", "count": [3]},
    "an unknown op": {"op": "teleport"},
}

READY_GARBAGE: dict[str, bytes] = {
    "not json": b"ready\n",
    "not an object": b"true\n",
    "no ok": b"{}\n",
    "an ill-typed error": b'{"ok": false, "error": {"why": 1}}\n',
    "an unknown op": b'{"op": "teleport"}\n',
}


def _info(name: str) -> SessionInfo:
    return SessionInfo(backend=name, enforcement=Enforcement.ENFORCED, policy_hash="0")


def _session(name: str, sock: socket.socket, workspace: str, stack: ExitStack, *,
             alive: bool) -> tuple[SupervisedSession, subprocess.Popen[bytes]]:
    # The sandbox's stand-in, which the session kills when it ends the sandbox:
    # running, or (a sandbox that never started) already gone, so that closing
    # the session waits for nothing.
    process = subprocess.Popen(["sleep", "600"] if alive else ["true"])
    stack.callback(process.wait)
    stack.callback(process.kill)
    scratch = stack.enter_context(tempfile.TemporaryFile())
    profile = make_profile(workspace)
    session: SupervisedSession
    if name == "linux":
        session = LinuxSession(process=process, control=sock, env={}, profile=profile,
                               info=_info(name), sandbox_uid=None, stderr_file=scratch,
                               session_cgroup=None, cleanup=ExitStack())
    elif name == "docker":
        # ``docker kill`` of the run container goes to /bin/true: no daemon is touched.
        session = docker_backend.DockerSession(
            topology=Topology(session="firstrun-test", internal_network="", egress_network="",
                              sidecar="", run="firstrun-test-run", create=()),
            profile=profile, env={}, info=_info(name), attach=process, control=sock,
            attach_stderr=scratch, docker_bin="/bin/true", cleanup=ExitStack())
    else:
        session = microvm_backend.MicrovmSession(
            process=process, channel=sock, env={}, profile=profile, info=_info(name),
            console=scratch, relay=None, cleanup=ExitStack())
    return session, process


def _send(sock: socket.socket, garbage: Garbage, request: dict) -> None:
    if isinstance(garbage, bytes):
        sock.sendall(garbage)
    else:
        sock.sendall(json.dumps({"id": request["id"], **garbage}).encode() + b"\n")


Serve = Callable[[socket.socket], None]
Started = tuple[SupervisedSession, subprocess.Popen[bytes], socket.socket]


@pytest.fixture
def supervised(tmp_path) -> Iterator[Callable[..., Started]]:  # type: ignore[no-untyped-def]
    """A backend's session (and the socket it reads) whose supervisor is ``serve``, run on the
    other end of a socket pair."""
    threads: list[threading.Thread] = []
    with ExitStack() as stack:

        def make(name: str, serve: Serve, *, alive: bool = True) -> Started:
            ours, theirs = socket.socketpair()
            stack.callback(theirs.close)
            # Closed before the supervisor's end, so its thread reads EOF and returns.
            stack.callback(ours.close)
            thread = threading.Thread(target=serve, args=(theirs,), daemon=True)
            thread.start()
            threads.append(thread)
            session, process = _session(name, ours, str(tmp_path), stack, alive=alive)
            stack.callback(session.close)
            return session, process, ours

        yield make
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive()


def _answering(op: str, garbage: Garbage) -> Serve:
    """A supervisor that answers the first ``op`` request with ``garbage``, then only listens."""
    def serve(sock: socket.socket) -> None:
        with sock.makefile("rb") as lines:
            for line in lines:
                request = json.loads(line)
                if request["op"] == op:
                    _send(sock, garbage, request)
    return serve


def _lost(failed: pytest.ExceptionInfo[SandboxError], name: str, session: SupervisedSession,
          process: subprocess.Popen[bytes]) -> None:
    assert failed.type is SandboxError
    assert failed.value.who == name
    assert f"lost {session._channel.peer}" in str(failed.value)
    # The sandbox was ended there and then, not left running unsupervised.
    assert process.poll() is not None


@pytest.mark.parametrize("garbage", COMMAND_GARBAGE.values(), ids=COMMAND_GARBAGE.keys())
@pytest.mark.parametrize("name", BACKENDS)
def test_a_command_answered_with_garbage_ends_the_sandbox_naming_the_backend(
        supervised, name: str, garbage: Garbage) -> None:  # type: ignore[no-untyped-def]
    session, process, _ = supervised(name, _answering("exec", garbage))
    # An op nobody knows is skipped like a beat; what ends it is the silence after.
    session.liveness_s = 0.5
    with pytest.raises(SandboxError) as failed:
        session.exec("true", timeout=60)
    _lost(failed, name, session, process)


@pytest.mark.parametrize("garbage", KILL_GARBAGE.values(), ids=KILL_GARBAGE.keys())
@pytest.mark.parametrize("name", BACKENDS)
def test_kill_all_answered_with_garbage_ends_the_sandbox_naming_the_backend(
        supervised, name: str, garbage: Garbage) -> None:  # type: ignore[no-untyped-def]
    session, process, _ = supervised(name, _answering("kill_all", garbage))
    session.kill_all_s = 0.5
    with pytest.raises(SandboxError) as failed:
        session.kill_all()
    _lost(failed, name, session, process)


def _ready_reader(name: str) -> Callable[[SupervisedSession, socket.socket], object]:
    """The backend's own reading of its supervisor's first line, before any command."""
    if name == "linux":
        return lambda session, sock: LinuxBackend()._await_ready(session, sock)  # type: ignore[arg-type]
    if name == "docker":
        return lambda session, sock: docker_backend._await_ready(sock, tempfile.TemporaryFile())
    return lambda session, sock: microvm_backend.MicrovmBackend._boot(
        session, sock, {}, "kvm")  # type: ignore[arg-type]


def _greeting(garbage: bytes, *, agent: bool) -> Serve:
    """A supervisor whose ready line is ``garbage`` (the guest agent's once it has its source
    and configuration), and which then hangs up."""
    def serve(sock: socket.socket) -> None:
        with sock.makefile("rb") as lines:
            if agent:
                lines.read(int(lines.readline()))
                lines.readline()
            sock.sendall(garbage)
            sock.shutdown(socket.SHUT_WR)
            lines.read()
    return serve


@pytest.mark.parametrize("garbage", READY_GARBAGE.values(), ids=READY_GARBAGE.keys())
@pytest.mark.parametrize("name", BACKENDS)
def test_a_ready_line_that_is_garbage_is_a_sandbox_that_did_not_start(
        supervised, name: str, garbage: bytes) -> None:  # type: ignore[no-untyped-def]
    session, _, sock = supervised(name, _greeting(garbage, agent=name == "microvm"), alive=False)
    with pytest.raises(SandboxError) as failed:
        _ready_reader(name)(session, sock)
    assert failed.type is SandboxError
    assert failed.value.who == name
