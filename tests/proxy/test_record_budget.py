"""The record budget fails closed: past it nothing is forwarded, and one closing record counts what was refused.

Real sockets on loopback, and one flood from inside a real linux sandbox.
The upstream fixtures' own tallies (connections, requests) and the
resolver's list of names asked are the evidence that a request after the
budget went nowhere, not the proxy's status line alone.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import h11
import pytest
from proxy_fixtures import (
    HttpUpstream,
    RecordingResolver,
    connect,
    read_reply,
    read_until_closed,
)
from tls_fixtures import HttpsRegistry, TestCA, https_via_proxy

from firstrun.agents.base import AgentStop
from firstrun.errors import ProxyError
from firstrun.policy.decision import Reason, Verdict
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.ca import RunCA, upstream_context
from firstrun.proxy.credentials import mint
from firstrun.proxy.intercept import Interception
from firstrun.proxy.records import EgressRecord, RecordLog
from firstrun.proxy.server import EgressProxy, ProxyLimits
from firstrun.results.model import Classification
from firstrun.run.classify import RunReason, classify_run
from firstrun.run.events import (
    AgentFinished,
    CheckFinished,
    CheckIsolated,
    CommandRan,
    Egress,
    Event,
    Source,
)
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.linux import probe
from firstrun.sandbox.linux.backend import LinuxBackend
from support.profiles import make_profile

pytestmark = pytest.mark.timeout(60)

DENIED = b"GET http://evil.test/x HTTP/1.1\r\nHost: evil.test\r\n\r\n"


def _allowed(port: int, path: str = "/ok") -> bytes:
    return f"GET http://pypi.test:{port}{path} HTTP/1.1\r\nHost: pypi.test:{port}\r\n\r\n".encode()


@pytest.fixture
def resolver() -> RecordingResolver:
    return RecordingResolver({"pypi.test": ["127.0.0.1"]})


class _Proxy:
    """A started proxy with a record file and an ``on_record`` subscriber, as a run has."""

    def __init__(self, upstream: HttpUpstream, resolver: RecordingResolver, path: Path,
                 limits: ProxyLimits) -> None:
        self.path = path
        self.delivered: list[EgressRecord] = []
        policy = NetworkPolicy.build(overrides=[(f"pypi.test:{upstream.port}", ["127.0.0.1/32"])])
        self.proxy = EgressProxy(policy, resolver=resolver, limits=limits, record_path=str(path),
                                 on_record=self.delivered.append).start()
        self.address = self.proxy.listen_tcp(Channel.SHELL)

    def ask(self, request: bytes) -> tuple[int, bytes]:
        """One request on a fresh connection: its status and x-firstrun-reason (b"" if none)."""
        with connect(self.address) as sock:
            sock.sendall(request)
            reply = read_reply(sock)
        return reply.status, reply.headers.get(b"x-firstrun-reason", b"")

    def lines(self) -> list[dict[str, object]]:
        """The record file, once the proxy has stopped (and so written its last record)."""
        self.proxy.stop()
        return [json.loads(line) for line in self.path.read_text().splitlines()]


@pytest.fixture
def make(upstream: HttpUpstream, resolver: RecordingResolver,
         tmp_path: Path) -> Iterator[Callable[..., _Proxy]]:
    made: list[_Proxy] = []

    def build(**limits: int) -> _Proxy:
        p = _Proxy(upstream, resolver, tmp_path / f"records-{len(made)}.jsonl", ProxyLimits(**limits))
        made.append(p)
        return p

    yield build
    for p in made:
        p.proxy.stop()


def test_a_denied_flood_stops_at_the_budget_and_nothing_after_it_is_forwarded(
        make, upstream: HttpUpstream, resolver: RecordingResolver) -> None:  # type: ignore[no-untyped-def]
    p = make(max_records=5)
    threads, per_thread = 4, 10
    answers: list[tuple[int, bytes]] = []
    lock = threading.Lock()

    def flood() -> None:
        for _ in range(per_thread):
            answer = p.ask(DENIED)
            with lock:
                answers.append(answer)

    workers = [threading.Thread(target=flood) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    flooded = threads * per_thread
    assert len(answers) == flooded
    # Policy denials are 403; the spent budget is the proxy's own limit, 503.
    assert sorted(answers) == sorted(
        [(403, b"not_allowed")] * 5 + [(503, b"record_budget_exhausted")] * (flooded - 5))

    # An allowed destination after the budget: refused, and it went nowhere.
    assert p.ask(_allowed(upstream.port)) == (503, b"record_budget_exhausted")
    assert upstream.seen.connections == 0 and upstream.seen.requests == []
    assert "pypi.test" not in resolver.asked

    rows = p.lines()
    assert len(rows) == 5 + 1
    assert [row["reason"] for row in rows[:5]] == ["not_allowed"] * 5
    assert all("unrecorded" not in row for row in rows[:5])
    final = rows[-1]
    assert (final["decision"], final["reason"], final["channel"]) == (
        "deny", "record_budget_exhausted", "shell")
    refused = sum(1 for _, reason in answers if reason == b"record_budget_exhausted") + 1
    assert final["unrecorded"] == refused == flooded - 5 + 1
    # The run's copy (on_record, the trace's source) and the in-memory list match the file.
    assert [r.to_data() for r in p.delivered] == rows
    assert [r.to_data() for r in p.proxy.records()] == rows


def test_requests_before_the_budget_is_spent_are_forwarded_and_recorded(
        make, upstream: HttpUpstream) -> None:  # type: ignore[no-untyped-def]
    p = make(max_records=3)
    assert p.ask(_allowed(upstream.port, "/a")) == (200, b"")
    assert p.ask(DENIED) == (403, b"not_allowed")
    assert p.ask(_allowed(upstream.port, "/b")) == (200, b"")
    # Reached, not exceeded: nothing was refused, so there is no closing record.
    rows = p.lines()
    assert [row["reason"] for row in rows] == ["allowed_by_override", "not_allowed",
                                               "allowed_by_override"]
    assert [r.target for r in upstream.seen.requests] == [b"/a", b"/b"]


def test_the_default_budget_leaves_an_ordinary_run_alone(make, upstream: HttpUpstream) -> None:  # type: ignore[no-untyped-def]
    p = make()
    with connect(p.address) as sock:
        for path in ("/a", "/b", "/c"):
            sock.sendall(_allowed(upstream.port, path))
            assert read_reply(sock).status == 200
    assert p.ask(DENIED) == (403, b"not_allowed")
    rows = p.lines()
    assert [row["path"] for row in rows] == ["/a", "/b", "/c", "/x"]
    assert not any(row["reason"] == "record_budget_exhausted" for row in rows)
    assert len(upstream.seen.requests) == 3


def test_the_byte_budget_fails_closed_the_same_way(make, upstream: HttpUpstream) -> None:  # type: ignore[no-untyped-def]
    p = make(max_record_bytes=1)
    # The first record may take the budget past its bytes; it is still written.
    assert p.ask(DENIED) == (403, b"not_allowed")
    assert p.ask(_allowed(upstream.port)) == (503, b"record_budget_exhausted")
    assert p.ask(DENIED) == (503, b"record_budget_exhausted")
    assert upstream.seen.connections == 0
    rows = p.lines()
    assert [row["reason"] for row in rows] == ["not_allowed", "record_budget_exhausted"]
    assert rows[-1]["unrecorded"] == 2


def test_one_keep_alive_connection_carries_at_most_one_denial(make) -> None:  # type: ignore[no-untyped-def]
    p = make()
    with connect(p.address) as sock:
        # A pipelined burst: the first denial closes the connection.
        sock.sendall(DENIED * 200)
        data = read_until_closed(sock)
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(data)
    responses = []
    while isinstance(event := client.next_event(), h11.Response | h11.Data | h11.EndOfMessage):
        if isinstance(event, h11.Response):
            responses.append(event.status_code)
    assert responses == [403]
    rows = p.lines()
    assert [row["reason"] for row in rows] == ["not_allowed"]


def test_a_run_whose_proxy_spent_its_budget_is_infra_error_never_a_docs_gap(
        make, upstream: HttpUpstream) -> None:  # type: ignore[no-untyped-def]
    p = make(max_records=1)
    assert p.ask(DENIED) == (403, b"not_allowed")
    assert p.ask(_allowed(upstream.port)) == (503, b"record_budget_exhausted")
    p.proxy.stop()
    # The run's trace holds every record on_record delivered, the closing one included.
    egress: list[Event] = [Egress(record=r) for r in p.delivered]
    assert [e.record.reason for e in egress if isinstance(e, Egress)] == [
        "not_allowed", "record_budget_exhausted"]
    for check in (1, 0):
        outcome = classify_run([*egress, AgentFinished(stop=AgentStop.FINISHED),
                            CheckFinished(exit_code=check)])
        assert (outcome.classification, outcome.reason) == (
            Classification.INFRA_ERROR, RunReason.RECORD_BUDGET_EXHAUSTED)
    # Without the closing record, the same denial made while the check ran and failed is
    # blocked: the allow-list, not the docs, may be what was missing.
    outcome = classify_run([AgentFinished(stop=AgentStop.FINISHED),
                            CheckIsolated(isolation="clean", killed=0), egress[0],
                            CommandRan(source=Source.CHECK, command="<success check>",
                                       exit_code=1, duration_s=0.1),
                            CheckFinished(exit_code=1)])
    assert outcome.classification is Classification.BLOCKED


def test_the_closing_record_round_trips_and_a_budget_below_one_is_refused(tmp_path: Path) -> None:
    log = RecordLog(None, max_records=1, max_bytes=1 << 20)
    assert log.reserve(Channel.DOCS)
    assert not log.has_room()
    assert not log.reserve(Channel.DOCS)
    log.release()
    # Spent stays spent: a released place does not reopen the budget.
    assert not log.has_room() and not log.reserve(Channel.DOCS)
    log.close()
    log.close()
    (final,) = log.snapshot()
    assert (final.decision, final.reason, final.channel, final.unrecorded) == (
        Verdict.DENY, Reason.RECORD_BUDGET_EXHAUSTED, Channel.DOCS, 0)
    assert EgressRecord.from_data(final.to_data()) == final
    with pytest.raises(ProxyError):
        EgressRecord.from_data(dict(final.to_data(), unrecorded=-1))
    for bad in ({"max_records": 0}, {"max_bytes": 0}):
        with pytest.raises(ProxyError):
            RecordLog(str(tmp_path / "never.jsonl"), **bad)


def test_an_inspected_tunnel_ends_once_the_budget_is_full(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    registry = HttpsRegistry(host="registry.test", ca=ca)
    try:
        policy = NetworkPolicy.build(
            overrides=[(f"registry.test:{registry.port}", ["127.0.0.1/32"])],
        ).with_inspection(InspectionPolicy())
        run_ca = RunCA()
        interception = Interception(ca=run_ca, upstream=upstream_context((str(ca.cafile),)),
                                    credentials=mint(InspectionPolicy().credentials, {}))
        proxy = EgressProxy(policy, resolver=RecordingResolver({"registry.test": ["127.0.0.1"]}),
                            interception=interception, limits=ProxyLimits(max_records=2),
                            record_path=str(tmp_path / "records.jsonl")).start()
        try:
            address = proxy.listen_tcp(Channel.SHELL)
            conn = http.client.HTTPSConnection(
                *address, context=ssl.create_default_context(cadata=run_ca.cert_pem.decode()),
                timeout=10)
            conn.set_tunnel("registry.test", registry.port)
            try:
                # The CONNECT holds one place and its first decrypted request takes the other.
                conn.request("GET", "/one")
                assert conn.getresponse().read() == b"registry.test saw GET /one\n"
                with pytest.raises(OSError):
                    conn.request("GET", "/two")
                    conn.getresponse()
            finally:
                conn.close()
            with pytest.raises(OSError, match="503"):
                https_via_proxy(address, "registry.test", registry.port, trust=run_ca.cert_pem)
        finally:
            proxy.stop()
        assert [(s.method, s.path) for s in registry.seen] == [("GET", "/one")]
        assert registry.handshakes == 1
        rows = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
        assert [(row["scheme"], row["reason"]) for row in rows] == [
            ("https", "allowed_read_only"), ("https-tunnel", "allowed_by_override"),
            (None, "record_budget_exhausted")]
        assert rows[-1]["unrecorded"] == 1
    finally:
        registry.close()


@pytest.mark.e2e
@pytest.mark.skipif(probe.bwrap_path() is None, reason="bubblewrap is not installed")
def test_a_flood_from_inside_a_real_sandbox_is_refused_past_the_budget(
        upstream: HttpUpstream, resolver: RecordingResolver) -> None:
    workspace = tempfile.mkdtemp(prefix="firstrun-test-ws-")
    private = tempfile.mkdtemp(prefix="firstrun-test-proxy-")
    policy = NetworkPolicy.build(overrides=[(f"pypi.test:{upstream.port}", ["127.0.0.1/32"])])
    proxy = EgressProxy(policy, resolver=resolver, limits=ProxyLimits(max_records=8)).start()
    try:
        socket_path = proxy.listen_unix(os.path.join(private, "proxy.sock"), Channel.SHELL)
        endpoint = ProxyEndpoint(socket_path=socket_path, nonce=proxy.nonce)
        profile = make_profile(workspace, net=policy)
        curl = "curl -sS -D - -o /dev/null"
        with LinuxBackend().start(profile, proxy=endpoint) as session:
            flood = session.exec(
                f"for i in $(seq 1 30); do {curl} http://evil.test/$i; done; "
                f"{curl} http://pypi.test:{upstream.port}/after", timeout=120)
    finally:
        proxy.stop()
        shutil.rmtree(workspace, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    headers = flood.stdout.text().lower()
    refused = headers.count("x-firstrun-reason: record_budget_exhausted")
    # The attestation took some of the 8; the flood took the rest, and the
    # allowed request at the end was refused with the flood's tail.
    assert 0 < refused <= 31 and headers.count("x-firstrun-reason: not_allowed") == 31 - refused
    assert upstream.seen.connections == 0 and "pypi.test" not in resolver.asked
    records = proxy.records()
    assert len(records) == 8 + 1
    assert records[-1].reason is Reason.RECORD_BUDGET_EXHAUSTED
    assert records[-1].unrecorded == refused
