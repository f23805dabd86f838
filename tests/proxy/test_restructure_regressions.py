"""What a review of the sans-io restructure (exchange, wire, the upstream pool) found, over
real sockets: each test passed on the proxy before it (630f138), failed on the
restructure as first written, and holds since.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import tempfile
import threading
import time

import dns.message
import dns.rcode
import h11
import pytest
from proxy_fixtures import EchoServer, RecordingResolver, _Server, connect, read_reply, start_proxy

from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.server import EgressProxy, ListenerKind

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


def _get(host: str, port: int, path: str) -> bytes:
    authority = f"{host}:{port}"
    return f"GET http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()


def _policy(port: int) -> NetworkPolicy:
    return NetworkPolicy.build(allow=[], overrides=[(f"a.test:{port}", ["127.0.0.1/32"])])


# -- 1. a kept upstream connection whose last exchange left unread bytes -------------


class _AnswersWithAnExtraResponse(_Server):
    """Answers every request with ``hello <path>``, keeping the connection alive; its
    first answer carries, in the same write, a second response nobody asked for."""

    def __init__(self) -> None:
        super().__init__(self._serve_all)

    def _serve_all(self, conn: socket.socket) -> None:
        h = h11.Connection(h11.SERVER)
        first = True
        request: h11.Request | None = None
        with conn:
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    data = conn.recv(65536)
                    if not data:
                        return
                    h.receive_data(data)
                elif isinstance(event, h11.Request):
                    with self.seen.lock:
                        self.seen.requests.append(event)
                    request = event
                elif isinstance(event, h11.EndOfMessage):
                    assert request is not None
                    reply = b"hello " + request.target
                    out = (h.send(h11.Response(status_code=200, headers=[
                        ("content-length", str(len(reply)))]))
                        + h.send(h11.Data(data=reply)) + h.send(h11.EndOfMessage()))
                    if first:
                        out += b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale"
                        first = False
                    conn.sendall(out)
                    if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                        return
                    h.start_next_cycle()
                elif isinstance(event, h11.Data):
                    pass
                else:
                    return


def test_a_kept_connection_with_unread_response_bytes_is_never_reused() -> None:
    upstream = _AnswersWithAnExtraResponse()
    resolver = RecordingResolver({"a.test": ["127.0.0.1"]})
    proxy, address = start_proxy(_policy(upstream.port), resolver)
    try:
        with connect(address) as sock:
            sock.sendall(_get("a.test", upstream.port, "/one"))
            assert read_reply(sock).body == b"hello /one"
        # Another client, another request, well within the pool's idle time.
        with connect(address) as sock:
            sock.sendall(_get("a.test", upstream.port, "/two"))
            second = read_reply(sock)
    finally:
        proxy.stop()
        upstream.close()
    # The client must get the upstream's answer to *its* request, not bytes the
    # upstream sent after the previous response.
    assert second.body == b"hello /two"


# -- 2. a download in flight when the proxy stops ------------------------------------


class _Stalls(_Server):
    """Sends a response head and the first 1000 bytes of a 100000-byte body, then waits."""

    def __init__(self) -> None:
        self.release = threading.Event()
        super().__init__(self._serve_stall)

    def _serve_stall(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"x" * 1000)
            self.release.wait(30)


def test_a_download_cut_by_stop_keeps_its_status_and_bytes_in_its_record() -> None:
    upstream = _Stalls()
    resolver = RecordingResolver({"a.test": ["127.0.0.1"]})
    proxy, address = start_proxy(_policy(upstream.port), resolver)
    try:
        with connect(address) as sock:
            sock.sendall(_get("a.test", upstream.port, "/big"))
            got = b""
            while got.count(b"x") < 1000:
                got += sock.recv(65536)
            proxy.stop()
        records = proxy.records()
    finally:
        upstream.release.set()
        upstream.close()
    [record] = records
    # 630f138 recorded what had gone out by the time the proxy stopped.
    assert record.status == 200
    assert record.bytes_down >= 1000


# -- 3. a redirected flow whose client resets while it is being resolved ---------------


class _HeldResolver(RecordingResolver):
    """Says when it is asked, then answers only once the test lets it."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        super().__init__(table)
        self.asked_event = threading.Event()
        self.answer = threading.Event()

    async def __call__(self, host: str, port: int):  # type: ignore[no-untyped-def,override]
        self.asked_event.set()
        while not self.answer.is_set():
            await asyncio.sleep(0.01)
        return await super().__call__(host, port)


def _synthetic_address(dns_path: str, name: str) -> str:
    query = dns.message.make_query(name, "A").to_wire()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(dns_path)
        sock.sendall(len(query).to_bytes(2, "big") + query)
        size = int.from_bytes(sock.recv(2), "big")
        wire = b""
        while len(wire) < size:
            wire += sock.recv(size - len(wire))
    reply = dns.message.from_wire(wire)
    assert reply.rcode() == dns.rcode.NOERROR
    return str(reply.answer[0][0])


def test_a_flow_reset_while_resolving_still_leaves_its_one_record(echo: EchoServer) -> None:
    # The docker sidecar takes redirected flows on a TCP listener (sidecar.py).
    policy = NetworkPolicy.build(overrides=[(f"pypi.test:{echo.port}", ["127.0.0.1/32"])],
                                 tcp=[f"pypi.test:{echo.port}"])
    resolver = _HeldResolver({"pypi.test": ["127.0.0.1"]})
    proxy = EgressProxy(policy, resolver=resolver).start()
    sockdir = tempfile.mkdtemp(prefix="firstrun-review-")
    try:
        names = proxy.listen_unix(os.path.join(sockdir, "d.sock"), Channel.SHELL,
                                  ListenerKind.DNS)
        flows = proxy.listen_tcp(Channel.SHELL, kind=ListenerKind.TRANSPARENT)
        address = _synthetic_address(names, "pypi.test")
        sock = socket.create_connection(flows, timeout=10)
        sock.sendall(f"tcp {address} {echo.port}\n".encode() + b"\x00\x00\x00\x08raw")
        assert resolver.asked_event.wait(10)  # the proxy has read the header and is resolving
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset
        time.sleep(0.2)  # the loop sees the reset before the answer
        resolver.answer.set()
        deadline = time.monotonic() + 5
        while echo.seen.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proxy.stop()
    finally:
        proxy.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
    # The proxy dialled the upstream for this flow: the flow must leave one record.
    assert echo.seen.connections == 1
    flow_records = [r for r in proxy.records() if r.host == "pypi.test" and r.port == echo.port]
    assert len(flow_records) == 1, proxy.records()


# -- 4. a client that resets in the middle of its head ---------------------------------


def test_a_client_reset_mid_head_is_no_request_timeout() -> None:
    resolver = RecordingResolver({"a.test": ["127.0.0.1"]})
    proxy, address = start_proxy(_policy(1), resolver)
    sock = connect(address)
    sock.sendall(b"GET http://a.test:1/ HTTP/1.1\r\nHost: a.te")
    time.sleep(0.2)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    time.sleep(0.3)
    proxy.stop()
    # Nothing timed out and nothing was answered: 630f138 recorded nothing.
    assert [(r.reason, r.status) for r in proxy.records()] == []
