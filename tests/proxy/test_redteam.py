"""Red-team attacks on the egress proxy, from a hostile client on real loopback sockets.

Judged by what the servers behind the proxy saw (an echo server that
received no byte, a canary listener that accepted nothing), not by what the
proxy says about itself.
"""

from __future__ import annotations

import socket

import pytest
from proxy_fixtures import (
    EchoServer,
    RecordingResolver,
    connect,
    read_reply,
    read_until_closed,
    start_proxy,
)

from firstrun.policy.decision import Reason
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.server import EgressProxy, system_resolver

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


def _vector(data: bytes, width: int) -> bytes:
    return len(data).to_bytes(width, "big") + data


def _hello_with(sni: str, extra_extension: tuple[int, bytes]) -> bytes:
    """A TLS 1.3 ClientHello with an SNI and one more extension, in one record."""
    server_names = b"\x00" + _vector(sni.encode(), 2)
    ext_type, ext_body = extra_extension
    extensions = (
        b"\x00\x00" + _vector(_vector(server_names, 2), 2)
        + b"\x00\x2b" + _vector(_vector(b"\x03\x04", 1), 2)
        + ext_type.to_bytes(2, "big") + _vector(ext_body, 2)
    )
    body = (
        b"\x03\x03" + bytes(32) + _vector(bytes(32), 1) + _vector(b"\x13\x01", 2)
        + _vector(b"\x00", 1) + _vector(extensions, 2)
    )
    handshake = b"\x01" + _vector(body, 3)
    return b"\x16\x03\x01" + _vector(handshake, 2)


# An outer ECH extension: type outer(0), HPKE suite, config id, enc, payload.
_ECH_OUTER = b"\x00" + b"\x00\x20\x00\x01" + b"\x2a" + _vector(bytes(32), 2) + _vector(bytes(64), 2)


@pytest.mark.parametrize("ext_type", [0xFE0D, 0xFFCE], ids=["ech", "esni_draft"])
def test_encrypted_client_hello_cannot_front_through_an_allowed_host(
    echo: EchoServer, ext_type: int
) -> None:
    # The hole: the outer SNI named the allowed host, so the tunnel opened;
    # a CDN in front of that host decrypts the inner ClientHello and routes
    # on the hidden name, to any of its tenants.
    resolver = RecordingResolver({"pypi.test": ["127.0.0.1"]})
    policy = NetworkPolicy.build(overrides=[(f"pypi.test:{echo.port}", ["127.0.0.1/32"])])
    proxy, address = start_proxy(policy, resolver)
    try:
        with connect(address) as sock:
            sock.sendall(f"CONNECT pypi.test:{echo.port} HTTP/1.1\r\n"
                         f"Host: pypi.test:{echo.port}\r\n\r\n".encode())
            assert read_reply(sock, method=b"CONNECT").status == 200
            sock.sendall(_hello_with("pypi.test", (ext_type, _ECH_OUTER)))
            assert read_until_closed(sock) == b""
    finally:
        proxy.stop()
    assert echo.seen.echoed == 0
    (record,) = proxy.records()
    assert (record.decision, record.reason, record.bytes_up) == (
        "deny", Reason.ENCRYPTED_CLIENT_HELLO, 0,
    )


class _Canary:
    """A listener on the host's loopback that counts what it accepted."""

    def __init__(self, host: str, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def accepted(self) -> int:
        count = 0
        while True:
            try:
                self.sock.accept()[0].close()
            except BlockingIOError:
                return count
            count += 1


def test_names_the_real_resolver_sends_to_loopback_are_refused() -> None:
    # An allow-list entry for a name is not an allowance for where it
    # resolves: /etc/hosts sends ``localhost`` (and here ``vm``, ``runsc``) to
    # 127.0.0.1 and ::1, through the same getaddrinfo the proxy uses.
    v4 = _Canary("127.0.0.1")
    # Without ::1 on this host, localhost resolves to 127.0.0.1 alone.
    try:
        v6: _Canary | None = _Canary("::1", v4.port)
    except OSError:
        v6 = None
    names = ["localhost", "localhost.", "LocalHost"]
    policy = NetworkPolicy.build(allow=[f"localhost:{v4.port}"])
    proxy = EgressProxy(policy, resolver=system_resolver).start()
    try:
        address = proxy.listen_tcp(Channel.SHELL)
        for name in names:
            for request in (
                f"GET http://{name}:{v4.port}/ HTTP/1.1\r\nHost: {name}:{v4.port}\r\n\r\n",
                f"CONNECT {name}:{v4.port} HTTP/1.1\r\nHost: {name}:{v4.port}\r\n\r\n",
            ):
                with connect(address) as sock:
                    sock.sendall(request.encode())
                    method = b"CONNECT" if request.startswith("CONNECT") else b"GET"
                    assert read_reply(sock, method=method).status == 403
    finally:
        proxy.stop()
    assert (v4.accepted(), v6.accepted() if v6 is not None else 0) == (0, 0)
    records = proxy.records()
    assert len(records) == 2 * len(names)
    assert {r.reason for r in records} == {Reason.RESOLVED_LOOPBACK}
