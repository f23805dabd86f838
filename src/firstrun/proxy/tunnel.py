"""Carry a CONNECT tunnel's bytes, after judging the client's first flight.

Guarantee: no client byte reaches the upstream before the client's first
flight has been judged. A TLS ClientHello whose SNI does not canonicalise to
the host the policy allowed, one that hides its server name with Encrypted
Client Hello, or one that is malformed or cut short, closes the tunnel with
nothing forwarded; bytes that are not TLS pass, since
the policy already allowed that host and port. Upstream bytes flow to the
client from the start, so protocols where the server speaks first work.

After the check, bytes move with ``os.splice`` through a pipe, one blocking
thread per direction, so payload never passes through Python buffers (this
is what keeps a tunnel near the speed of a direct connection). A direction
that reaches EOF half-closes its destination and leaves the other running;
an error in either direction, or ``abort()``, shuts down both sockets, which
wakes any thread blocked on them, so a tunnel can always be ended.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from firstrun.errors import PolicyError
from firstrun.policy.hosts import canonical_host
from firstrun.policy.network import Reason
from firstrun.proxy.errors import Refused
from firstrun.proxy.tls import MAX_CLIENT_HELLO, Hello, HelloStatus, parse_client_hello

_CHUNK = 1 << 20
_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class TunnelResult:
    bytes_up: int
    bytes_down: int
    # Set when the first-flight check closed the tunnel.
    refusal: Refused | None


def judge_first_flight(hello: Hello, host: str) -> Refused | None:
    """Whether a client's first flight may go to ``host`` (canonical)."""
    if hello.status is HelloStatus.MALFORMED or hello.status is HelloStatus.INCOMPLETE:
        return Refused(Reason.MALFORMED_REQUEST, "malformed TLS ClientHello", host=host)
    if hello.status is HelloStatus.NOT_TLS:
        return None
    if hello.ech:
        # The checked name would be the decoy: a CDN in front of an allowed
        # host would route on the encrypted one, to any of its tenants.
        return Refused(Reason.ENCRYPTED_CLIENT_HELLO,
                       "encrypted ClientHello hides the server name", host=host)
    if hello.sni is None:
        return None
    try:
        sni = canonical_host(hello.sni)
    except PolicyError:
        sni = None
    if sni != host:
        return Refused(Reason.SNI_MISMATCH, f"SNI {hello.sni!r} is not {host}", host=host)
    return None


def _in_thread(fn: Callable[[], _T], name: str) -> asyncio.Future[_T]:
    # A dedicated thread, not the loop's executor: tunnels live for minutes
    # and a small shared pool would let a few of them starve everything else.
    future: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except Exception as exc:  # re-raised in the awaiting coroutine
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return asyncio.wrap_future(future)


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass  # already shut down or reset: either way it is closed


def splice_pump(src: socket.socket, dst: socket.socket, on_error: Callable[[], None]) -> int:
    """Move bytes from ``src`` to ``dst`` until EOF; returns the count moved."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    total = 0
    try:
        try:
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _CHUNK)
        except OSError:
            pass  # the default 64 KiB pipe is slower but still correct
        while True:
            pending = os.splice(src.fileno(), write_end, _CHUNK)
            if pending == 0:
                break
            while pending:
                moved = os.splice(read_end, dst.fileno(), pending)
                pending -= moved
                total += moved
    except OSError:
        on_error()
        return total
    finally:
        os.close(read_end)
        os.close(write_end)
    _shutdown(dst, socket.SHUT_WR)
    return total


class Tunnel:
    """Both directions of one established CONNECT tunnel."""

    def __init__(
        self, *, client: socket.socket, upstream: socket.socket, host: str, initial: bytes
    ) -> None:
        self._client = client
        self._upstream = upstream
        self._host = host
        self._initial = initial

    def abort(self) -> None:
        _shutdown(self._client, socket.SHUT_RDWR)
        _shutdown(self._upstream, socket.SHUT_RDWR)

    async def run(self) -> TunnelResult:
        self._client.setblocking(True)
        self._upstream.setblocking(True)
        up = _in_thread(self._up, "firstrun-tunnel-up")
        down = _in_thread(
            lambda: splice_pump(self._upstream, self._client, self.abort), "firstrun-tunnel-down"
        )
        try:
            (bytes_up, refusal), bytes_down = await asyncio.gather(up, down)
        finally:
            self.abort()
        return TunnelResult(bytes_up=bytes_up, bytes_down=bytes_down, refusal=refusal)

    def _first_flight(self) -> tuple[bytes, Hello] | None:
        buf = bytearray(self._initial)
        while True:
            hello = parse_client_hello(bytes(buf))
            if hello.status is not HelloStatus.INCOMPLETE:
                return bytes(buf), hello
            if len(buf) >= MAX_CLIENT_HELLO:
                return bytes(buf), Hello(status=HelloStatus.MALFORMED)
            try:
                chunk = self._client.recv(1 << 16)
            except OSError:
                self.abort()
                return None
            if not chunk:
                # EOF: an empty tunnel is fine, half a ClientHello is not.
                return (bytes(buf), hello) if buf else None
            buf += chunk

    def _up(self) -> tuple[int, Refused | None]:
        flight = self._first_flight()
        if flight is None:
            _shutdown(self._upstream, socket.SHUT_WR)
            return 0, None
        data, hello = flight
        refusal = judge_first_flight(hello, self._host)
        if refusal is not None:
            self.abort()
            return 0, refusal
        try:
            self._upstream.sendall(data)
        except OSError:
            self.abort()
            return 0, None
        return len(data) + splice_pump(self._client, self._upstream, self.abort), None
