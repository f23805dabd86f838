"""Kept-alive upstream connections, judged by what the upstream servers saw.

A plain request may reuse an upstream connection only to an address its own
decision checked for the same name and channel; a bodiless idempotent
request that meets a kept connection the server has just closed goes once
more on a new one, and nothing else does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import h11
import pytest
from proxy_fixtures import HttpUpstream, RecordingResolver, _Server, connect, read_reply, start_proxy

from firstrun.policy.decision import Reason, Verdict
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.server import EgressProxy

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


def _get(host: str, port: int, path: str = "/", method: str = "GET", body: bytes = b"") -> bytes:
    authority = f"{host}:{port}"
    length = f"Content-Length: {len(body)}\r\n".encode() if body else b""
    return (f"{method} http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\n".encode()
            + length + b"\r\n" + body)


def _policy(*names_ports: tuple[str, int]) -> NetworkPolicy:
    return NetworkPolicy.build(allow=[], overrides=[
        (f"{name}:{port}", ["127.0.0.1/32"]) for name, port in names_ports])


@pytest.fixture
def resolver() -> RecordingResolver:
    return RecordingResolver({"a.test": ["127.0.0.1"], "b.test": ["127.0.0.1"]})


def _stopped(proxy: EgressProxy) -> list:  # type: ignore[type-arg]
    proxy.stop()
    return proxy.records()


def test_requests_on_one_client_connection_share_one_upstream_connection(
        upstream: HttpUpstream, resolver: RecordingResolver) -> None:
    proxy, address = start_proxy(_policy(("a.test", upstream.port)), resolver)
    with connect(address) as sock:
        for path in ("/one", "/two", "/three"):
            sock.sendall(_get("a.test", upstream.port, path))
            assert read_reply(sock).body == f"hello {path}".encode()
    records = _stopped(proxy)
    assert upstream.seen.connections == 1
    assert [r.target for r in upstream.seen.requests] == [b"/one", b"/two", b"/three"]
    assert [(r.decision, r.status, r.resolved) for r in records] == [
        (Verdict.ALLOW, 200, "127.0.0.1")] * 3


def test_a_kept_connection_serves_only_the_name_it_was_dialled_for(
        upstream: HttpUpstream, resolver: RecordingResolver) -> None:
    # Both names resolve to the same checked address, and still get a connection each.
    proxy, address = start_proxy(_policy(("a.test", upstream.port), ("b.test", upstream.port)),
                                 resolver)
    for host in ("a.test", "b.test", "a.test", "b.test"):
        with connect(address) as sock:
            sock.sendall(_get(host, upstream.port))
            assert read_reply(sock).status == 200
    _stopped(proxy)
    assert upstream.seen.connections == 2
    assert [dict(r.headers)[b"host"] for r in upstream.seen.requests] == [
        f"{h}:{upstream.port}".encode() for h in ("a.test", "b.test", "a.test", "b.test")]


def test_a_kept_connection_serves_only_its_own_channel(upstream: HttpUpstream,
                                                       resolver: RecordingResolver) -> None:
    # A docs host opened to the shell: both channels may reach it.
    name = f"a.test:{upstream.port}"
    policy = NetworkPolicy.build(allow=[name], docs=[name], shell_docs=[name],
                                 overrides=[(name, ["127.0.0.1/32"])])
    proxy = EgressProxy(policy, resolver=resolver).start()
    shell = proxy.listen_tcp(Channel.SHELL)
    docs = proxy.listen_tcp(Channel.DOCS)
    for address in (shell, docs, shell, docs):
        with connect(address) as sock:
            sock.sendall(_get("a.test", upstream.port))
            assert read_reply(sock).status == 200
    _stopped(proxy)
    assert upstream.seen.connections == 2


def test_a_refusal_never_takes_or_leaves_a_kept_connection(upstream: HttpUpstream,
                                                           resolver: RecordingResolver) -> None:
    proxy, address = start_proxy(_policy(("a.test", upstream.port)), resolver)
    with connect(address) as sock:
        sock.sendall(_get("a.test", upstream.port, "/ok"))
        assert read_reply(sock).status == 200
    with connect(address) as sock:
        sock.sendall(_get("b.test", upstream.port, "/refused"))
        assert read_reply(sock).status == 403
    records = _stopped(proxy)
    assert [r.target for r in upstream.seen.requests] == [b"/ok"]
    assert [(r.host, r.decision) for r in records] == [("a.test", Verdict.ALLOW),
                                                      ("b.test", Verdict.DENY)]


class _ClosesOnSecondRequest(_Server):
    """Answers the first request on each connection (keeping it open), then closes the
    connection, unanswered, when a second request arrives on it: a server that dropped
    an idle connection just as the proxy reused it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        super().__init__(self._serve_one)

    def _serve_one(self, conn: socket.socket) -> None:
        h = h11.Connection(h11.SERVER)
        with conn:
            answered = False
            body = b""
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    data = conn.recv(65536)
                    if not data:
                        return
                    h.receive_data(data)
                elif isinstance(event, h11.Request):
                    if answered:
                        return
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    with self.lock:
                        self.bodies.append(body)
                    reply = b"fresh"
                    conn.sendall(h.send(h11.Response(status_code=200, headers=[
                        ("content-length", str(len(reply)))])) + h.send(h11.Data(data=reply))
                        + h.send(h11.EndOfMessage()))
                    h.start_next_cycle()
                    answered, body = True, b""
                else:
                    return


@pytest.fixture
def closing() -> Iterator[_ClosesOnSecondRequest]:
    server = _ClosesOnSecondRequest()
    yield server
    server.close()


def test_a_get_that_meets_a_closed_kept_connection_goes_once_more_on_a_new_one(
        closing: _ClosesOnSecondRequest, resolver: RecordingResolver) -> None:
    proxy, address = start_proxy(_policy(("a.test", closing.port)), resolver)
    for _ in range(2):
        with connect(address) as sock:
            sock.sendall(_get("a.test", closing.port))
            reply = read_reply(sock)
            assert (reply.status, reply.body) == (200, b"fresh")
    records = _stopped(proxy)
    # The second request reached the kept connection, which closed; then a new one.
    assert closing.seen.connections == 2
    assert [(r.decision, r.status) for r in records] == [(Verdict.ALLOW, 200)] * 2


def test_a_post_that_meets_a_closed_kept_connection_is_never_sent_twice(
        closing: _ClosesOnSecondRequest, resolver: RecordingResolver) -> None:
    proxy, address = start_proxy(_policy(("a.test", closing.port)), resolver)
    with connect(address) as sock:
        sock.sendall(_get("a.test", closing.port))
        assert read_reply(sock).status == 200
    with connect(address) as sock:
        sock.sendall(_get("a.test", closing.port, method="POST", body=b"once"))
        reply = read_reply(sock)
    records = _stopped(proxy)
    assert reply.status == 502
    assert closing.seen.connections == 1 and closing.bodies == [b""]
    assert (records[-1].decision, records[-1].reason) == (Verdict.DENY, Reason.UPSTREAM_FAILED)
