"""How a CONNECT tunnel ended, on real loopback sockets: a tunnel cut mid-handshake says so.

An upstream that takes the ClientHello and hangs up, or resets after its
first bytes, and a client that resets before anything came down: each
tunnel is recorded with the bytes it carried each way, how it ended and
``cut``. A tunnel the client closes after its exchange is not cut, and
neither is one the proxy ends as it stops. Judged by what the client and
the upstream saw and by the record.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from proxy_fixtures import (
    EchoServer,
    RecordingResolver,
    client_hello,
    connect,
    read_echo,
    read_reply,
    read_until_closed,
)

from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.records import EgressRecord, TunnelEnd
from firstrun.proxy.server import EgressProxy

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

HELLO = client_hello("pypi.test")
# What a server's first flight might start with: a TLS handshake record's header.
SERVER_BYTES = b"\x16\x03\x03\x00\x7a" + b"\x02" * 40


class OneShotUpstream:
    """Takes one connection, reads the whole ClientHello, then does ``then`` to it."""

    def __init__(self, then: Callable[[socket.socket], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = b""
        self.heard = threading.Event()
        self._then = then
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        while len(self.received) < len(HELLO):
            chunk = conn.recv(65536)
            if not chunk:
                break
            self.received += chunk
        self.heard.set()
        self._then(conn)

    def close(self) -> None:
        self._thread.join(timeout=30)
        self.listener.close()


def _hang_up(conn: socket.socket) -> None:
    conn.close()


def _reset_after_first_bytes(conn: socket.socket) -> None:
    conn.sendall(SERVER_BYTES)
    # SO_LINGER 0: the close is a reset, as a server that dies mid-handshake sends.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _silent(conn: socket.socket) -> None:
    # Says nothing and waits for the client, which resets.
    conn.recv(1)
    conn.close()


class _Proxy:
    """The proxy, allowing ``pypi.test`` to loopback ``port``; ``recorded`` is set by the
    tunnel's record, written when the tunnel ended by itself."""

    def __init__(self, port: int) -> None:
        policy = NetworkPolicy.build(overrides=[(f"pypi.test:{port}", ["127.0.0.1/32"])])
        self.recorded = threading.Event()
        self.proxy = EgressProxy(policy, resolver=RecordingResolver({"pypi.test": ["127.0.0.1"]}),
                                 on_record=lambda _: self.recorded.set()).start()
        self.address = self.proxy.listen_tcp(Channel.SHELL)

    def record(self, *, ended_by_itself: bool = True) -> EgressRecord:
        if ended_by_itself:
            assert self.recorded.wait(30)
        self.proxy.stop()
        (record,) = self.proxy.records()
        return record


def _tunnel(address: tuple[str, int], port: int) -> socket.socket:
    sock = connect(address)
    sock.sendall(f"CONNECT pypi.test:{port} HTTP/1.1\r\nHost: pypi.test:{port}\r\n\r\n".encode())
    assert read_reply(sock, method=b"CONNECT").status == 200
    sock.sendall(HELLO)
    return sock


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Iterator[OneShotUpstream]:
    server = OneShotUpstream(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("upstream", [_hang_up], indirect=True)
def test_an_upstream_that_hangs_up_on_the_client_hello_is_recorded_as_cut(
        upstream: OneShotUpstream) -> None:
    proxy = _Proxy(upstream.port)
    with _tunnel(proxy.address, upstream.port) as sock:
        assert read_until_closed(sock) == b""
    record = proxy.record()
    assert upstream.received == HELLO
    assert (record.decision, record.status) == ("allow", 200)
    assert (record.bytes_up, record.bytes_down) == (len(HELLO), 0)
    assert (record.ended, record.cut) == (TunnelEnd.UPSTREAM_CLOSED, True)
    assert record.to_data()["cut"] is True


@pytest.mark.parametrize("upstream", [_reset_after_first_bytes], indirect=True)
def test_an_upstream_reset_mid_handshake_is_recorded_as_cut(upstream: OneShotUpstream) -> None:
    proxy = _Proxy(upstream.port)
    with _tunnel(proxy.address, upstream.port) as sock:
        got = read_until_closed(sock)
    record = proxy.record()
    # What the client got is what the record says came down, however far it got.
    assert SERVER_BYTES.startswith(got)
    assert (record.bytes_up, record.bytes_down) == (len(HELLO), len(got))
    assert (record.ended, record.cut) == (TunnelEnd.UPSTREAM_RESET, True)


@pytest.mark.parametrize("upstream", [_silent], indirect=True)
def test_a_client_that_resets_before_anything_came_down_is_recorded_as_cut(
        upstream: OneShotUpstream) -> None:
    proxy = _Proxy(upstream.port)
    sock = _tunnel(proxy.address, upstream.port)
    assert upstream.heard.wait(30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    record = proxy.record()
    assert (record.bytes_up, record.bytes_down) == (len(HELLO), 0)
    assert (record.ended, record.cut) == (TunnelEnd.CLIENT_RESET, True)


def test_a_tunnel_the_client_closes_after_its_exchange_is_not_cut() -> None:
    echo = EchoServer()
    try:
        proxy = _Proxy(echo.port)
        with _tunnel(proxy.address, echo.port) as sock:
            got = read_echo(sock, len(HELLO))
            sock.shutdown(socket.SHUT_WR)
            assert read_until_closed(sock) == b""
        record = proxy.record()
    finally:
        echo.close()
    assert got == HELLO
    assert (record.bytes_up, record.bytes_down) == (len(HELLO), len(HELLO))
    assert (record.ended, record.cut) == (TunnelEnd.CLIENT_CLOSED, False)


def test_a_tunnel_open_when_the_proxy_stops_is_not_cut() -> None:
    echo = EchoServer()
    try:
        proxy = _Proxy(echo.port)
        with _tunnel(proxy.address, echo.port) as sock:
            assert read_echo(sock, len(HELLO)) == HELLO
            record = proxy.record(ended_by_itself=False)
    finally:
        echo.close()
    assert (record.ended, record.cut) == (TunnelEnd.PROXY_STOPPED, False)
