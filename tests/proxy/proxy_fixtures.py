"""Loopback servers for the proxy tests: an upstream HTTP server, a TCP echo server, and h11 helpers.

Every server here binds 127.0.0.1 only and remembers what it saw, so a test
can judge by evidence ("the upstream saw no second request", "the echo
server received no byte") rather than by what the proxy says about itself.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import h11

from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.server import EgressProxy, ProxyLimits

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


@dataclass
class Seen:
    connections: int = 0
    requests: list[h11.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    echoed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Server:
    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self._serve = serve
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = Seen()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.seen.lock:
                self.seen.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


class HttpUpstream(_Server):
    """Answers every request with ``hello <path>``, keeping the connection alive."""

    def __init__(self) -> None:
        super().__init__(self._http)

    def _http(self, conn: socket.socket) -> None:
        h = h11.Connection(h11.SERVER)
        body = b""
        with conn:
            while True:
                try:
                    event = h.next_event()
                except h11.RemoteProtocolError:
                    return
                if event is h11.NEED_DATA:
                    data = conn.recv(65536)
                    h.receive_data(data)
                    if not data:
                        return
                elif isinstance(event, h11.Request):
                    with self.seen.lock:
                        self.seen.requests.append(event)
                    request = event
                    body = b""
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    with self.seen.lock:
                        self.seen.bodies.append(body)
                    reply = b"hello " + request.target
                    conn.sendall(
                        h.send(
                            h11.Response(
                                status_code=200,
                                headers=[
                                    ("content-length", str(len(reply))),
                                    ("connection", "keep-alive, x-upstream-secret"),
                                    ("x-upstream-secret", "hop"),
                                ],
                            )
                        )
                        + h.send(h11.Data(data=reply))
                        + h.send(h11.EndOfMessage())
                    )
                    if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                        return
                    h.start_next_cycle()
                else:
                    return


class EchoServer(_Server):
    """Sends back every byte it receives, and counts them."""

    def __init__(self) -> None:
        super().__init__(self._echo)

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with self.seen.lock:
                    self.seen.echoed += len(data)
                try:
                    conn.sendall(data)
                except OSError:
                    return


class RecordingResolver:
    """Maps names to fixed addresses and remembers every name it was asked."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        self.asked.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return [ipaddress.ip_address(a) for a in self.table[host]]


def start_proxy(
    policy: NetworkPolicy,
    resolver: RecordingResolver,
    *,
    limits: ProxyLimits | None = None,
    record_path: str | None = None,
) -> tuple[EgressProxy, tuple[str, int]]:
    proxy = EgressProxy(policy, resolver=resolver, limits=limits, record_path=record_path).start()
    return proxy, proxy.listen_tcp(Channel.SHELL)


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    return sock


@dataclass
class Reply:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    closed: bool
    trailing: bytes


def read_reply(sock: socket.socket, *, method: bytes = b"GET") -> Reply:
    """Read one response with h11 (never by hand); ``closed`` if the proxy then closed."""
    h = h11.Connection(h11.CLIENT)
    target = "x:1" if method == b"CONNECT" else "/"
    h.send(h11.Request(method=method, target=target, headers=[("host", "x")]))
    h.send(h11.EndOfMessage())
    response: h11.Response | None = None
    body = b""
    while True:
        event = h.next_event()
        if event is h11.NEED_DATA:
            h.receive_data(sock.recv(65536))
            continue
        if isinstance(event, h11.Response):
            response = event
            if h.their_state is h11.SWITCHED_PROTOCOL:
                break
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            break
        elif event is h11.PAUSED:
            break
        elif isinstance(event, h11.ConnectionClosed):
            break
    assert response is not None
    closed = False
    if any(v.lower() == b"close" for k, v in response.headers if k == b"connection"):
        closed = sock.recv(1) == b""
    return Reply(
        status=response.status_code,
        headers=dict(response.headers),
        body=body,
        closed=closed,
        trailing=h.trailing_data[0],
    )


def read_echo(sock: socket.socket, size: int) -> bytes:
    """What an echo sends back of ``size`` bytes: read until that many came, or the end
    (a short answer then fails the test's comparison instead of hanging it)."""
    got = b""
    while len(got) < size:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def _vector(data: bytes, width: int) -> bytes:
    return len(data).to_bytes(width, "big") + data


def client_hello(
    sni: str | bytes | None,
    *,
    record_size: int = 1 << 14,
    names: list[bytes] | None = None,
    duplicate_sni_extension: bool = False,
) -> bytes:
    """A TLS 1.3 ClientHello built field by field, split into records of ``record_size``."""
    extensions = b""
    if sni is not None or names is not None:
        entries = names if names is not None else [sni.encode() if isinstance(sni, str) else sni]
        server_names = b"".join(b"\x00" + _vector(n, 2) for n in entries)  # type: ignore[arg-type]
        sni_ext = b"\x00\x00" + _vector(_vector(server_names, 2), 2)
        extensions += sni_ext * (2 if duplicate_sni_extension else 1)
    extensions += b"\x00\x2b" + _vector(_vector(b"\x03\x04", 1), 2)  # supported_versions
    body = (
        b"\x03\x03"
        + bytes(range(32))
        + _vector(bytes(32), 1)
        + _vector(b"\x13\x01\x13\x02", 2)
        + _vector(b"\x00", 1)
        + _vector(extensions, 2)
    )
    handshake = b"\x01" + _vector(body, 3)
    records = b""
    for i in range(0, len(handshake), record_size):
        records += b"\x16\x03\x01" + _vector(handshake[i : i + record_size], 2)
    return records
