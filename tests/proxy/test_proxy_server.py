"""The proxy on real loopback sockets, judged by what the upstream and echo servers saw."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_fixtures import (
    EchoServer,
    HttpUpstream,
    RecordingResolver,
    client_hello,
    connect,
    read_echo,
    read_reply,
    read_until_closed,
    start_proxy,
)

from firstrun.policy.decision import Reason
from firstrun.policy.network import ATTESTATION_HOST, Channel, Mode, NetworkPolicy
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.server import EgressProxy, ProxyLimits

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

RECORD_FIELDS = {
    "ts", "id", "channel", "method", "scheme", "host", "port", "path", "decision", "reason",
    "layer", "would_deny", "override", "resolved", "status", "bytes_up", "bytes_down",
    "duration_ms", "credentials", "capture",
}


def _policy(*ports: int, mode: Mode = Mode.ENFORCE, docs: tuple[str, ...] = ()) -> NetworkPolicy:
    """Registries only, plus an override that lets ``pypi.test`` reach loopback on ``ports``."""
    return NetworkPolicy.build(
        overrides=[(f"pypi.test:{port}", ["127.0.0.1/32"]) for port in ports],
        mode=mode,
        docs=docs,
    )


@pytest.fixture
def resolver() -> RecordingResolver:
    return RecordingResolver(
        {
            "pypi.test": ["127.0.0.1"],
            "pypi.org": ["151.101.0.223"],
            "mixed.test": ["151.101.0.223", "127.0.0.1"],
            "rebind.test": ["93.184.216.34", "10.0.0.7"],
        }
    )


@pytest.fixture
def proxied(upstream: HttpUpstream, echo: EchoServer, resolver: RecordingResolver) -> Iterator[tuple[EgressProxy, tuple[str, int]]]:
    proxy, address = start_proxy(_policy(upstream.port, echo.port), resolver)
    yield proxy, address
    proxy.stop()


def _get(port: int, path: str = "/", host: str = "pypi.test", extra: bytes = b"") -> bytes:
    authority = f"{host}:{port}"
    return (
        f"GET http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\n".encode() + extra + b"\r\n"
    )


def _connect(authority: str, host: str | None = None) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {host or authority}\r\n\r\n".encode()


def _settled(proxy: EgressProxy) -> list[EgressRecord]:
    """Every record, once the proxy has finished with every connection.

    A record is appended when its exchange ends, which can be just after the
    client read the last byte; stopping the proxy waits for that.
    """
    proxy.stop()
    return proxy.records()


def _only(proxy: EgressProxy) -> EgressRecord:
    records = _settled(proxy)
    assert len(records) == 1, records
    return records[0]


def test_keep_alive_get_forwards_two_requests_on_one_connection(proxied, upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(_get(upstream.port, "/a", extra=b"Proxy-Authorization: Basic c2VjcmV0\r\n"))
        first = read_reply(sock)
        sock.sendall(_get(upstream.port, "/b?c=d"))
        second = read_reply(sock)
    assert (first.status, first.body) == (200, b"hello /a")
    assert (second.status, second.body) == (200, b"hello /b?c=d")
    assert b"x-upstream-secret" not in first.headers  # named in the upstream's Connection
    seen = upstream.seen.requests
    assert [r.target for r in seen] == [b"/a", b"/b?c=d"]
    assert all((b"host", f"pypi.test:{upstream.port}".encode()) in list(r.headers) for r in seen)
    assert not any(name.startswith(b"proxy-") for r in seen for name, _ in r.headers)
    records = _settled(proxy)
    assert [(r.decision, r.reason, r.status, r.path) for r in records] == [
        ("allow", Reason.ALLOWED_BY_OVERRIDE, 200, "/a"),
        ("allow", Reason.ALLOWED_BY_OVERRIDE, 200, "/b?c=d"),
    ]
    assert all(r.resolved == "127.0.0.1" and r.bytes_down > 0 and r.bytes_up > 0 for r in records)


def test_post_body_reaches_upstream(proxied, upstream) -> None:  # type: ignore[no-untyped-def]
    _, address = proxied
    with connect(address) as sock:
        sock.sendall(
            f"POST http://pypi.test:{upstream.port}/up HTTP/1.1\r\nHost: pypi.test:{upstream.port}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".encode()
        )
        assert read_reply(sock).status == 200
    assert upstream.seen.bodies == [b"hello world"]


def test_denied_host_gets_403_with_reason_and_is_never_resolved(proxied, resolver) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(_get(80, host="evil.test"))
        reply = read_reply(sock)
    assert reply.status == 403
    assert reply.headers[b"x-firstrun-reason"] == b"not_allowed"
    assert reply.body.count(b"\n") == 1 and b"not_allowed" in reply.body and b"evil.test" in reply.body
    assert reply.closed
    assert "evil.test" not in resolver.asked
    record = _only(proxy)
    assert (record.decision, record.reason, record.host, record.status) == (
        "deny", Reason.NOT_ALLOWED, "evil.test", 403,
    )
    assert proxy.denied() == [record]


def test_a_refusal_is_recorded_before_its_answer_leaves(resolver) -> None:  # type: ignore[no-untyped-def]
    # A client that has read its 403 (and a command that has ended) must find
    # the refusal already recorded. The subscriber holds the proxy for up to a
    # second, waiting to hear that the client was answered: answered first
    # would mean a run could end before the refusal it met was told.
    answered = threading.Event()
    heard: list[bool] = []

    def on_record(record: EgressRecord) -> None:
        heard.append(answered.wait(timeout=1.0))

    proxy = EgressProxy(_policy(), resolver=resolver, on_record=on_record).start()
    try:
        with connect(proxy.listen_tcp(Channel.SHELL)) as sock:
            sock.sendall(_get(80, host="evil.test"))
            first = sock.recv(65536)
            answered.set()
            rest = read_until_closed(sock)
        assert (first + rest).startswith(b"HTTP/1.1 403 ")
        assert heard == [False]
    finally:
        proxy.stop()


@pytest.mark.parametrize("host", ["mixed.test", "rebind.test"])
def test_name_resolving_to_any_private_address_is_refused(host: str, resolver) -> None:  # type: ignore[no-untyped-def]
    policy = NetworkPolicy.build(allow=["mixed.test", "rebind.test"])
    proxy, address = start_proxy(policy, resolver)
    try:
        with connect(address) as sock:
            sock.sendall(_connect(f"{host}:443"))
            reply = read_reply(sock, method=b"CONNECT")
        record = _only(proxy)
    finally:
        proxy.stop()
    assert reply.status == 403
    assert resolver.asked == [host]
    assert record.reason in (Reason.RESOLVED_LOOPBACK, Reason.RESOLVED_PRIVATE)
    assert record.resolved is None  # nothing was dialled


def test_connect_tunnel_echo_counts_bytes(proxied, echo) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(_connect(f"pypi.test:{echo.port}"))
        reply = read_reply(sock, method=b"CONNECT")
        assert reply.status == 200
        payload = b"not TLS at all\n" * 1000
        sock.sendall(payload)
        got = read_echo(sock, len(payload))
        sock.shutdown(socket.SHUT_WR)
        assert read_until_closed(sock) == b""
    record = _only(proxy)
    assert got == payload
    assert (record.scheme, record.method, record.path, record.status) == (
        "https-tunnel", "CONNECT", None, 200,
    )
    assert (record.bytes_up, record.bytes_down) == (len(payload), len(payload))


def test_connect_with_matching_sni_passes(proxied, echo) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    hello = client_hello("PyPI.test.")
    with connect(address) as sock:
        sock.sendall(_connect(f"pypi.test:{echo.port}"))
        assert read_reply(sock, method=b"CONNECT").status == 200
        sock.sendall(hello)
        got = read_echo(sock, len(hello))
    assert got == hello


def test_connect_with_mismatched_sni_is_closed_and_nothing_forwarded(proxied, echo) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        # The ClientHello follows the CONNECT in the same write: it must be judged all the same.
        sock.sendall(_connect(f"pypi.test:{echo.port}") + client_hello("evil.example"))
        reply = read_reply(sock, method=b"CONNECT")
        assert reply.status == 200
        assert read_until_closed(sock) == reply.trailing == b""
    record = _only(proxy)
    assert (record.decision, record.reason, record.status, record.bytes_up) == (
        "deny", Reason.SNI_MISMATCH, None, 0,
    )
    assert echo.seen.echoed == 0


def test_connect_host_header_mismatch_never_dials(proxied, echo) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(_connect(f"pypi.test:{echo.port}", host="pypi.org:443"))
        reply = read_reply(sock, method=b"CONNECT")
    assert reply.status == 403
    assert reply.headers[b"x-firstrun-reason"] == b"host_mismatch"
    assert echo.seen.connections == 0
    assert _only(proxy).reason is Reason.HOST_MISMATCH


def test_absolute_form_host_header_mismatch(proxied, upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(
            f"GET http://pypi.test:{upstream.port}/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n".encode()
        )
        assert read_reply(sock).status == 403
    assert upstream.seen.connections == 0
    assert _only(proxy).reason is Reason.HOST_MISMATCH


def test_cl_te_smuggling_is_refused_and_upstream_sees_nothing(proxied, upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    smuggled = _get(upstream.port, "/smuggled")
    with connect(address) as sock:
        sock.sendall(
            f"POST http://pypi.test:{upstream.port}/ HTTP/1.1\r\nHost: pypi.test:{upstream.port}\r\n"
            f"Content-Length: {len(smuggled) + 5}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            + b"0\r\n\r\n"
            + smuggled
        )
        reply = read_reply(sock, method=b"POST")
        assert read_until_closed(sock) == b""
    assert (reply.status, reply.headers[b"x-firstrun-reason"]) == (400, b"smuggling_suspected")
    assert upstream.seen.connections == 0 and upstream.seen.requests == []
    assert _only(proxy).reason is Reason.SMUGGLING_SUSPECTED


@pytest.mark.parametrize(
    ("raw", "status", "reason"),
    [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", 400, Reason.MALFORMED_REQUEST),
        (b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", 400, Reason.MALFORMED_REQUEST),
        (b"CONNECT pypi.org HTTP/1.1\r\nHost: pypi.org\r\n\r\n", 400, Reason.MALFORMED_REQUEST),
        (b"CONNECT pypi.org:443/x HTTP/1.1\r\nHost: pypi.org\r\n\r\n", 400, Reason.MALFORMED_REQUEST),
        (b"CONNECT pypi.org:0443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", 400, Reason.MALFORMED_REQUEST),
        (b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nX: a\r\n\tb\r\n\r\n", 400, Reason.SMUGGLING_SUSPECTED),
        (b"POST http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, Reason.MALFORMED_REQUEST),
        (b"POST http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400, Reason.SMUGGLING_SUSPECTED),
        (b"DELETE http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nTransfer-Encoding: gzip\r\n\r\n", 400, Reason.MALFORMED_REQUEST),
        (b"TRACE http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", 405, Reason.UNSUPPORTED_METHOD),
    ],
)
def test_hostile_heads_get_4xx_and_a_record(proxied, resolver, raw: bytes, status: int, reason: Reason) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(raw)
        reply = read_reply(sock)
        assert read_until_closed(sock) == b""
    assert reply.status == status
    assert reply.headers[b"x-firstrun-reason"] == reason.value.encode()
    assert reply.body.endswith(b"\n") and reply.body.count(b"\n") == 1
    assert _only(proxy).reason is reason
    assert resolver.asked == []


def test_oversize_headers_get_431(resolver) -> None:  # type: ignore[no-untyped-def]
    proxy, address = start_proxy(_policy(), resolver, limits=ProxyLimits(max_head_bytes=4096))
    try:
        with connect(address) as sock:
            sock.sendall(b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n")
            for _ in range(64):
                sock.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
            reply = read_reply(sock)
        record = _only(proxy)
    finally:
        proxy.stop()
    assert reply.status == 431
    assert record.reason is Reason.HEADERS_TOO_LARGE


def test_slowloris_gets_408_and_is_closed(resolver) -> None:  # type: ignore[no-untyped-def]
    proxy, address = start_proxy(_policy(), resolver, limits=ProxyLimits(head_timeout_s=0.3))
    try:
        with connect(address) as sock:
            sock.sendall(b"GET http://pypi.org/ HTTP/1.1\r\nHost: pyp")
            reply = read_reply(sock)
            assert read_until_closed(sock) == b""
        record = _only(proxy)
    finally:
        proxy.stop()
    assert reply.status == 408
    assert (record.reason, record.status, record.method) == (Reason.REQUEST_TIMEOUT, 408, None)


def test_attestation_answers_the_nonce_without_resolving(proxied, resolver) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(_get(80, host=ATTESTATION_HOST).replace(b":80", b""))
        reply = read_reply(sock)
    assert (reply.status, reply.body) == (200, proxy.nonce.encode())
    assert resolver.asked == []
    record = _only(proxy)
    assert (record.reason, record.resolved, record.decision) == (Reason.ATTESTATION, None, "allow")


def test_report_mode_lets_through_and_records_would_deny(upstream, resolver) -> None:  # type: ignore[no-untyped-def]
    # A deny-list entry is a name rule, so report mode lets it through; the
    # override only opens the floor for this loopback fixture server.
    resolver.table["unlisted.test"] = ["127.0.0.1"]
    policy = NetworkPolicy.build(
        mode=Mode.REPORT, deny=["unlisted.test:%d" % upstream.port],
        overrides=[("unlisted.test:%d" % upstream.port, ["127.0.0.1/32"])],
    )
    proxy, address = start_proxy(policy, resolver)
    try:
        with connect(address) as sock:
            sock.sendall(_get(upstream.port, "/r", host="unlisted.test"))
            reply = read_reply(sock)
        record = _only(proxy)
    finally:
        proxy.stop()
    assert (reply.status, reply.body) == (200, b"hello /r")
    assert [r.target for r in upstream.seen.requests] == [b"/r"]
    assert (record.decision, record.would_deny, record.resolved) == (
        "allow", Reason.DENIED_BY_LIST, "127.0.0.1",
    )


def test_report_mode_still_enforces_the_floor(upstream, resolver) -> None:  # type: ignore[no-untyped-def]
    resolver.table["unlisted.test"] = ["127.0.0.1"]
    proxy, address = start_proxy(NetworkPolicy.build(mode=Mode.REPORT), resolver)
    try:
        with connect(address) as sock:
            sock.sendall(_get(upstream.port, "/r", host="unlisted.test"))
            reply = read_reply(sock)
        record = _only(proxy)
    finally:
        proxy.stop()
    assert reply.status == 403
    assert upstream.seen.requests == []
    assert (record.decision, record.reason, record.would_deny) == (
        "deny", Reason.RESOLVED_LOOPBACK, None,
    )


def test_the_proxy_never_dials_itself(resolver) -> None:  # type: ignore[no-untyped-def]
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proxy = EgressProxy(_policy(port), resolver=resolver).start()
    try:
        address = proxy.listen_tcp(Channel.SHELL, port=port)
        with connect(address) as sock:
            sock.sendall(_connect(f"pypi.test:{port}"))
            reply = read_reply(sock, method=b"CONNECT")
        record = _only(proxy)
    finally:
        proxy.stop()
    assert reply.status == 403
    assert record.reason is Reason.PROXY_ITSELF


def test_upstream_connect_failure_is_502(resolver) -> None:  # type: ignore[no-untyped-def]
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    proxy, address = start_proxy(_policy(port), resolver)
    try:
        with connect(address) as sock:
            sock.sendall(_get(port))
            reply = read_reply(sock)
        record = _only(proxy)
    finally:
        proxy.stop()
    assert (reply.status, record.reason) == (502, Reason.UPSTREAM_FAILED)


def test_resolve_failure_is_recorded(resolver) -> None:  # type: ignore[no-untyped-def]
    proxy, address = start_proxy(NetworkPolicy.build(allow=["nowhere.test"]), resolver)
    try:
        with connect(address) as sock:
            sock.sendall(_connect("nowhere.test:443"))
            reply = read_reply(sock, method=b"CONNECT")
        record = _only(proxy)
    finally:
        proxy.stop()
    assert resolver.asked == ["nowhere.test"]
    assert (reply.status, record.reason) == (502, Reason.RESOLVE_FAILED)


def test_unix_listener_is_world_connectable_and_records_its_channel(tmp_path: Path, resolver) -> None:  # type: ignore[no-untyped-def]
    policy = NetworkPolicy.build(docs=["docs.example.org"])
    path = str(tmp_path / "proxy.sock")
    with EgressProxy(policy, resolver=resolver) as proxy:
        assert proxy.listen_unix(path, Channel.SHELL) == path
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(path)
            sock.sendall(_connect("docs.example.org:443"))
            reply = read_reply(sock, method=b"CONNECT")
        record = _only(proxy)
    assert not os.path.exists(path)
    assert reply.status == 403
    assert (record.channel, record.reason) == (Channel.SHELL, Reason.DOCS_HOST_ON_SHELL)
    assert resolver.asked == []


def test_stop_ends_open_tunnels_and_records_them(proxied, echo) -> None:  # type: ignore[no-untyped-def]
    proxy, address = proxied
    with connect(address) as sock:
        sock.sendall(_connect(f"pypi.test:{echo.port}"))
        assert read_reply(sock, method=b"CONNECT").status == 200
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        proxy.stop()
        assert read_until_closed(sock) == b""
    record = _only(proxy)
    assert (record.reason, record.bytes_up, record.bytes_down) == (
        Reason.ALLOWED_BY_OVERRIDE, 4, 4,
    )


def test_records_jsonl_is_well_formed(tmp_path: Path, upstream, resolver) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "egress.jsonl"
    proxy, address = start_proxy(_policy(upstream.port), resolver, record_path=str(path))
    try:
        with connect(address) as sock:
            sock.sendall(_get(upstream.port, "/ok"))
            read_reply(sock)
        with connect(address) as sock:
            sock.sendall(b"garbage\r\n\r\n")
            read_reply(sock)
        with connect(address) as sock:
            sock.sendall(_connect("evil.test:443"))
            read_reply(sock, method=b"CONNECT")
    finally:
        proxy.stop()
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    rows = [json.loads(line) for line in lines]
    assert all(set(row) == RECORD_FIELDS for row in rows)
    assert [row["reason"] for row in rows] == ["allowed_by_override", "malformed_request", "not_allowed"]
    assert [row["id"] for row in rows] == [r.id for r in _settled(proxy)]
    assert rows[0]["path"] == "/ok" and rows[0]["scheme"] == "http" and rows[0]["port"] == upstream.port
    assert rows[1]["method"] is None and rows[1]["host"] is None
    assert rows[2]["scheme"] == "https-tunnel" and rows[2]["path"] is None
    assert all(row["ts"].endswith("Z") and row["channel"] == "shell" for row in rows)
