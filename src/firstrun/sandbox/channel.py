"""The harness's end of a command channel to a supervisor inside a sandbox.

Guarantee: every message is one JSON object per line, read with a deadline;
anything else is a ``ValueError``, and a closed channel reads as ``None``.
``run_command`` returns only on its command's ``exit``, output capped, or raises.
A ``SupervisedSession`` whose supervisor is gone, talks nonsense, falls silent
for ``liveness_s`` or is cut short mid-``exec`` (Ctrl-C, SIGTERM) ends the
sandbox at once; the first three raise a ``SandboxError`` naming the backend.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Self

from firstrun.errors import SandboxError
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.base import (
    ExecResult,
    OutputCallback,
    SessionInfo,
    StartPhases,
    Stream,
    prepare_command,
)
from firstrun.sandbox.output import OutputCapture


class JsonLines:
    """JSON lines over a stream socket; ``peer`` names the other end in errors."""

    def __init__(self, sock: socket.socket, *, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.buf = b""

    def send(self, msg: dict[str, object]) -> None:
        self.sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")

    def recv(self, deadline: float) -> dict | None:
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.peer} did not answer in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return decode_message(line, peer=self.peer)


def decode_message(line: bytes | str, *, peer: str) -> dict:
    """One supervisor message: a JSON object, else ``ValueError`` naming ``peer``.

    Every supervisor's lines are read with this (the helper, the docker
    helper and sidecar, the guest agent): the other end runs beside
    untrusted code, so anything but an object is a broken channel.
    """
    try:
        msg = json.loads(line)
    except ValueError:
        raise ValueError(f"{peer} sent a line that is not JSON: {line[:80]!r}") from None
    if not isinstance(msg, dict):
        raise ValueError(f"{peer} sent {type(msg).__name__}, not an object")
    return msg


def wait_for_exit(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Reap ``process`` if it exits within ``timeout``; whether it did.

    Woken by the exit itself (a pidfd): ``Popen.wait`` with a timeout polls
    with sleeps that double up to 50 ms, which a session's close paid on
    every start of a one-shot command.
    """
    if process.poll() is not None:
        return True
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    return process.poll() is not None


def kill_and_wait(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` if it still runs, and reap it: a session's undo for the process it
    launched (bubblewrap, runsc, docker's attach client, QEMU)."""
    if process.poll() is None:
        process.kill()
    process.wait()


class Silent(TimeoutError):
    """The supervisor said nothing for longer than its heartbeat allows."""


def _recv_live(channel: JsonLines, deadline: float, liveness_s: float | None) -> dict | None:
    if liveness_s is None:
        return channel.recv(deadline)
    beat_deadline = time.monotonic() + liveness_s
    try:
        return channel.recv(min(deadline, beat_deadline))
    except TimeoutError:
        if beat_deadline < deadline:
            raise Silent(f"{channel.peer} sent nothing for {liveness_s:g}s (stopped or hung)") \
                from None
        raise


# One reading of the protocol, shared by every backend that speaks it: the helper inside
# bubblewrap, in gVisor and as the docker run container's pid 1, and the micro-VM's guest
# agent.
def run_command(channel: JsonLines, request: dict[str, object], *, deadline: float,
                output_bytes: int, on_output: OutputCallback | None,
                ended: Callable[[], SandboxError], liveness_s: float | None = None) -> ExecResult:
    """Send ``request`` (an ``exec`` with its ``id``) and collect that command's output and exit.

    ``ended`` makes the error for a channel that closed mid-command (the
    sandbox died). Messages for other ids are skipped, and so are ``alive``
    beats, each of which renews the ``liveness_s`` the supervisor has to
    say something. Malformed messages, silence and an ``error`` (the
    supervisor could not start the command as it must) raise
    ``ValueError``/``KeyError``/``TypeError``/``TimeoutError`` for the
    caller, who owns the sandbox and decides how to end it.
    """
    cmd_id = request["id"]
    outputs = {Stream.STDOUT: OutputCapture(output_bytes),
               Stream.STDERR: OutputCapture(output_bytes)}
    channel.send(request)
    while True:
        msg = _recv_live(channel, deadline, liveness_s)
        if msg is None:
            raise ended()
        if msg.get("id") != cmd_id:
            continue
        if msg["op"] == "error":
            raise ValueError(f"{channel.peer} failed: {msg.get('error')}")
        if msg["op"] == "out":
            stream = Stream(msg["stream"])
            data = base64.b64decode(msg["data"])
            outputs[stream].add(data)
            if on_output is not None:
                on_output(stream, data)
        elif msg["op"] == "exit":
            return ExecResult(
                exit_code=int(msg["code"]),
                stdout=outputs[Stream.STDOUT].result(),
                stderr=outputs[Stream.STDERR].result(),
                duration_s=float(msg["duration_s"]),
                timed_out=bool(msg["timed_out"]),
            )


# What a broken channel raises: a closed or timed-out socket, bad JSON or a
# non-object, a message missing a field or with one of the wrong type.
_BROKEN = (OSError, ValueError, KeyError, TypeError)


class SupervisedSession(ABC):
    """A session whose commands a supervisor inside the sandbox runs, over one channel.

    A subclass calls ``__init__`` and provides ``_ended_detail`` (what says
    why the sandbox died), ``_end`` (take it down now, idempotent),
    ``_teardown`` (after the supervisor was asked to stop) and ``_restore``
    (give the host back what the session borrowed).
    """

    who: str
    # How long past its own timeout a command may take before the supervisor
    # is taken for lost (it reports the kill itself well within this).
    exec_grace_s: float = 30.0
    # How long the supervisor gets to end every process and exit after ``shutdown``.
    close_grace_s: float = 5.0
    # How long the supervisor may stay silent while a command runs (it beats
    # every second); None for a supervisor that sends no beats.
    liveness_s: float | None = 10.0
    # How long ``kill_all`` may take: a fork bomb is killed round by round.
    kill_all_s: float = 60.0
    # Where the start went, phase by phase, once the backend's start returned.
    start_phases: StartPhases | None = None

    def __init__(self, *, channel: JsonLines, env: dict[str, str], profile: SandboxProfile,
                 info: SessionInfo) -> None:
        self.info = info
        self._channel = channel
        self._env = env
        self._profile = profile
        self._lock = threading.Lock()
        self._next_id = 0
        self._closed = False
        self._ended = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _ended_detail(self) -> str:
        """Why the sandbox ended under a running command, for its error."""

    @abstractmethod
    def _end(self) -> None:
        """Take the sandbox down now; safe to call more than once."""

    @abstractmethod
    def _teardown(self) -> None:
        """Stop the sandbox for good, after its supervisor was asked to."""

    @abstractmethod
    def _restore(self) -> None:
        """Give back what the session borrowed from the host (ownership, directories)."""

    def exec(self, command: str | Sequence[str], *, cwd: str | None = None,
             timeout: float | None = None, env: dict[str, str] | None = None,
             on_output: OutputCallback | None = None) -> ExecResult:
        cmd = prepare_command(command, cwd=cwd, timeout=timeout, env=env, session_env=self._env,
                              workspace=self._profile.fs.sandbox_workspace,
                              default_timeout=self._profile.limits.command_timeout_s,
                              who=self.who)
        with self._lock:
            if self._closed:
                raise SandboxError("session is closed", who=self.who)
            self._next_id += 1
            try:
                return run_command(
                    self._channel,
                    {"op": "exec", "id": self._next_id, "argv": cmd.argv, "cwd": cmd.cwd,
                     "env": cmd.env, "timeout": cmd.timeout},
                    deadline=time.monotonic() + cmd.timeout + self.exec_grace_s,
                    output_bytes=self._profile.limits.output_bytes, on_output=on_output,
                    ended=lambda: SandboxError(self._ended_detail(), who=self.who),
                    liveness_s=self.liveness_s)
            except _BROKEN as exc:
                # A supervisor that stopped answering (a command may SIGSTOP
                # it) or answers nonsense supervises nothing: end the sandbox
                # now, not at close, so nothing runs on unsupervised meanwhile.
                self._end_now()
                raise SandboxError(f"lost {self._channel.peer}: {exc}", who=self.who) from exc
            except BaseException:
                # Cut short (Ctrl-C, SIGTERM): the supervisor is still running
                # the command and would answer nothing else until it ends.
                self._end_now()
                raise

    def kill_all(self) -> int:
        with self._lock:
            if self._closed or self._ended:
                raise SandboxError("session is closed", who=self.who)
            self._next_id += 1
            cmd_id = self._next_id
            try:
                self._channel.send({"op": "kill_all", "id": cmd_id})
                deadline = time.monotonic() + self.kill_all_s
                while (msg := self._channel.recv(deadline)) is not None:
                    if msg.get("op") == "killed" and msg.get("id") == cmd_id:
                        return int(msg["count"])
                raise SandboxError(self._ended_detail(), who=self.who)
            except _BROKEN as exc:
                self._end_now()
                raise SandboxError(f"lost {self._channel.peer}: {exc}", who=self.who) from exc
            except BaseException:
                self._end_now()
                raise

    def _end_now(self) -> None:
        self._ended = True
        self._end()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if not self._ended:
                try:
                    self._channel.send({"op": "shutdown"})
                    deadline = time.monotonic() + self.close_grace_s
                    while (msg := self._channel.recv(deadline)) is not None \
                            and msg.get("op") != "closed":
                        pass
                except _BROKEN:
                    pass
            self._teardown()
        finally:
            self._restore()
