"""The loopback relay to the proxy's Unix socket: real sockets, a real EgressProxy."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.server import EgressProxy
from firstrun.sandbox.seatbelt.relay import ProxyRelay


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # AF_UNIX paths are short; pytest's tmp_path can exceed the limit.
    with tempfile.TemporaryDirectory(prefix="fr-relay-") as d:
        yield Path(d)


def _echo_server(path: str) -> socket.socket:
    """Echo everything; after the client's EOF, send b'bye' and close."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
                conn.sendall(b"bye")
            except OSError:
                pass  # the relay closed under us (the close test does exactly that)

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_the_proxy_answers_with_its_nonce_through_the_relay(sockdir: Path) -> None:
    with EgressProxy(NetworkPolicy.build()) as proxy:
        path = proxy.listen_unix(str(sockdir / "proxy.sock"), Channel.SHELL)
        with ProxyRelay(path) as relay, socket.create_connection(("127.0.0.1", relay.port),
                                                                 timeout=10) as conn:
            conn.sendall(b"GET http://attest.firstrun.invalid/ HTTP/1.1\r\n"
                         b"Host: attest.firstrun.invalid\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")
    assert proxy.nonce.encode() in reply


def test_bytes_flow_both_ways_and_a_half_close_is_carried(sockdir: Path) -> None:
    server = _echo_server(str(sockdir / "echo.sock"))
    with server, ProxyRelay(str(sockdir / "echo.sock")) as relay, \
            socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
        payload = os.urandom(300_000)
        threading.Thread(target=lambda: (conn.sendall(payload), conn.shutdown(socket.SHUT_WR)),
                         daemon=True).start()
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
    # The server only says bye after it saw our EOF through the relay.
    assert got == payload + b"bye"


def test_no_proxy_listening_means_the_connection_is_closed_with_nothing(sockdir: Path) -> None:
    with ProxyRelay(str(sockdir / "absent.sock")) as relay, \
            socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
        assert conn.recv(1) == b""


def test_close_ends_live_connections_and_the_listener(sockdir: Path) -> None:
    server = _echo_server(str(sockdir / "echo.sock"))
    with server:
        relay = ProxyRelay(str(sockdir / "echo.sock"))
        conn = socket.create_connection(("127.0.0.1", relay.port), timeout=10)
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        relay.close()
        assert conn.recv(1) == b""
        conn.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", relay.port), timeout=10)
