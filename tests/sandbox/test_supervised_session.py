"""A supervised session over a real socket pair: what it does when the supervisor breaks.

The supervisor here is the test's thread at the other end of the channel,
so each way a supervisor can fail (a missing field, a non-object, a wrong
type, a channel that closes mid-command) is sent for real. The backends'
own supervisors (the linux helper, the guest agent) are tested live in
their own suites; this pins the one reading of the channel they share.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest

from firstrun.errors import SandboxError
from firstrun.sandbox.base import Enforcement, SessionInfo
from firstrun.sandbox.channel import JsonLines, SupervisedSession, wait_for_exit
from support.profiles import make_profile

INFO = SessionInfo(backend="test", enforcement=Enforcement.ENFORCED, policy_hash="0")


class _Session(SupervisedSession):
    who = "test"
    exec_grace_s = 30.0
    close_grace_s = 5.0

    def __init__(self, sock: socket.socket, workspace: str) -> None:
        super().__init__(channel=JsonLines(sock, peer="the test supervisor"), env={},
                         profile=make_profile(workspace), info=INFO)
        self.calls: list[str] = []

    def _ended_detail(self) -> str:
        return "the supervisor went away"

    def _end(self) -> None:
        self.calls.append("end")

    def _teardown(self) -> None:
        self.calls.append("teardown")

    def _restore(self) -> None:
        self.calls.append("restore")


Reply = Callable[[socket.socket, dict], None]


@pytest.fixture
def supervised(tmp_path) -> Iterator[Callable[[Reply], _Session]]:  # type: ignore[no-untyped-def]
    threads: list[threading.Thread] = []
    socks: list[socket.socket] = []

    def make(reply: Reply) -> _Session:
        ours, theirs = socket.socketpair()
        socks.extend((ours, theirs))

        def serve() -> None:
            with theirs.makefile("rb") as lines:
                for line in lines:
                    reply(theirs, json.loads(line))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return _Session(ours, str(tmp_path))

    yield make
    for sock in socks:
        sock.close()
    for thread in threads:
        thread.join(timeout=10)


def _send(sock: socket.socket, payload: object) -> None:
    sock.sendall(json.dumps(payload).encode() + b"\n")


def test_a_well_formed_exchange_returns_the_result(supervised) -> None:  # type: ignore[no-untyped-def]
    def reply(sock: socket.socket, msg: dict) -> None:
        if msg["op"] == "exec":
            _send(sock, {"id": msg["id"], "op": "out", "stream": "stdout", "data": "aGk="})
            _send(sock, {"id": msg["id"], "op": "exit", "code": 0, "duration_s": 0.1,
                         "timed_out": False})
        elif msg["op"] == "shutdown":
            _send(sock, {"op": "closed"})

    session = supervised(reply)
    result = session.exec("echo hi")
    assert (result.exit_code, result.stdout.data) == (0, b"hi")
    session.close()
    assert session.calls == ["teardown", "restore"]


@pytest.mark.parametrize("bad", [
    {"op": "out"},                                        # no stream, no data
    {"op": "exit", "code": "x", "duration_s": 0, "timed_out": False},  # not a number
    {"op": "out", "stream": "stdout", "data": 5},        # wrong type
])
def test_a_malformed_reply_ends_the_sandbox_and_says_who(supervised, bad: dict) -> None:  # type: ignore[no-untyped-def]
    def reply(sock: socket.socket, msg: dict) -> None:
        if msg["op"] == "exec":
            _send(sock, {"id": msg["id"], **bad})

    session = supervised(reply)
    with pytest.raises(SandboxError, match="lost the test supervisor") as caught:
        session.exec("true")
    assert caught.value.who == "test"
    assert session.calls == ["end"]


def test_a_line_that_is_not_json_ends_the_sandbox(supervised) -> None:  # type: ignore[no-untyped-def]
    session = supervised(lambda sock, msg: sock.sendall(b"{'id': 1}\n"))
    with pytest.raises(SandboxError, match="the test supervisor sent a line that is not JSON"):
        session.exec("true")
    assert session.calls == ["end"]


def test_a_non_object_ends_the_sandbox(supervised) -> None:  # type: ignore[no-untyped-def]
    session = supervised(lambda sock, msg: _send(sock, [msg["id"]]))
    with pytest.raises(SandboxError, match="sent list, not an object"):
        session.exec("true")
    assert session.calls == ["end"]


def test_a_channel_closed_mid_command_says_why_the_sandbox_ended(supervised) -> None:  # type: ignore[no-untyped-def]
    session = supervised(lambda sock, msg: sock.shutdown(socket.SHUT_WR))
    with pytest.raises(SandboxError, match="the supervisor went away"):
        session.exec("true")


def test_close_restores_even_when_the_supervisor_is_silent(supervised) -> None:  # type: ignore[no-untyped-def]
    session = supervised(lambda sock, msg: sock.shutdown(socket.SHUT_WR))
    session.close()
    session.close()
    assert session.calls == ["teardown", "restore"]
    with pytest.raises(SandboxError, match="session is closed"):
        session.exec("true")


def _exit(sock: socket.socket, msg: dict) -> None:
    _send(sock, {"id": msg["id"], "op": "exit", "code": 0, "duration_s": 0.1, "timed_out": False})


def test_beats_keep_a_long_command_alive_past_the_liveness_limit(supervised) -> None:  # type: ignore[no-untyped-def]
    def reply(sock: socket.socket, msg: dict) -> None:
        if msg["op"] == "exec":
            for _ in range(4):
                threading.Event().wait(0.1)
                _send(sock, {"id": msg["id"], "op": "alive"})
            _exit(sock, msg)

    session = supervised(reply)
    session.liveness_s = 0.3
    assert session.exec("sleep 1").exit_code == 0
    assert session.calls == []


def test_a_silent_supervisor_is_lost_at_the_liveness_limit_not_the_command_timeout(
        supervised) -> None:  # type: ignore[no-untyped-def]
    # A supervisor a command stopped with SIGSTOP sends nothing at all; the
    # command's own timeout (an hour here) is not what ends the wait.
    session = supervised(lambda sock, msg: None)
    session.liveness_s = 0.3
    with pytest.raises(SandboxError, match="sent nothing for 0.3s"):
        session.exec("sleep 3600", timeout=3600)
    assert session.calls == ["end"]


def test_an_error_from_the_supervisor_ends_the_sandbox(supervised) -> None:  # type: ignore[no-untyped-def]
    session = supervised(lambda sock, msg: _send(
        sock, {"id": msg["id"], "op": "error", "error": "cannot drop to the session's uid"}))
    with pytest.raises(SandboxError, match="cannot drop to the session's uid"):
        session.exec("true")
    assert session.calls == ["end"]


def test_an_exec_cut_short_ends_the_sandbox_and_close_waits_for_no_answer(
        supervised) -> None:  # type: ignore[no-untyped-def]
    # Ctrl-C or SIGTERM in the middle of a command: the supervisor is busy with
    # it and would answer a shutdown only once it ends, so close must not ask.
    seen: list[str] = []

    def interrupted(stream: object, data: bytes) -> None:
        raise KeyboardInterrupt

    def feed(sock: socket.socket, msg: dict) -> None:
        seen.append(msg["op"])
        if msg["op"] == "exec":
            _send(sock, {"id": msg["id"], "op": "out", "stream": "stdout", "data": "aGk="})

    session = supervised(feed)
    with pytest.raises(KeyboardInterrupt):
        session.exec("sleep 600", on_output=interrupted)
    session.close()
    assert session.calls == ["end", "teardown", "restore"]
    assert seen == ["exec"]


def test_kill_all_reports_the_supervisors_count_and_the_session_goes_on(
        supervised) -> None:  # type: ignore[no-untyped-def]
    def reply(sock: socket.socket, msg: dict) -> None:
        if msg["op"] == "kill_all":
            _send(sock, {"id": msg["id"] - 1, "op": "killed", "count": 99})  # not this request
            _send(sock, {"id": msg["id"], "op": "killed", "count": 3})
        elif msg["op"] == "exec":
            _exit(sock, msg)

    session = supervised(reply)
    assert session.kill_all() == 3
    assert session.exec("true").exit_code == 0


def test_waiting_for_a_process_reaps_it_when_it_exits_and_not_before() -> None:
    exits = subprocess.Popen(["sh", "-c", "sleep 0.2"])
    assert wait_for_exit(exits, 30.0) and exits.returncode == 0
    lingers = subprocess.Popen(["sleep", "60"])
    try:
        assert not wait_for_exit(lingers, 0.05) and lingers.returncode is None
    finally:
        lingers.kill()
        lingers.wait()
