"""The harness's end of a command channel to a supervisor inside a sandbox.

Guarantee: every message is one JSON object per line, read with a deadline,
and anything else (a non-object, bad JSON) is a ``ValueError``; a closed
channel reads as ``None``. ``run_command`` sends one ``exec`` request and
returns only on that command's ``exit``, having capped its output, or raises:
the backends that speak this protocol (the linux helper inside bubblewrap,
the micro-VM's guest agent) share one reading of it.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable

from firstrun.errors import SandboxError
from firstrun.sandbox.base import ExecResult, OutputCallback, Stream
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
        msg = json.loads(line)
        # The other end runs beside untrusted code: anything but an object is
        # a broken channel.
        if not isinstance(msg, dict):
            raise ValueError(f"{self.peer} sent {type(msg).__name__}, not an object")
        return msg


def run_command(channel: JsonLines, request: dict[str, object], *, deadline: float,
                output_bytes: int, on_output: OutputCallback | None,
                ended: Callable[[], SandboxError]) -> ExecResult:
    """Send ``request`` (an ``exec`` with its ``id``) and collect that command's output and exit.

    ``ended`` makes the error for a channel that closed mid-command (the
    sandbox died). Messages for other ids are skipped. Malformed messages
    raise ``ValueError``/``KeyError``/``TypeError`` for the caller, who owns
    the sandbox and decides how to end it.
    """
    cmd_id = request["id"]
    outputs = {Stream.STDOUT: OutputCapture(output_bytes),
               Stream.STDERR: OutputCapture(output_bytes)}
    channel.send(request)
    while True:
        msg = channel.recv(deadline)
        if msg is None:
            raise ended()
        if msg.get("id") != cmd_id:
            continue
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
