"""Decision tables: the proxy's request judgement and the policy it asks, with no sockets."""

from __future__ import annotations

import ipaddress

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstrun.policy.decision import Reason, Verdict
from firstrun.policy.network import (
    ATTESTATION_HOST,
    Channel,
    Mode,
    NetworkPolicy,
    Request,
    decide_addresses,
    decide_name,
)
from firstrun.proxy.errors import Refused
from firstrun.proxy.request import (
    Action,
    classify_request,
    parse_authority,
    parse_target,
    upstream_headers,
)

pytestmark = pytest.mark.fast

POLICY = NetworkPolicy.build(docs=["docs.example.org"])


def _parse(raw: bytes) -> tuple[h11.Request, bytes]:
    """Let h11 parse a head, and return it with the exact bytes it consumed."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    event = conn.next_event()
    assert isinstance(event, h11.Request)
    return event, raw[: len(raw) - len(conn.trailing_data[0])]


def _refusal(fn, *args, **kwargs) -> Reason:  # type: ignore[no-untyped-def]
    with pytest.raises(Refused) as info:
        fn(*args, **kwargs)
    return info.value.reason


# -- authorities and ports ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pypi.org:443", ("pypi.org", 443)),
        ("PyPI.Org.:443", ("pypi.org", 443)),
        ("pypi.org:1", ("pypi.org", 1)),
        ("pypi.org:65535", ("pypi.org", 65535)),
        ("[::1]:443", ("::1", 443)),
        ("[::ffff:127.0.0.1]:80", ("127.0.0.1", 80)),
        ("2130706433:80", ("127.0.0.1", 80)),
        ("0177.0.0.1:80", ("127.0.0.1", 80)),
        ("0x7f000001:80", ("127.0.0.1", 80)),
        ("bücher.example:443", ("xn--bcher-kva.example", 443)),
        # The name the client dials, not IDNA 2003's fass.de.
        ("faß.de:443", ("xn--fa-hia.de", 443)),
        ("xn--fa-hia.de:443", ("xn--fa-hia.de", 443)),
    ],
)
def test_authority_canonical_forms(text: str, expected: tuple[str, int]) -> None:
    assert parse_authority(text, default_port=None) == expected


@pytest.mark.parametrize(
    "text",
    [
        "pypi.org:0443",  # leading zero: one destination, one spelling
        "pypi.org:+443",
        "pypi.org:443 ",
        "pypi.org: 443",
        "pypi.org:",
        "pypi.org:0",
        "pypi.org:65536",
        "pypi.org:4430000",
        "pypi.org:44３",  # a non-ASCII digit
        "pypi.org",  # CONNECT needs a port
        "user@pypi.org:443",
        "user:pw@pypi.org:443",
        "pypi.org:443/path",
        "pypi.org:443?q",
        "::1:443",
        "[::1]443",
        "[fe80::1%25eth0]:443",
        ":443",
        "",
    ],
)
def test_authority_refusals(text: str) -> None:
    assert _refusal(parse_authority, text, default_port=None) is Reason.MALFORMED_REQUEST


@pytest.mark.parametrize(
    "text", ["pypi..org:443", "-pypi.org:443", "py_pi!.org:443", "xn--zz.org:443"]
)
def test_invalid_host_names(text: str) -> None:
    assert _refusal(parse_authority, text, default_port=None) is Reason.INVALID_HOST


def test_absolute_form_defaults_to_port_80() -> None:
    assert parse_authority("pypi.org", default_port=80) == ("pypi.org", 80)


# -- request targets --------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "action", "host", "port", "path"),
    [
        ("GET", "http://pypi.org/simple/", Action.FORWARD, "pypi.org", 80, "/simple/"),
        ("GET", "HTTP://PYPI.ORG:8080", Action.FORWARD, "pypi.org", 8080, "/"),
        ("GET", "http://pypi.org?x=1", Action.FORWARD, "pypi.org", 80, "/?x=1"),
        ("HEAD", "http://pypi.org/a?b", Action.FORWARD, "pypi.org", 80, "/a?b"),
        ("CONNECT", "pypi.org:443", Action.TUNNEL, "pypi.org", 443, None),
        ("GET", f"http://{ATTESTATION_HOST}/", Action.ATTEST, ATTESTATION_HOST, 80, "/"),
    ],
)
def test_targets(
    method: str, target: str, action: Action, host: str, port: int, path: str | None
) -> None:
    parsed = parse_target(method, target)
    assert (parsed.action, parsed.host, parsed.port, parsed.path) == (action, host, port, path)


@pytest.mark.parametrize(
    ("method", "target", "reason"),
    [
        ("GET", "/simple/", Reason.MALFORMED_REQUEST),  # origin-form sent to a proxy
        ("OPTIONS", "*", Reason.MALFORMED_REQUEST),
        ("GET", "https://pypi.org/", Reason.MALFORMED_REQUEST),
        ("GET", "ftp://pypi.org/", Reason.MALFORMED_REQUEST),
        ("GET", "http://pypi.org/#frag", Reason.MALFORMED_REQUEST),
        ("GET", "http:///path", Reason.MALFORMED_REQUEST),
        ("GET", "http://user@pypi.org/", Reason.MALFORMED_REQUEST),
        ("GET", "http://pypi.org@evil.com/", Reason.MALFORMED_REQUEST),
        ("CONNECT", "pypi.org:443/path", Reason.MALFORMED_REQUEST),
        ("CONNECT", "pypi.org", Reason.MALFORMED_REQUEST),
        ("TRACE", "http://pypi.org/", Reason.UNSUPPORTED_METHOD),
        ("POST", f"http://{ATTESTATION_HOST}/", Reason.UNSUPPORTED_METHOD),
    ],
)
def test_target_refusals(method: str, target: str, reason: Reason) -> None:
    assert _refusal(parse_target, method, target) is reason


# -- whole heads, parsed by h11 -------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            b"POST http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            Reason.SMUGGLING_SUSPECTED,
        ),
        (
            b"POST http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 5\r\n"
            b"Content-Length: 5\r\n\r\n",
            Reason.SMUGGLING_SUSPECTED,
        ),
        (
            b"POST http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 5, 5\r\n\r\n",
            Reason.SMUGGLING_SUSPECTED,
        ),
        (
            b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nX-A: a\r\n b\r\n\r\n",
            Reason.SMUGGLING_SUSPECTED,
        ),
        (
            b"GET http://pypi.org/ HTTP/1.1\r\nHost: evil.com\r\n\r\n",
            Reason.HOST_MISMATCH,
        ),
        (
            b"GET http://pypi.org:8080/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            Reason.HOST_MISMATCH,
        ),
        (
            b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org.evil.com\r\n\r\n",
            Reason.HOST_MISMATCH,
        ),
        (b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n", Reason.HOST_MISMATCH),
        (b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:8443\r\n\r\n", Reason.HOST_MISMATCH),
        (
            b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nContent-Length: 3\r\n\r\n",
            Reason.MALFORMED_REQUEST,
        ),
    ],
)
def test_head_refusals(raw: bytes, reason: Reason) -> None:
    event, head = _parse(raw)
    assert _refusal(classify_request, event, head, max_head_bytes=65536) is reason


@pytest.mark.parametrize(
    "raw",
    [
        b"GET http://pypi.org/ HTTP/1.1\r\nHost: PYPI.org.\r\n\r\n",
        b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org:80\r\n\r\n",
        b"GET http://pypi.org/ HTTP/1.0\r\n\r\n",
        b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
        b"CONNECT pypi.org:443 HTTP/1.0\r\n\r\n",
    ],
)
def test_heads_that_agree(raw: bytes) -> None:
    event, head = _parse(raw)
    assert classify_request(event, head, max_head_bytes=65536).host == "pypi.org"


def test_oversize_head_refused_even_when_it_arrives_whole() -> None:
    raw = b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nX: " + b"a" * 2000 + b"\r\n\r\n"
    event, head = _parse(raw)
    assert _refusal(classify_request, event, head, max_head_bytes=1024) is Reason.HEADERS_TOO_LARGE


def test_upstream_headers_drop_hop_by_hop_and_proxy_headers() -> None:
    event, _ = _parse(
        b"POST http://pypi.org:8080/x HTTP/1.1\r\nHost: pypi.org:8080\r\n"
        b"Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n"
        b"Connection: x-private, content-length\r\nX-Private: 1\r\nKeep-Alive: 5\r\n"
        b"TE: trailers\r\nUpgrade: websocket\r\nExpect: 100-continue\r\n"
        b"Accept: */*\r\nContent-Length: 2\r\n\r\nhi"
    )
    target = parse_target("POST", "http://pypi.org:8080/x")
    assert upstream_headers(list(event.headers), target) == [
        (b"host", b"pypi.org:8080"),
        (b"accept", b"*/*"),
        # Named in Connection, but framing stays: it is what h11 validated.
        (b"content-length", b"2"),
    ]


# -- the policy, as the proxy asks it ----------------------------------------------


def _name(host: str, port: int = 443, channel: Channel = Channel.SHELL, policy=POLICY):  # type: ignore[no-untyped-def]
    return decide_name(policy, Request(channel=channel, host=host, port=port))


@pytest.mark.parametrize(
    ("host", "port", "reason"),
    [
        ("pypi.org", 443, Reason.ALLOWED_BY_LIST),
        ("PYPI.ORG", 443, Reason.ALLOWED_BY_LIST),
        ("pypi.org.", 443, Reason.ALLOWED_BY_LIST),
        ("user@pypi.org", 443, Reason.ALLOWED_BY_LIST),
        ("pypi.org", 80, Reason.ALLOWED_BY_LIST),
        ("evilpypi.org", 443, Reason.NOT_ALLOWED),
        ("pypi.org.evil.com", 443, Reason.NOT_ALLOWED),
        ("pypi.org@evil.com", 443, Reason.NOT_ALLOWED),
        ("sub.pypi.org", 443, Reason.NOT_ALLOWED),
        ("pypi.org", 8443, Reason.PORT_NOT_ALLOWED),
        ("pypi.org", 22, Reason.PORT_NOT_ALLOWED),
        ("127.0.0.1", 443, Reason.IP_LITERAL),
        ("2130706433", 443, Reason.IP_LITERAL),
        ("0177.0.0.1", 443, Reason.IP_LITERAL),
        ("0x7f000001", 443, Reason.IP_LITERAL),
        ("[::ffff:127.0.0.1]", 443, Reason.IP_LITERAL),
        ("169.254.169.254", 80, Reason.IP_LITERAL),
        ("docs.example.org", 443, Reason.DOCS_HOST_ON_SHELL),
        ("DOCS.example.org.", 443, Reason.DOCS_HOST_ON_SHELL),
        ("pypi..org", 443, Reason.INVALID_HOST),
    ],
)
def test_name_decisions_on_shell(host: str, port: int, reason: Reason) -> None:
    decision = _name(host, port)
    assert decision.reason is reason
    assert decision.allowed is (reason is Reason.ALLOWED_BY_LIST)


@pytest.mark.parametrize(
    ("host", "reason", "allowed"),
    [
        ("docs.example.org", Reason.ALLOWED_DOCS_CHANNEL, True),
        ("pypi.org", Reason.NOT_DOCS_HOST, False),
    ],
)
def test_docs_channel_reaches_only_docs_hosts(host: str, reason: Reason, allowed: bool) -> None:
    decision = _name(host, channel=Channel.DOCS)
    assert (decision.reason, decision.allowed) == (reason, allowed)


def test_explicit_ip_listing_is_the_only_way_to_an_ip_literal() -> None:
    policy = NetworkPolicy.build(allow=["93.184.216.34"])
    assert _name("93.184.216.34", policy=policy).allowed
    assert _name("1572395042", policy=policy).allowed  # the same address, in decimal
    assert not _name("93.184.216.35", policy=policy).allowed


@pytest.mark.parametrize(
    ("addresses", "reason"),
    [
        (["151.101.0.223"], Reason.ALLOWED_BY_LIST),
        (["151.101.0.223", "10.0.0.1"], Reason.RESOLVED_PRIVATE),
        (["127.0.0.1"], Reason.RESOLVED_LOOPBACK),
        (["169.254.169.254"], Reason.RESOLVED_METADATA),
        (["100.64.0.1"], Reason.RESOLVED_CGNAT),
        (["::ffff:127.0.0.1"], Reason.RESOLVED_EMBEDDED_IPV4),
        (["fd00::1"], Reason.RESOLVED_PRIVATE),
        ([], Reason.RESOLVE_FAILED),
    ],
)
def test_address_decisions(addresses: list[str], reason: Reason) -> None:
    request = Request(channel=Channel.SHELL, host="pypi.org", port=443)
    ips = [ipaddress.ip_address(a) for a in addresses]
    assert decide_addresses(POLICY, request, ips).reason is reason


def test_report_mode_allows_with_would_deny() -> None:
    policy = NetworkPolicy.build(mode=Mode.REPORT)
    decision = _name("evil.com", policy=policy)
    assert decision.verdict is Verdict.ALLOW
    assert decision.would_deny is Reason.NOT_ALLOWED
    # The floor is not part of an allow-list: report mode still enforces it.
    request = Request(channel=Channel.SHELL, host="pypi.org", port=443)
    for address in ("10.1.2.3", "127.0.0.1", "169.254.169.254", "::ffff:127.0.0.1"):
        by_address = decide_addresses(policy, request, [ipaddress.ip_address(address)])
        assert (by_address.verdict, by_address.would_deny) == (Verdict.DENY, None)
    assert _name("0x7f.1", policy=policy).verdict is Verdict.ALLOW  # a name rule: reported
    assert _name("bad host", policy=policy).verdict is Verdict.DENY  # malformed: refused


@given(port=st.integers(min_value=1, max_value=65535), host=st.sampled_from(["pypi.org", "[::1]"]))
def test_every_port_has_exactly_one_spelling(port: int, host: str) -> None:
    assert parse_authority(f"{host}:{port}", default_port=None)[1] == port
    for spelling in (f"0{port}", f"+{port}", f"{port} ", f" {port}", f"{port}.0", f"{port:#x}"):
        assert _refusal(parse_authority, f"{host}:{spelling}", default_port=None) is Reason.MALFORMED_REQUEST
