"""The proxy's listeners for redirected flows and DNS, over real sockets, judged by records.

A test speaks what the sandbox's relay and stub speak: DNS framed as over
TCP, and a flow's header line (``tcp|udp ADDRESS PORT``) ahead of its bytes.
The upstreams are real servers on loopback that an override lets through.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
from collections.abc import Iterator

import dns.message
import dns.rcode
import pytest
from proxy_fixtures import EchoServer, RecordingResolver, client_hello, read_echo, read_until_closed

from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.server import EgressProxy, ListenerKind

pytestmark = pytest.mark.fast


@pytest.fixture
def resolver() -> RecordingResolver:
    return RecordingResolver({"pypi.test": ["127.0.0.1"]})


@pytest.fixture
def capture(request: pytest.FixtureRequest, echo: EchoServer,
            resolver: RecordingResolver) -> Iterator[tuple[EgressProxy, str, str]]:
    # The override lets pypi.test reach the echo server on loopback; a raw
    # stream there also needs the tcp rule, which a test can leave out.
    tcp = [] if getattr(request, "param", True) is False else [f"pypi.test:{echo.port}"]
    policy = NetworkPolicy.build(overrides=[(f"pypi.test:{echo.port}", ["127.0.0.1/32"])], tcp=tcp)
    proxy = EgressProxy(policy, resolver=resolver).start()
    sockdir = tempfile.mkdtemp(prefix="firstrun-test-capture-")
    flows = proxy.listen_unix(os.path.join(sockdir, "t.sock"), Channel.SHELL,
                              ListenerKind.TRANSPARENT)
    names = proxy.listen_unix(os.path.join(sockdir, "d.sock"), Channel.SHELL, ListenerKind.DNS)
    try:
        yield proxy, flows, names
    finally:
        proxy.stop()
        os.rmdir(sockdir)


def _unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def _resolve(path: str, name: str, qtype: str = "A") -> dns.message.Message:
    query = dns.message.make_query(name, qtype).to_wire()
    with _unix(path) as sock:
        sock.sendall(len(query).to_bytes(2, "big") + query)
        size = int.from_bytes(sock.recv(2), "big")
        wire = b""
        while len(wire) < size:
            wire += sock.recv(size - len(wire))
    return dns.message.from_wire(wire)


def _address(path: str, name: str) -> str:
    reply = _resolve(path, name)
    assert reply.rcode() == dns.rcode.NOERROR
    return str(reply.answer[0][0])


def _settled(proxy: EgressProxy) -> list[EgressRecord]:
    proxy.stop()
    return proxy.records()


def test_a_redirected_raw_stream_goes_by_its_name_and_is_recorded_transparent(
        capture, echo: EchoServer) -> None:  # type: ignore[no-untyped-def]
    proxy, flows, names = capture
    address = _address(names, "pypi.test")
    assert ipaddress.ip_address(address) in ipaddress.ip_network("198.18.0.0/15")
    payload = b"\x00\x00\x00\x08raw bytes, no TLS, no HTTP\n" * 100
    with _unix(flows) as sock:
        sock.sendall(f"tcp {address} {echo.port}\n".encode() + payload)
        got = read_echo(sock, len(payload))
        sock.shutdown(socket.SHUT_WR)
        assert read_until_closed(sock) == b""
    assert got == payload
    [record] = _settled(proxy)
    assert (record.capture, record.scheme, record.host, record.port) == (
        "transparent", "tcp", "pypi.test", echo.port)
    assert (record.decision, record.reason, record.resolved) == ("allow", "allowed_by_tcp_rule",
                                                                 "127.0.0.1")
    assert (record.bytes_up, record.bytes_down) == (len(payload), len(payload))


@pytest.mark.parametrize("capture", [False], indirect=True)
def test_the_same_raw_stream_without_a_tcp_rule_is_refused(capture, echo: EchoServer) -> None:  # type: ignore[no-untyped-def]
    proxy, flows, names = capture
    address = _address(names, "pypi.test")
    with _unix(flows) as sock:
        sock.sendall(f"tcp {address} {echo.port}\n".encode() + b"\x00\x00\x00\x08raw")
        assert read_until_closed(sock) == b""
    [record] = _settled(proxy)
    assert (record.decision, record.reason, record.scheme, record.bytes_up) == (
        "deny", "tcp_not_allowed", "tcp", 0)
    assert echo.seen.echoed == 0


def test_an_address_that_stands_for_no_name_is_refused_undialled(capture, echo) -> None:  # type: ignore[no-untyped-def]
    proxy, flows, _ = capture
    with _unix(flows) as sock:
        sock.sendall(f"tcp 127.0.0.1 {echo.port}\nhello".encode())
        assert read_until_closed(sock) == b""
    [record] = _settled(proxy)
    assert (record.decision, record.reason, record.host, record.resolved) == (
        "deny", "ip_literal", "127.0.0.1", None)
    assert echo.seen.connections == 0


def test_tls_naming_another_host_is_refused_before_any_byte_goes_up(capture, echo) -> None:  # type: ignore[no-untyped-def]
    proxy, flows, names = capture
    address = _address(names, "pypi.test")
    with _unix(flows) as sock:
        sock.sendall(f"tcp {address} {echo.port}\n".encode() + client_hello("evil.test"))
        assert read_until_closed(sock) == b""
    [record] = _settled(proxy)
    assert (record.decision, record.reason, record.bytes_up) == ("deny", "sni_mismatch", 0)
    assert echo.seen.echoed == 0


def test_a_datagram_is_recorded_refused_under_its_name(capture) -> None:  # type: ignore[no-untyped-def]
    proxy, flows, names = capture
    address = _address(names, "pypi.test")
    with _unix(flows) as sock:
        sock.sendall(f"udp {address} 443\n".encode())
        assert read_until_closed(sock) == b""
    [record] = _settled(proxy)
    assert (record.scheme, record.host, record.port, record.reason, record.capture) == (
        "udp", "pypi.test", 443, "udp_not_allowed", "transparent")


def test_dns_tunnelling_is_nxdomain_every_time_and_nothing_is_resolved(
        capture, resolver: RecordingResolver) -> None:  # type: ignore[no-untyped-def]
    proxy, _, names = capture
    labels = [f"{i:04x}{'6578' * 10}" for i in range(40)]
    for label in labels:
        assert _resolve(names, f"{label}.exfil.example.com", "TXT").rcode() == dns.rcode.NXDOMAIN
    # The same name again is one refusal, not two.
    assert _resolve(names, f"{labels[0]}.exfil.example.com").rcode() == dns.rcode.NXDOMAIN
    records = _settled(proxy)
    assert sorted(r.host for r in records) == sorted(f"{x}.exfil.example.com" for x in labels)
    assert {(r.scheme, r.reason, r.capture) for r in records} == {
        ("dns", "dns_not_allowed", "transparent")}
    # Only the proxy ever resolves, and it was asked nothing.
    assert resolver.asked == []
