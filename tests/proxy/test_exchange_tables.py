"""The exchange handler as tables: each event in, the commands it causes out, with no sockets.

Each row is (event, the commands it must cause), with commands shown
compactly (``show``): a record as its mode, decision, reason, status and
scheme; a refusal as the status and reason its answer carries. The clock
is fixed, so records are exact.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import replace

import h11
import pytest

from firstrun.policy.decision import Reason
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import ATTESTATION_HOST, Channel, Mode, NetworkPolicy, decide_dns
from firstrun.proxy.credentials import mint
from firstrun.proxy.errors import Refused
from firstrun.proxy.exchange import (
    Answer,
    Carry,
    Clock,
    Command,
    Decisions,
    Dial,
    Dialled,
    Done,
    ExchangeEvent,
    FlowOpened,
    Forward,
    Handler,
    HeadRefused,
    InnerContext,
    NameRefused,
    PageText,
    ProxyContext,
    ReadPage,
    Record,
    Refuse,
    Release,
    RequestHead,
    Reserve,
    Reserved,
    Resolve,
    Resolved,
    dns_refusal,
    flow,
    inner_request,
    proxy_request,
    refusal_answer,
    run_table,
)
from firstrun.proxy.flight import FlightKind
from firstrun.proxy.records import TunnelEnd

pytestmark = pytest.mark.fast

CLOCK = Clock(monotonic=lambda: 10.0, iso=lambda: "2026-01-01T00:00:00.000Z",
              new_id=lambda: "0" * 32)
LOCAL = ipaddress.ip_address("127.0.0.1")
PUBLIC = ipaddress.ip_address("203.0.113.9")


def _context(policy: NetworkPolicy, channel: Channel = Channel.SHELL) -> ProxyContext:
    return ProxyContext(channel=channel, decisions=Decisions(policy), clock=CLOCK,
                        nonce="the-nonce", max_head_bytes=65536)


def _head(raw: bytes) -> RequestHead:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    event = conn.next_event()
    assert isinstance(event, h11.Request)
    return RequestHead(event=event, raw=raw[: len(raw) - len(conn.trailing_data[0])],
                       ts=CLOCK.iso(), started=CLOCK.monotonic())


def show(command: Command) -> tuple[object, ...]:
    """A command as a table cell."""
    if isinstance(command, Reserve):
        return ("reserve",)
    if isinstance(command, Release):
        return ("release",)
    if isinstance(command, Resolve):
        return ("resolve", command.host, command.port)
    if isinstance(command, Dial):
        return ("dial", command.host, command.port, tuple(map(str, command.addresses)),
                command.reuse)
    if isinstance(command, Forward):
        headers = dict(command.request.headers)
        return ("forward", command.request.method.decode(), command.request.target.decode(),
                headers.get(b"host", b"").decode(), command.cap)
    if isinstance(command, Carry):
        return ("carry", command.target.host, command.target.port, command.established,
                command.inspect) + (("served",) if command.served else ())
    if isinstance(command, Answer):
        return ("answer", command.status, command.body, bool(command.raw))
    if isinstance(command, ReadPage):
        return ("read_page", command.url)
    if isinstance(command, Record):
        r = command.record
        return ("record", command.mode.value, r.decision.value, r.reason.value, r.status,
                r.scheme.value if r.scheme else None)
    if isinstance(command, Refuse):
        if not command.data:
            return ("close", command.refusal.reason.value)
        status = int(command.data.split(b" ", 2)[1])
        return ("refuse", status, command.refusal.reason.value, command.linger)
    raise AssertionError(command)


def table(steps, events: Sequence[ExchangeEvent]) -> list[list[tuple[object, ...]]]:  # type: ignore[no-untyped-def]
    return [[show(c) for c in row] for row in run_table(steps, events)]


POLICY = NetworkPolicy.build(allow=["pypi.org", "files.example:80"], docs=["docs.example"],
                             overrides=[("fixture.test:8080", ["127.0.0.1/32"])])
GET = b"GET http://files.example/simple/ HTTP/1.1\r\nHost: files.example\r\n\r\n"


def test_an_allowed_get_is_reserved_judged_resolved_dialled_forwarded_then_recorded() -> None:
    assert table(proxy_request(_context(POLICY)), [
        _head(GET),
        Reserved(ok=True),
        Resolved(addresses=(PUBLIC,)),
        Dialled(address=PUBLIC),
        Done(bytes_up=60, bytes_down=1100, status=200, keep_alive=True),
    ]) == [
        [("reserve",)],
        [("resolve", "files.example", 80)],
        [("dial", "files.example", 80, ("203.0.113.9",), True)],
        [("forward", "GET", "/simple/", "files.example", None)],
        [("record", "reserved", "allow", "allowed_by_list", 200, "http")],
    ]


def test_a_denied_name_is_recorded_then_refused_and_never_resolved() -> None:
    raw = b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"
    assert table(proxy_request(_context(POLICY)), [_head(raw), Reserved(ok=True)]) == [
        [("reserve",)],
        [("record", "reserved", "deny", "not_allowed", 403, "http"),
         ("refuse", 403, "not_allowed", True)],
    ]


def test_a_docs_host_is_the_docs_channels_alone() -> None:
    raw = b"GET http://docs.example/ HTTP/1.1\r\nHost: docs.example\r\n\r\n"
    shell = table(proxy_request(_context(POLICY)), [_head(raw), Reserved(ok=True)])
    assert shell[-1][-1] == ("refuse", 403, "docs_host_on_shell", True)
    docs = table(proxy_request(_context(POLICY, Channel.DOCS)), [_head(raw), Reserved(ok=True)])
    assert docs[-1] == [("resolve", "docs.example", 80)]


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "resolved_loopback"),
    ("10.1.2.3", "resolved_private"),
    ("169.254.169.254", "resolved_metadata"),
    ("169.254.1.1", "resolved_link_local"),
])
def test_a_name_resolving_below_the_floor_is_refused_before_any_dial(address: str,
                                                                     reason: str) -> None:
    rows = table(proxy_request(_context(POLICY)), [
        _head(GET), Reserved(ok=True), Resolved(addresses=(PUBLIC, ipaddress.ip_address(address))),
    ])
    assert rows[-1] == [("record", "reserved", "deny", reason, 403, "http"),
                        ("refuse", 403, reason, True)]


def test_an_unresolvable_name_is_a_502() -> None:
    rows = table(proxy_request(_context(POLICY)), [_head(GET), Reserved(ok=True),
                                                   Resolved(addresses=())])
    assert rows[-1] == [("record", "reserved", "deny", "resolve_failed", 502, "http"),
                        ("refuse", 502, "resolve_failed", True)]


def test_report_mode_lets_an_unlisted_name_through_and_says_what_would_have_been_refused() -> None:
    report = NetworkPolicy.build(allow=[], mode=Mode.REPORT)
    raw = b"GET http://unlisted.test/ HTTP/1.1\r\nHost: unlisted.test\r\n\r\n"
    handler = Handler(proxy_request(_context(report)))
    handler.handle(_head(raw))
    handler.handle(Reserved(ok=True))
    handler.handle(Resolved(addresses=(PUBLIC,)))
    handler.handle(Dialled(address=PUBLIC))
    (record,) = handler.handle(Done(status=200))
    assert isinstance(record, Record)
    assert (record.record.decision.value, record.record.would_deny) == ("allow", Reason.NOT_ALLOWED)


def test_an_ip_literal_is_dialled_as_it_is_without_resolving() -> None:
    raw = b"GET http://127.0.0.1:8080/ HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
    policy = NetworkPolicy.build(allow=[], overrides=[("127.0.0.1:8080", ["127.0.0.1/32"])])
    assert table(proxy_request(_context(policy)), [_head(raw), Reserved(ok=True)])[-1] == [
        ("dial", "127.0.0.1", 8080, ("127.0.0.1",), True)]


def test_a_spent_budget_answers_503_and_only_offers_the_record() -> None:
    assert table(proxy_request(_context(POLICY)), [_head(GET), Reserved(ok=False)]) == [
        [("reserve",)],
        [("record", "offered", "deny", "record_budget_exhausted", 503, None),
         ("refuse", 503, "record_budget_exhausted", True)],
    ]


@pytest.mark.parametrize(("raw", "status", "reason"), [
    (b"GET http://files.example/ HTTP/1.1\r\nHost: files.example\r\nContent-Length: 1\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n", 400, "smuggling_suspected"),
    (b"GET /origin-form HTTP/1.1\r\nHost: files.example\r\n\r\n", 400, "malformed_request"),
    (b"GET http://files.example/ HTTP/1.1\r\nHost: other.example\r\n\r\n", 403, "host_mismatch"),
    (b"TRACE http://files.example/ HTTP/1.1\r\nHost: files.example\r\n\r\n", 405,
     "unsupported_method"),
])
def test_a_hostile_head_is_refused_on_its_own_bytes(raw: bytes, status: int, reason: str) -> None:
    rows = table(proxy_request(_context(POLICY)), [_head(raw), Reserved(ok=True)])
    assert rows[-1][-1] == ("refuse", status, reason, True)
    assert rows[-1][0][:4] == ("record", "reserved", "deny", reason)


def test_a_head_that_could_not_be_read_is_offered_and_refused_unreserved() -> None:
    refusal = Refused(Reason.REQUEST_TIMEOUT, "request head not complete in time")
    event = HeadRefused(refusal=refusal, ts=CLOCK.iso(), started=CLOCK.monotonic())
    assert table(proxy_request(_context(POLICY)), [event]) == [
        [("record", "offered", "deny", "request_timeout", 408, None),
         ("refuse", 408, "request_timeout", True)],
    ]


def test_a_dial_that_reaches_nobody_is_a_502() -> None:
    rows = table(proxy_request(_context(POLICY)), [
        _head(GET), Reserved(ok=True), Resolved(addresses=(PUBLIC,)), Dialled(address=None)])
    assert rows[-1] == [("record", "reserved", "deny", "upstream_failed", 502, "http"),
                        ("refuse", 502, "upstream_failed", True)]


def test_the_attestation_host_is_answered_with_the_nonce_and_nothing_is_dialled() -> None:
    raw = f"GET http://{ATTESTATION_HOST}/ HTTP/1.1\r\nHost: {ATTESTATION_HOST}\r\n\r\n".encode()
    assert table(proxy_request(_context(POLICY)), [
        _head(raw), Reserved(ok=True), Done(bytes_down=120, status=200, keep_alive=True)]) == [
        [("reserve",)],
        [("answer", 200, b"the-nonce", False)],
        [("record", "reserved", "allow", "attestation", 200, "http")],
    ]
    # A client gone before its request was read whole was answered nothing.
    assert table(proxy_request(_context(POLICY)), [_head(raw), Reserved(ok=True), Done()])[-1] \
        == [("release",)]


def test_a_connect_is_carried_and_a_refused_first_flight_is_recorded_without_an_answer() -> None:
    raw = b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"
    sni = Refused(Reason.SNI_MISMATCH, "SNI 'evil.test' is not pypi.org", host="pypi.org")
    assert table(proxy_request(_context(POLICY)), [
        _head(raw), Reserved(ok=True), Resolved(addresses=(PUBLIC,)), Dialled(address=PUBLIC),
        Done(bytes_up=300, status=200, flight=FlightKind.TLS, closed=sni),
    ]) == [
        [("reserve",)],
        [("resolve", "pypi.org", 443)],
        [("dial", "pypi.org", 443, ("203.0.113.9",), False)],
        [("carry", "pypi.org", 443, True, False)],
        [("record", "reserved", "deny", "sni_mismatch", None, "https-tunnel")],
    ]


@pytest.mark.parametrize(("done", "ended", "cut"), [
    # The upstream hung up on the ClientHello: nothing came down.
    (Done(bytes_up=517, status=200, flight=FlightKind.TLS, ended=TunnelEnd.UPSTREAM_CLOSED),
     "upstream_closed", True),
    # The proxy could not start the tunnel's pumps.
    (Done(status=200, ended=TunnelEnd.PROXY_FAILED), "proxy_failed", True),
    # Reset by the upstream mid-handshake, after its first bytes.
    (Done(bytes_up=517, bytes_down=1400, status=200, flight=FlightKind.TLS,
          ended=TunnelEnd.UPSTREAM_RESET), "upstream_reset", True),
    (Done(bytes_up=900, bytes_down=5000, status=200, flight=FlightKind.TLS,
          ended=TunnelEnd.UPSTREAM_CLOSED), "upstream_closed", False),
])
def test_a_carried_tunnel_is_recorded_with_how_it_ended(done: Done, ended: str, cut: bool) -> None:
    raw = b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"
    handler = Handler(proxy_request(_context(POLICY)))
    for event in (_head(raw), Reserved(ok=True), Resolved(addresses=(PUBLIC,)),
                  Dialled(address=PUBLIC)):
        handler.handle(event)
    (command,) = handler.handle(done)
    assert show(command) == ("record", "reserved", "allow", "allowed_by_list", 200, "https-tunnel")
    assert isinstance(command, Record)
    data = command.record.to_data()
    assert (data["bytes_up"], data["bytes_down"], data["ended"], data["cut"]) == (
        done.bytes_up, done.bytes_down, ended, cut)


def test_under_inspection_plain_http_is_judged_by_method_and_its_body_capped() -> None:
    inspecting = POLICY.with_inspection(InspectionPolicy(max_body_bytes=10))
    post = (b"POST http://files.example/upload HTTP/1.1\r\nHost: files.example\r\n"
            b"Content-Length: 4\r\n\r\n")
    assert table(proxy_request(_context(inspecting)), [_head(post), Reserved(ok=True)])[-1] == [
        ("record", "reserved", "deny", "method_not_allowed", 405, "http"),
        ("refuse", 405, "method_not_allowed", True)]
    rows = table(proxy_request(_context(inspecting)), [
        _head(GET), Reserved(ok=True), Resolved(addresses=(PUBLIC,)), Dialled(address=PUBLIC)])
    assert rows[-1] == [("forward", "GET", "/simple/", "files.example", 10)]
    over = Refused(Reason.BODY_TOO_LARGE, "body over 10 bytes")
    handler = Handler(proxy_request(_context(inspecting)))
    for event in (_head(GET), Reserved(ok=True), Resolved(addresses=(PUBLIC,)),
                  Dialled(address=PUBLIC)):
        handler.handle(event)
    assert [show(c) for c in handler.handle(Done(refusal=over))] == [
        ("record", "reserved", "deny", "body_too_large", 413, "http"),
        ("refuse", 413, "body_too_large", True)]


SERVED = replace(POLICY, serve_docs=True).with_inspection(
    InspectionPolicy.build(scope=["docs.example"]))


def test_a_served_docs_host_is_read_by_the_docs_reader_and_never_resolved_or_dialled() -> None:
    raw = b"GET http://docs.example/guide HTTP/1.1\r\nHost: docs.example\r\n\r\n"
    assert table(proxy_request(_context(SERVED)), [
        _head(raw), Reserved(ok=True), PageText(text="# Guide\n"),
        Done(bytes_down=120, status=200, keep_alive=True),
    ]) == [
        [("reserve",)],
        [("read_page", "http://docs.example/guide")],
        [("answer", 200, b"# Guide\n", False)],
        [("record", "reserved", "allow", "allowed_as_page_read", 200, "http")],
    ]
    post = (b"POST http://docs.example/guide HTTP/1.1\r\nHost: docs.example\r\n"
            b"Content-Length: 0\r\n\r\n")
    assert table(proxy_request(_context(SERVED)), [_head(post), Reserved(ok=True)])[-1] == [
        ("record", "reserved", "deny", "method_not_allowed", 405, "http"),
        ("refuse", 405, "method_not_allowed", True)]
    # A tunnel to it is decrypted with nothing dialled; another host's stays opaque.
    connect = b"CONNECT docs.example:443 HTTP/1.1\r\nHost: docs.example:443\r\n\r\n"
    assert table(proxy_request(_context(SERVED)), [_head(connect), Reserved(ok=True)])[-1] == [
        ("carry", "docs.example", 443, True, True, "served")]
    pypi = b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"
    assert table(proxy_request(_context(SERVED)), [
        _head(pypi), Reserved(ok=True), Resolved(addresses=(PUBLIC,)),
        Dialled(address=PUBLIC)])[-1] == [("carry", "pypi.org", 443, True, False)]


def test_a_served_tunnels_read_is_answered_by_the_reader_and_written() -> None:
    context = _inner(InspectionPolicy())._replace(host="docs.example", resolved=None,
                                                  served=True)
    head = _head(b"GET /guide HTTP/1.1\r\nHost: docs.example\r\n\r\n")
    assert table(inner_request(context), [head, PageText(text="# Guide\n"),
                                          Done(status=200)]) == [
        [("read_page", "https://docs.example/guide")],
        [("answer", 200, b"# Guide\n", False)],
        [("record", "written", "allow", "allowed_as_page_read", 200, "https")],
    ]


def test_a_tcp_rule_is_carried_as_it_is_even_under_inspection() -> None:
    policy = NetworkPolicy.build(allow=[], tcp=["db.example:5432"]).with_inspection(
        InspectionPolicy())
    raw = b"CONNECT db.example:5432 HTTP/1.1\r\nHost: db.example:5432\r\n\r\n"
    rows = table(proxy_request(_context(policy)), [
        _head(raw), Reserved(ok=True), Resolved(addresses=(PUBLIC,)), Dialled(address=PUBLIC)])
    assert rows[-1] == [("carry", "db.example", 5432, True, False)]


def _opened(kind: str, host: str, port: int) -> FlowOpened:
    return FlowOpened(kind=kind, host=host, port=port, ts=CLOCK.iso(), started=CLOCK.monotonic())


def test_a_redirected_flow_is_decided_like_a_connect_to_its_name() -> None:
    assert table(flow(_context(POLICY)), [
        _opened("tcp", "pypi.org", 443), Reserved(ok=True), Resolved(addresses=(PUBLIC,)),
        Dialled(address=PUBLIC), Done(bytes_up=500, bytes_down=4000, flight=FlightKind.TLS),
    ]) == [
        [("reserve",)],
        [("resolve", "pypi.org", 443)],
        [("dial", "pypi.org", 443, ("203.0.113.9",), False)],
        [("carry", "pypi.org", 443, False, False)],
        [("record", "reserved", "allow", "allowed_by_list", 200, "https-tunnel")],
    ]


def test_a_refused_flow_is_closed_without_an_http_answer() -> None:
    assert table(flow(_context(POLICY)), [_opened("tcp", "evil.test", 443),
                                          Reserved(ok=True)])[-1] == [
        ("record", "reserved", "deny", "not_allowed", None, "tcp"), ("close", "not_allowed")]
    assert table(flow(_context(POLICY)), [_opened("udp", "pypi.org", 443)]) == [
        [("record", "offered", "deny", "udp_not_allowed", None, "udp"),
         ("close", "udp_not_allowed")]]


def test_a_refused_dns_name_is_one_offered_record_built_like_every_other() -> None:
    refused = NameRefused(name="exfil.example.com", qtype="TXT",
                          decision=decide_dns(POLICY, "exfil.example.com"),
                          ts=CLOCK.iso(), started=CLOCK.monotonic())
    (row,) = run_table(dns_refusal(Channel.SHELL, CLOCK), [refused])
    assert [show(c) for c in row] == [("record", "offered", "deny", "dns_not_allowed", None, "dns")]
    (command,) = row
    assert isinstance(command, Record)
    assert command.record.to_data() == {
        "ts": "2026-01-01T00:00:00.000Z", "id": "0" * 32, "channel": "shell", "method": "TXT",
        "scheme": "dns", "host": "exfil.example.com", "port": 53, "path": None,
        "decision": "deny", "reason": "dns_not_allowed", "layer": "default", "would_deny": None,
        "override": None, "resolved": None, "status": None, "bytes_up": 0, "bytes_down": 0,
        "duration_ms": 0.0, "credentials": [], "capture": "transparent",
    }


def test_an_abandoned_exchange_still_settles_its_reservation() -> None:
    resolving = Handler(proxy_request(_context(POLICY)))
    resolving.handle(_head(GET))
    resolving.handle(Reserved(ok=True))
    assert [show(c) for c in resolving.abandon()] == [("release",)]
    forwarding = Handler(proxy_request(_context(POLICY)))
    for event in (_head(GET), Reserved(ok=True), Resolved(addresses=(PUBLIC,)),
                  Dialled(address=PUBLIC)):
        forwarding.handle(event)
    # What the cut forward had carried is in the record.
    assert [show(c) for c in forwarding.abandon(Done(bytes_down=900, status=200))] == [
        ("record", "reserved", "allow", "allowed_by_list", 200, "http")]
    assert forwarding.abandon() == []


# -- inside an inspected tunnel -------------------------------------------------------


def _inner(policy: InspectionPolicy, *, upstream_refusal: Refused | None = None,
           env: dict[str, str] | None = None) -> InnerContext:
    return InnerContext(channel=Channel.SHELL, policy=policy, host="pypi.org", port=443,
                        resolved="203.0.113.9", credentials=mint(policy.credentials, env or {}),
                        clock=CLOCK, max_head_bytes=65536, upstream_refusal=upstream_refusal)


def test_a_decrypted_read_is_forwarded_with_its_host_and_recorded_as_written() -> None:
    head = _head(b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n")
    assert table(inner_request(_inner(InspectionPolicy())), [head, Done(status=200)]) == [
        [("forward", "GET", "/simple/", "pypi.org", InspectionPolicy().max_body_bytes)],
        [("record", "written", "allow", "allowed_read_only", 200, "https")],
    ]


@pytest.mark.parametrize(("raw", "status", "reason"), [
    (b"POST /legacy/ HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 3\r\n\r\n", 405,
     "method_not_allowed"),
    (b"GET /simple/ HTTP/1.1\r\nHost: other.example\r\n\r\n", 403, "host_mismatch"),
    (b"GET /simple/ HTTP/1.0\r\n\r\n", 403, "host_mismatch"),
    (b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", 400, "malformed_request"),
])
def test_a_decrypted_request_is_refused_before_a_byte_goes_up(raw: bytes, status: int,
                                                              reason: str) -> None:
    assert table(inner_request(_inner(InspectionPolicy())), [_head(raw)]) == [
        [("record", "written", "deny", reason, status, "https"),
         ("refuse", status, reason, True)]]


def test_a_server_that_failed_verification_refuses_every_request() -> None:
    invalid = Refused(Reason.UPSTREAM_CERTIFICATE_INVALID, "pypi.org: self-signed", host="pypi.org")
    head = _head(b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n")
    assert table(inner_request(_inner(InspectionPolicy(), upstream_refusal=invalid)), [head]) == [
        [("record", "written", "deny", "upstream_certificate_invalid", 502, "https"),
         ("refuse", 502, "upstream_certificate_invalid", True)]]


def test_a_credential_is_swapped_in_only_for_its_own_host() -> None:
    policy = InspectionPolicy.build(credentials=[("TOKEN", "pypi.org", "REAL_TOKEN")])
    context = _inner(policy, env={"REAL_TOKEN": "s3cret"})
    (placeholder,) = (c.placeholder for c in context.credentials)
    head = _head(b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\nAuthorization: Bearer "
                 + placeholder.encode() + b"\r\n\r\n")
    handler = Handler(inner_request(context))
    (forward,) = handler.handle(head)
    assert isinstance(forward, Forward)
    assert (b"authorization", b"Bearer s3cret") in list(forward.request.headers)
    (record,) = handler.handle(Done(status=200))
    assert isinstance(record, Record) and record.record.credentials == ("TOKEN",)


def test_a_refusals_answer_is_one_line_and_closes() -> None:
    refusal = Refused(Reason.NOT_ALLOWED, "evil.test", host="evil.test")
    data = refusal_answer(refusal, "GET")
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    response = conn.next_event()
    assert isinstance(response, h11.Response) and response.status_code == 403
    assert (b"x-firstrun-reason", b"not_allowed") in list(response.headers)
    assert (b"connection", b"close") in list(response.headers)
    body = conn.next_event()
    assert isinstance(body, h11.Data)
    assert body.data == b"firstrun proxy: not_allowed: evil.test\n"
    assert refusal_answer(refusal, "HEAD") == data[: data.index(b"\r\n\r\n") + 4]
