#!/usr/bin/env python3
"""One small HTTP client for every arm of the proxy benches, so each ratio compares like with like.

Guarantee: every arm of a comparison runs this same code in its own
process (never in the process whose thread runs firstrun's proxy, so the
two never share a GIL); the arms differ only in the ``via`` of their spec:

- ``direct``: origin-form GETs straight to the origin;
- ``absolute``: absolute-form GETs to a proxy, as a client configured with
  a proxy sends plain HTTP;
- ``connect``: a CONNECT to the origin's ``host:port`` through a proxy, then
  origin-form GETs in the tunnel, each with a Host naming the CONNECT target;
- ``tls``: the same CONNECT, then TLS in the tunnel (SNI the origin's name,
  trusting only ``cafile``), then origin-form GETs inside it.

Every response must be ``200`` with exactly the expected body, or the client
exits non-zero. Role ``first`` opens a new connection per request and times
each one from the TCP connect to the last byte of the response, close
included; role ``keepalive`` sends GETs one after another on one connection
(set up before the clock starts) and counts them. Both wait until
``start_at`` (``time.monotonic``, shared by all processes) so concurrent
clients start together, and stop at ``count`` requests or ``seconds``
after the start, whichever comes first. ``launch`` runs the processes, each
bounded by a timeout and killed by its pid if it outlives it.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

START_DELAY_S = 1.0
TIMEOUT_S = 10.0
_HERE = Path(__file__).resolve()


class _Reader:
    """Reads whole responses off one socket, keeping bytes that arrived early."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise SystemExit(f"connection closed mid-response after {self.buf[:200]!r}")
        self.buf += chunk

    def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
            raise SystemExit(f"not a 200: {head[:300]!r}")
        return head

    def response(self, body: bytes) -> None:
        head = self.head()
        length = None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length != len(body):
            raise SystemExit(f"unexpected response head: {head[:300]!r}")
        while len(self.buf) < length:
            self._more()
        got, self.buf = self.buf[:length], self.buf[length:]
        if got != body:
            raise SystemExit("unexpected response body")


def _open(spec: dict[str, Any]) -> tuple[socket.socket, _Reader, bytes]:
    """A ready connection for ``spec``'s arm, its reader, and the request to send on it."""
    via, host, port = spec["via"], spec["host"], spec["port"]
    authority = f"{host}:{port}"
    address = ("127.0.0.1", port) if via == "direct" else tuple(spec["proxy"])
    sock = socket.create_connection(address, timeout=TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = _Reader(sock)
    target = f"http://{authority}{spec['path']}" if via == "absolute" else spec["path"]
    request = f"GET {target} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
    if via in ("connect", "tls"):
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        reader.head()
        if reader.buf:
            raise SystemExit(f"bytes after the CONNECT reply: {reader.buf[:100]!r}")
    if via == "tls":
        ctx = ssl.create_default_context(cafile=spec["cafile"])
        ctx.set_alpn_protocols(["http/1.1"])
        sock = ctx.wrap_socket(sock, server_hostname=host)
        reader.sock = sock
    return sock, reader, request


def _wait(start_at: float) -> None:
    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def first(spec: dict[str, Any]) -> dict[str, Any]:
    body = spec["body"].encode()
    latencies: list[float] = []
    _wait(spec["start_at"])
    start = time.monotonic()
    deadline = start + spec["seconds"]
    while len(latencies) < spec["count"] and time.monotonic() < deadline:
        t0 = time.perf_counter()
        sock, reader, request = _open(spec)
        with sock:
            sock.sendall(request)
            reader.response(body)
        latencies.append(time.perf_counter() - t0)
    return {"latencies": latencies, "start": start, "end": time.monotonic()}


def keepalive(spec: dict[str, Any]) -> dict[str, Any]:
    body = spec["body"].encode()
    sock, reader, request = _open(spec)
    with sock:
        _wait(spec["start_at"])
        start = time.monotonic()
        deadline = start + spec["seconds"]
        done = 0
        while done < spec["count"] and time.monotonic() < deadline:
            sock.sendall(request)
            reader.response(body)
            done += 1
        end = time.monotonic()
    return {"requests": done, "start": start, "end": end}


ROLES = {"first": first, "keepalive": keepalive}


def launch(role: str, spec: dict[str, Any], processes: int) -> list[dict[str, Any]]:
    """Run ``processes`` clients of ``role`` at once on ``spec``; each one's result."""
    spec = {**spec, "start_at": time.monotonic() + START_DELAY_S}
    argv = [sys.executable, str(_HERE), role, json.dumps(spec)]
    children = [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    limit = time.monotonic() + START_DELAY_S + spec["seconds"] + 30
    for child in children:
        try:
            out, err = child.communicate(timeout=max(limit - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            failures.append(f"timed out: {err.strip()[-300:]}")
            continue
        if child.returncode != 0:
            failures.append(f"exit {child.returncode}: {err.strip()[-300:]}")
        else:
            results.append(json.loads(out))
    if failures:
        raise RuntimeError(f"{role} client via {spec['via']} failed: {'; '.join(failures)}")
    return results


if __name__ == "__main__":
    print(json.dumps(ROLES[sys.argv[1]](json.loads(sys.argv[2]))))
