"""The proxy's parsing and decision path under generated input, sans-io and over loopback sockets.

Guarantee: for every request head, CONNECT authority, TLS ClientHello and
tunnel first flight generated here, the proxy raises nothing but its own
``Refused`` (and h11's ``RemoteProtocolError``, which it maps to one); lets
nothing go unless the pure policy decisions (``decide_name``, then
``decide_addresses``; ``decide_stream`` for a raw stream) allow every host a
party reading the bytes per RFC 9112 / RFC 6066 could route them to; and,
on real sockets, writes exactly the records the pure decisions predict (one
per decided request or tunnel) and keeps answering the next client.

Bounded and reproducible: derandomised, a fixed number of cases per test,
and the count of cases each test ran is printed to the terminal.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import ipaddress
import logging
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption
from proxy_fixtures import EchoServer, connect, read_reply, read_until_closed

from firstrun.errors import PolicyError
from firstrun.policy.addresses import IPAddress
from firstrun.policy.decision import Decision, Reason, Verdict
from firstrun.policy.hosts import canonical_host, parse_ip_literal
from firstrun.policy.network import (
    ATTESTATION_HOST,
    Channel,
    Mode,
    NetworkPolicy,
    Request,
    decide_addresses,
    decide_name,
    decide_stream,
)
from firstrun.proxy.errors import Refused, refusal_for_protocol_error
from firstrun.proxy.flight import Flight, FlightKind, judge_first_flight, judge_flight, read_flight
from firstrun.proxy.records import Capture, EgressRecord
from firstrun.proxy.request import ATTEST_METHODS, FORWARD_METHODS, Action, Target, classify_request
from firstrun.proxy.server import EgressProxy, ListenerKind, ProxyLimits
from firstrun.proxy.tls import HelloStatus, parse_client_hello

pytestmark = [pytest.mark.fast, pytest.mark.timeout(180)]

MAX_HEAD = ProxyLimits().max_head_bytes

# The same cases every run: CI failures reproduce, and no example database is written.
_FUZZ = dict(derandomize=True, database=None, deadline=None, print_blob=False,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SANS_IO = settings(max_examples=200, **_FUZZ)
SOCKETS = settings(max_examples=60, **_FUZZ)

CASES: Counter[str] = Counter()


def counted(test: Callable[..., None]) -> Callable[..., None]:
    """Count each case a test runs (not those ``assume`` threw away), for ``_report_cases``."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            test(*args, **kwargs)
        except UnsatisfiedAssumption:
            raise
        except BaseException:
            CASES[test.__name__] += 1
            raise
        CASES[test.__name__] += 1
    return run


@pytest.fixture(autouse=True)
def _report_cases(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    started = time.monotonic()
    yield
    name = request.node.name
    with capsys.disabled():
        print(f"\n[fuzz] {name}: {CASES[name]} cases in {time.monotonic() - started:.1f} s "
              f"({sum(CASES.values())} in this module so far)")


# -- what gets generated ------------------------------------------------------------------

# ``{up}`` and ``{echo}`` stand for the two ports an override opens (the loopback
# servers' ports on the socket layer), so generated text can name them.
HOSTS = (
    "pypi.test", "PyPI.Test.", "pypi.org", "files.pythonhosted.org", "git.test", "evil.test",
    "deny.test", "docs.example.org", "a.wild.test", ATTESTATION_HOST, "127.0.0.1", "2130706433",
    "0x7f.1", "[::1]", "[::ffff:127.0.0.1]", "93.184.216.34", "pypi.test.evil.test", "evilpypi.test",
    "pypi..test", "-pypi.test", "xn--bcher-kva.example", "bücher.example", "user@pypi.test",
    "pypi.test@evil.test", "pypi.test%2f", "pypi.test\\evil.test", "",
)
PORTS = ("{up}", "{echo}", "80", "443", "22", "8080", "0443", "+80", "", " 80", "0", "65536",
         "99999999999", "８0", "{up}0", "0{echo}")
SCHEMES = ("http://", "HTTP://", "https://", "ftp://", "http:/", "//", "")
PATHS = ("", "/", "/a", "?q=1", "/a?b", "/a#frag", "//evil.test/x", "/%2e%2e/", "@evil.test/",
         ":{up}/")
ORIGIN_TARGETS = ("/", "/simple/", "/a?b=c", "*", "//evil.test/", "/ x")
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE", "get",
           "G ET", "GET\t")
VERSIONS = ("HTTP/1.0", "HTTP/2.0", "HTTP/1.1 ", "http/1.1", "HTTP/1.1\r", "")
HEADER_NAMES = ("Content-Length", "Transfer-Encoding", "Connection", "Expect", "Proxy-Authorization",
                "Proxy-Connection", "Upgrade", "X-Fuzz", "Host ", " Host", "Hos t")
HEADER_VALUES = ("0", "3", "5, 5", "-1", "chunked", "gzip", "chunked, chunked", "close",
                 "keep-alive, x-fuzz", "100-continue", "websocket", "")
SEPARATORS = (": ", ":", ":\t", " : ")


def mostly(common: st.SearchStrategy[Any], *rare: st.SearchStrategy[Any], odds: int = 6) -> st.SearchStrategy[Any]:
    """``common`` about ``odds`` times in ``odds + 1``: noise in every part at once would leave
    nothing well formed enough to reach a decision."""
    # Not one_of(common, common, ...): it merges equal branches back into one.
    return st.sampled_from((True,) * odds + (False,)).flatmap(lambda usual: common if usual else st.one_of(*rare))


host_texts = st.one_of(
    st.sampled_from(HOSTS),
    st.from_regex(r"[a-zA-Z0-9._\-\[\]:@%]{0,20}", fullmatch=True),
    st.text(max_size=6),
)
port_texts = st.one_of(st.sampled_from(PORTS), st.integers(0, 70000).map(str))


def _authority(host: str, port: str | None) -> str:
    return host if port is None else f"{host}:{port}"


authorities = st.builds(_authority, host_texts, st.none() | port_texts)
# Edits of the rendered bytes: (where, how many bytes to drop, what to put there).
mutations = mostly(
    st.just(()),
    st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 3), st.binary(max_size=3)),
             min_size=1, max_size=3).map(tuple),
    odds=3,
)


def _mutate(data: bytes, edits: Sequence[tuple[int, int, bytes]]) -> bytes:
    for where, drop, insert in edits:
        at = where % (len(data) + 1)
        data = data[:at] + insert + data[at + drop:]
    return data


def _fill(text: str, up: int, echo: int) -> str:
    return text.replace("{up}", str(up)).replace("{echo}", str(echo))


@dataclass(frozen=True)
class Head:
    """An HTTP/1 request head as parts, rendered once the ports are known."""

    request_line: str
    lines: tuple[str, ...]
    eol: str
    body: bytes
    edits: tuple[tuple[int, int, bytes], ...]

    def render(self, up: int, echo: int) -> bytes:
        text = self.eol.join((self.request_line, *self.lines)) + self.eol + self.eol
        return _mutate(_fill(text, up, echo).encode("utf-8", "replace") + self.body, self.edits)


@st.composite
def heads(draw: st.DrawFn, form: str = "proxy") -> Head:
    """``form``: "proxy" (absolute-form and CONNECT), "connect" or "origin" (a tunnel's first flight)."""
    if form == "connect":
        method = draw(mostly(st.just("CONNECT"), st.sampled_from(METHODS)))
    else:
        method = draw(mostly(st.sampled_from(("GET", "POST", "HEAD", "PUT")), st.sampled_from(METHODS),
                             st.from_regex(r"[A-Z]{1,13}", fullmatch=True)))
    host = draw(mostly(st.just("pypi.test"), host_texts, odds=2))
    port = draw(mostly(st.just("{echo}" if form == "connect" else "{up}"), st.none(), port_texts, odds=3))
    authority = _authority(host, port)
    absolute = st.builds(lambda scheme, path: scheme + authority + path,
                         mostly(st.just("http://"), st.sampled_from(SCHEMES)),
                         mostly(st.sampled_from(("/", "/simple/", "?q=1", "")), st.sampled_from(PATHS),
                                st.from_regex(r"[/?a-z0-9%@:.#]{0,12}", fullmatch=True), odds=3))
    if form == "origin":
        target = draw(mostly(st.sampled_from(ORIGIN_TARGETS[:3]), st.sampled_from(ORIGIN_TARGETS), absolute,
                             odds=3))
    elif method == "CONNECT":
        target = authority + draw(mostly(st.just(""), st.sampled_from(("/", "/x", "?q"))))
    else:
        target = draw(mostly(absolute, st.sampled_from(ORIGIN_TARGETS), st.just(authority)))
    version = draw(mostly(st.sampled_from(("HTTP/1.1", "HTTP/1.1", "HTTP/1.0")), st.sampled_from(VERSIONS)))
    host_value = mostly(st.just(authority), st.just(host), authorities, odds=3)
    host_values = draw(mostly(st.lists(host_value, min_size=1, max_size=1), st.lists(host_value, max_size=2)))
    host_name = mostly(st.just("Host"), st.sampled_from(("host", "HOST")))
    separator = mostly(st.just(": "), st.sampled_from(SEPARATORS))
    lines = [draw(host_name) + draw(separator) + value for value in host_values]
    for _ in range(draw(mostly(st.just(0), st.integers(1, 3), odds=2))):
        name = draw(st.one_of(st.sampled_from(HEADER_NAMES), st.from_regex(r"[A-Za-z-]{1,8}", fullmatch=True)))
        value = draw(mostly(st.sampled_from(HEADER_VALUES), st.text(max_size=8), odds=3))
        lines.append(name + draw(separator) + value)
    if draw(mostly(st.just(False), st.just(True), odds=10)):
        lines.append(draw(host_name) + ": " + draw(authorities))
        lines.append(" folded")
    return Head(
        request_line=f"{method} {target} {version}",
        lines=tuple(draw(st.permutations(lines))),
        eol=draw(mostly(st.just("\r\n"), st.just("\n"))),
        body=draw(mostly(st.just(b""), st.sampled_from((b"abc", b"0\r\n\r\n")), st.binary(max_size=8), odds=3)),
        edits=draw(mutations),
    )


_EXT_SNI, _EXT_ECH, _EXT_ESNI = 0x0000, 0xFE0D, 0xFFCE
SNI_NAMES = (b"pypi.test", b"PyPI.Test.", b"pypi.org", b"evil.test", b"pypi.test.evil.test", b"",
             "bücher.example".encode(), b"pypi.test\x00evil.test", b"127.0.0.1", b"pypi.test:443",
             b"pypi.test ", b"*.test")


def _vector(data: bytes, width: int) -> bytes:
    return len(data).to_bytes(width, "big") + data


@dataclass(frozen=True)
class HelloCase:
    """A ClientHello built field by field, and what it says when no edit touched it."""

    data: bytes
    # The host_name entries of every server_name extension, when the bytes are as built.
    names: tuple[bytes, ...] | None
    encrypted: bool

    def render(self, up: int = 0, echo: int = 0) -> bytes:
        return self.data


@st.composite
def hellos(draw: st.DrawFn) -> HelloCase:
    sni_name = mostly(st.just(b"pypi.test"), st.sampled_from(SNI_NAMES), st.binary(max_size=12), odds=2)
    entry = st.tuples(mostly(st.just(0), st.sampled_from((1, 255))), sni_name)
    sni_entries = mostly(st.lists(entry, min_size=1, max_size=1), st.lists(entry, max_size=3))
    extensions: list[tuple[int, bytes]] = []
    names: list[bytes] = []
    for entries in draw(mostly(st.lists(sni_entries, min_size=1, max_size=1), st.lists(sni_entries, max_size=2))):
        names += [name for kind, name in entries if kind == 0]
        payload = _vector(b"".join(bytes([kind]) + _vector(name, 2) for kind, name in entries), 2)
        extensions.append((_EXT_SNI, payload + draw(mostly(st.just(b""), st.just(b"\x00")))))
    others = draw(st.lists(mostly(st.sampled_from((0x002B, 0x000A, 0x1234)), st.sampled_from((_EXT_ECH, _EXT_ESNI))),
                           max_size=3))
    extensions += [(kind, draw(st.binary(max_size=6))) for kind in others]
    extensions = draw(st.permutations(extensions))
    ext_bytes = b"".join(kind.to_bytes(2, "big") + _vector(data, 2) for kind, data in extensions)
    body = (
        draw(mostly(st.just(b"\x03\x03"), st.sampled_from((b"\x03\x01", b"\xff\xff"))))
        + bytes(32)
        + _vector(bytes(draw(mostly(st.sampled_from((0, 32)), st.just(33)))), 1)
        + _vector(draw(mostly(st.sampled_from((b"\x13\x01", b"\x13\x01\x13\x02")), st.sampled_from((b"", b"\x13")))), 2)
        + _vector(draw(mostly(st.just(b"\x00"), st.just(b""))), 1)
        + (_vector(ext_bytes, 2) if extensions or draw(st.booleans()) else b"")
    )
    handshake = draw(mostly(st.just(b"\x01"), st.just(b"\x02"))) + _vector(body, 3)
    size = draw(st.one_of(st.just(1 << 14), st.integers(1, 300)))
    version = draw(mostly(st.sampled_from((b"\x03\x01", b"\x03\x03")), st.just(b"\x02\x00")))
    data = b"".join(b"\x16" + version + _vector(handshake[i:i + size], 2)
                    for i in range(0, len(handshake), size))
    edits = draw(mutations)
    cut = draw(mostly(st.none(), st.integers(0, len(data)), odds=4))
    edited = _mutate(data, edits)[:cut]
    # Bytes after the hello's records are the next record: they change nothing it says.
    tail = draw(mostly(st.just(b""), st.binary(max_size=8), st.just(b"\x17\x03\x03\x00\x01x"), odds=4))
    untouched = not edits and cut in (None, len(data))
    return HelloCase(data=edited + tail, names=tuple(names) if untouched else None,
                     encrypted=bool({_EXT_ECH, _EXT_ESNI} & set(others)))


@dataclass(frozen=True)
class RawCase:
    data: bytes

    def render(self, up: int = 0, echo: int = 0) -> bytes:
        return self.data


raw_streams = st.one_of(
    st.sampled_from((b"", b"SSH-2.0-OpenSSH_9.2\r\n", b"\x00\x00\x00\x08\x04\xd2\x16\x2f", b"GE", b"GET",
                     b"GET / HTTP/1.1\r\n", b"ABCDEFGHIJKLMN / HTTP/1.1\r\n\r\n")),
    st.binary(max_size=48),
).map(RawCase)
FlightCase = Head | HelloCase | RawCase
flights = st.one_of(hellos(), heads("origin"), raw_streams)


# -- the reference: what a party reading the bytes could take them to name ----------------


def _head_lines(raw: bytes) -> list[str]:
    """RFC 9112's lines of the first head: LF ends a line (a CR before it is dropped), an empty line ends the head."""
    lines = []
    for line in raw.decode("latin-1").split("\n"):
        line = line.removesuffix("\r")
        if not line:
            break
        lines.append(line)
    return lines


def _canonical(name: str) -> str | None:
    try:
        return canonical_host(name)
    except PolicyError:
        return None


def _authority_reading(text: str, default_port: int | None) -> tuple[str, int] | None:
    """``host[:port]`` read leniently; None when nobody could route on it."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else (None if not rest else "?")
    else:
        host, sep, port_text_raw = text.rpartition(":")
        host, port_text = (host, port_text_raw) if sep else (text, None)
    if port_text is None:
        port = default_port
    else:
        port = int(port_text) if port_text.isascii() and port_text.isdigit() else None
    name = _canonical(host)
    return (name, port) if name is not None and port is not None else None


def _target_reading(method: str, target: str) -> tuple[str, int] | None:
    """Where a request-target's own authority points, when it has one."""
    if method == "CONNECT":
        return _authority_reading(target, None)
    if "://" not in target:
        return None
    parts = urlsplit(target)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    name = _canonical(parts.hostname or "")
    return (name, port) if name is not None and port is not None else None


@dataclass(frozen=True)
class Readings:
    target: tuple[str, int] | None
    hosts: tuple[tuple[str, int] | None, ...]


def head_readings(raw: bytes) -> Readings:
    """Every destination a proxy request's head names: its target's authority and each Host."""
    lines = _head_lines(raw)
    parts = lines[0].split(" ") if lines else []
    method, target = (parts[0], parts[1]) if len(parts) == 3 else ("", "")
    target_reading = _target_reading(method, target)
    default = target_reading[1] if method == "CONNECT" and target_reading else 80
    hosts = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name.lower() == "host":
            hosts.append(_authority_reading(value.strip(" \t"), default))
    return Readings(target=target_reading, hosts=tuple(hosts))


def flight_names(data: bytes) -> list[str]:
    """The names an origin server would route a first flight by, if it is an HTTP request.

    RFC 9112 section 3.2.2: a target's own authority (absolute- or authority-form) wins over Host.
    """
    lines = _head_lines(data)
    if not lines or not re.fullmatch(r"[!-~]+ [!-~]+ HTTP/[0-9.]+", lines[0]):
        return []
    names = []
    target = lines[0].split(" ")[1]
    if "://" in target:
        names.append(urlsplit(target).hostname or target)
    elif not target.startswith("/") and target != "*":
        reading = _authority_reading(target, 0)
        names.append(reading[0] if reading else target)
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name.lower() == "host":
            value = value.strip(" \t")
            reading = _authority_reading(value, 0)
            names.append(reading[0] if reading else value)
    return names


def flight_violations(policy: NetworkPolicy, case: FlightCase, data: bytes, flight: Flight,
                      host: str, port: int, connect: bool) -> list[str]:
    """Why the pure decisions would not let ``data`` go to ``host:port``; empty when they would."""
    if decide_stream(policy, host, port, connect=connect).allowed:
        return []  # a raw stream there is allowed: any bytes may go
    problems = []
    names = flight_names(data)
    if isinstance(case, HelloCase) and case.names is not None:
        names += [name.decode("utf-8", "replace") for name in case.names]
        if case.encrypted:
            problems.append("the ClientHello hides its server name (ECH)")
    elif flight.kind is FlightKind.TLS and flight.hello is not None:
        names += [flight.hello.sni] if flight.hello.sni is not None else []
        if flight.hello.ech:
            problems.append("the ClientHello hides its server name (ECH)")
    if flight.kind is FlightKind.RAW:
        problems.append("a raw stream no tcp rule or CONNECT entry covers")
    for name in names:
        if _canonical(name) != host:
            problems.append(f"the flight names {name!r}, not {host}")
        elif not decide_name(policy, Request(channel=Channel.SHELL, host=name, port=port)).allowed:
            problems.append(f"decide_name refuses {name!r}:{port}")
    return problems


# -- the sans-io path, as the server composes it --------------------------------------------


Resolve = Callable[[str], list[IPAddress]]


def _next_event(conn: h11.Connection) -> h11.Event | Refused:
    """h11's next event with the client's bytes all in and its EOF after them."""
    try:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(b"")
            event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        return refusal_for_protocol_error(exc)
    return event


def read_request(conn: h11.Connection) -> tuple[h11.Request, bytes] | Refused | None:
    """The next head the proxy's h11 yields (with its exact bytes), its refusal, or None (client left)."""
    before = conn.trailing_data[0]
    event = _next_event(conn)
    if isinstance(event, Refused):
        return event
    if not isinstance(event, h11.Request):
        return None  # ConnectionClosed: the client left without asking
    return event, before[: len(before) - len(conn.trailing_data[0])]


def judge_head(event: h11.Request, head: bytes) -> Target | Refused:
    try:
        return classify_request(event, head, max_head_bytes=MAX_HEAD)
    except Refused as refusal:
        return refusal


def admission(policy: NetworkPolicy, target: Target, resolve: Resolve) -> Decision:
    """The name decision, then (only if it allowed) the one over what the name resolved to."""
    request = Request(channel=Channel.SHELL, host=target.host, port=target.port)
    by_name = decide_name(policy, request)
    if not by_name.allowed:
        return by_name
    literal = parse_ip_literal(target.host)
    addresses = [literal] if literal is not None else resolve(target.host)
    by_address = decide_addresses(policy, request, addresses)
    if by_address.allowed and not addresses:
        return Decision(verdict=Verdict.DENY, reason=Reason.RESOLVE_FAILED, layer=by_address.layer)
    if by_address.allowed and by_name.would_deny is not None:
        return by_name
    return by_address


def read_whole_flight(data: bytes, cuts: Sequence[int] = ()) -> Flight:
    """What the tunnel reads the first flight as, when its bytes arrive cut at ``cuts``, then EOF."""
    ends = sorted({c % (len(data) + 1) for c in cuts} | {len(data)})
    for end in ends:
        flight = read_flight(data[:end], eof=False)
        if flight is not None:
            return flight
    flight = read_flight(data, eof=True)
    assert flight is not None
    return flight


def assert_target_is_what_the_head_says(raw: bytes, target: Target) -> None:
    """An accepted head names one destination, however it is read, and names it canonically."""
    assert canonical_host(target.host) == target.host
    assert 1 <= target.port <= 65535
    method = _head_lines(raw)[0].split(" ")[0]
    assert target.method == method
    allowed = ATTEST_METHODS if target.action is Action.ATTEST else FORWARD_METHODS | {"CONNECT"}
    assert target.method in allowed
    assert (target.action is Action.ATTEST) == (target.host == ATTESTATION_HOST and method != "CONNECT")
    readings = head_readings(raw)
    assert readings.target == (target.host, target.port), (readings, target)
    assert all(reading == (target.host, target.port) for reading in readings.hosts), (readings, target)


# -- sans-io layer --------------------------------------------------------------------------

SANS_UP, SANS_ECHO = 8080, 5432


def sans_policy(up: int, echo: int, mode: Mode = Mode.ENFORCE) -> NetworkPolicy:
    """Names of every kind of rule, and overrides that let ``pypi.test`` reach loopback on two ports."""
    return NetworkPolicy.build(
        allow=["pypi.org", "files.pythonhosted.org", "pypi.test", "*.wild.test"],
        deny=["deny.test"],
        docs=["docs.example.org"],
        overrides=[(f"pypi.test:{up}", ["127.0.0.1/32"]), (f"pypi.test:{echo}", ["127.0.0.1/32"])],
        tcp=["git.test:22"],
        mode=mode,
    )


SANS_POLICIES = (sans_policy(SANS_UP, SANS_ECHO), sans_policy(SANS_UP, SANS_ECHO, Mode.REPORT))
SANS_TABLE = {"pypi.org": ["151.101.0.223"], "files.pythonhosted.org": ["10.0.0.7"],
              "pypi.test": ["127.0.0.1"], "a.wild.test": ["151.101.0.223", "127.0.0.1"],
              "git.test": ["140.82.121.4"]}


def sans_resolve(host: str) -> list[IPAddress]:
    return [ipaddress.ip_address(a) for a in SANS_TABLE.get(host, [])]


@SANS_IO
@given(head=heads(), policy=st.sampled_from(SANS_POLICIES))
@example(head=Head(request_line="GET http://pypi.test:{up}/ HTTP/1.1", lines=("Host: pypi.test:{up}",),
                   eol="\r\n", body=b"", edits=()), policy=SANS_POLICIES[0])
@counted
def test_request_heads_are_judged_by_what_they_name(head: Head, policy: NetworkPolicy) -> None:
    raw = head.render(SANS_UP, SANS_ECHO)
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(raw)
    parsed = read_request(conn)
    if parsed is None:
        return
    if isinstance(parsed, Refused):
        event(f"h11 refused: {parsed.reason}")
        assert 400 <= parsed.status < 500
        return
    verdict = judge_head(*parsed)
    if isinstance(verdict, Refused):
        event(f"classify_request refused: {verdict.reason}")
        assert isinstance(verdict.reason, Reason) and 400 <= verdict.status < 500
        return
    assert_target_is_what_the_head_says(parsed[1], verdict)
    if verdict.action is Action.ATTEST:
        event("attestation")
        return  # answered by the proxy itself: nothing is resolved or dialled
    decision = admission(policy, verdict, sans_resolve)
    event(f"{verdict.action}: {decision.verdict} {decision.reason}")
    if decision.allowed:
        readings = head_readings(parsed[1])
        for host, port in (readings.target, *readings.hosts):  # type: ignore[misc]
            assert decide_name(policy, Request(channel=Channel.SHELL, host=host, port=port)).allowed


TUNNEL_HOSTS = ("pypi.test", "pypi.org", "files.pythonhosted.org", "a.wild.test")


def _fragments(data: bytes) -> bytes:
    """The payloads of the leading TLS records, joined."""
    joined = b""
    while len(data) >= 5:
        length = int.from_bytes(data[3:5], "big")
        joined, data = joined + data[5:5 + length], data[5 + length:]
    return joined


@SANS_IO
@given(case=hellos(), host=st.sampled_from(TUNNEL_HOSTS))
@counted
def test_client_hellos_never_pass_a_name_other_than_the_host(case: HelloCase, host: str) -> None:
    hello = parse_client_hello(case.data)
    assert hello.status in HelloStatus
    if hello.sni is not None:
        # A name is only ever one the bytes really carry (in the handshake the records reassemble).
        assert hello.sni.encode("ascii") in _fragments(case.data)
    refusal = judge_first_flight(hello, host)
    event(f"{hello.status}: {refusal.reason if refusal else 'passes'}")
    if refusal is not None:
        assert refusal.reason in (Reason.MALFORMED_REQUEST, Reason.SNI_MISMATCH,
                                  Reason.ENCRYPTED_CLIENT_HELLO)
        return
    if hello.status is HelloStatus.NOT_TLS:
        return  # judged as HTTP or a raw stream instead (test_first_flights)
    assert hello.status is HelloStatus.CLIENT_HELLO and not hello.ech
    if case.names is not None:
        assert not case.encrypted
        for name in case.names:
            assert _canonical(name.decode("utf-8", "replace")) == host, (name, host)
            assert decide_name(SANS_POLICIES[0], Request(channel=Channel.SHELL,
                                                         host=name.decode(), port=443)).allowed


@SANS_IO
@given(case=flights, host=st.sampled_from((*TUNNEL_HOSTS, "git.test")),
       port=st.sampled_from((80, 443, 22, SANS_UP, SANS_ECHO)), connect_=st.booleans(),
       policy=st.sampled_from(SANS_POLICIES), cuts=st.lists(st.integers(0, 512), max_size=4))
# An origin server routes on an absolute-form target's authority, not on Host (RFC 9112 3.2.2).
@example(case=Head(request_line="GET http://pypi.test:{up} HTTP/1.1", lines=(), eol="\r\n", body=b"", edits=()),
         host="pypi.org", port=80, connect_=False, policy=SANS_POLICIES[0], cuts=[])
@counted
def test_first_flights_never_go_where_decide_would_refuse(
        case: FlightCase, host: str, port: int, connect_: bool, policy: NetworkPolicy,
        cuts: list[int]) -> None:
    # A flight is judged only on a tunnel the name rules already allowed.
    assume(decide_name(policy, Request(channel=Channel.SHELL, host=host, port=port)).allowed)
    data = case.render(SANS_UP, SANS_ECHO)
    flight = read_whole_flight(data)
    # However TCP cuts the bytes, the tunnel reads the same flight.
    assert read_whole_flight(data, cuts) == flight
    verdict = judge_flight(flight, host=host, port=port, policy=policy, connect=connect_)
    event(f"{flight.kind}: {verdict.reason if verdict is not None else 'passes'}")
    if isinstance(verdict, Refused):
        assert isinstance(verdict.reason, Reason)
        return
    assert verdict is None or verdict.allowed
    assert flight_violations(policy, case, data, flight, host, port, connect_) == []


# -- socket layer ----------------------------------------------------------------------------

FOLLOW_UP = "/firstrun-fuzz-follow-up"


class Origin:
    """An HTTP origin on loopback: answers each request ``hello <target>``, and remembers it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[h11.Request] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def seen(self) -> list[h11.Request]:
        with self._lock:
            return list(self.requests)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        h = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        with conn, contextlib.suppress(h11.ProtocolError, OSError):
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    h.receive_data(conn.recv(65536))
                elif isinstance(event, h11.Request):
                    request = event
                    with self._lock:
                        self.requests.append(event)
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    headers, body = origin_reply(request)
                    data = h.send(h11.Response(status_code=200, headers=headers)) or b""
                    if request.method != b"HEAD":
                        data += h.send(h11.Data(data=body)) or b""
                    conn.sendall(data + (h.send(h11.EndOfMessage()) or b""))
                    if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                        return
                    h.start_next_cycle()
                elif not isinstance(event, h11.Data):
                    return

    def close(self) -> None:
        self.listener.close()


def origin_reply(request: h11.Request) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = b"hello " + request.target
    return [(b"content-length", str(len(body)).encode())], body


@dataclass(frozen=True)
class Loopback:
    """The two servers the overrides let ``pypi.test`` reach: fresh for each case, so nothing
    a previous case's proxy sent late is taken for this one's."""

    origin: Origin
    echo: EchoServer

    def close(self) -> None:
        self.origin.close()
        self.echo.close()


class AllLoopback:
    """Every name resolves to 127.0.0.1, so the only dialable destinations are the overrides'."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.asked.append((host, port))
        return [ipaddress.IPv4Address("127.0.0.1")]


def loopback_resolve(host: str) -> list[IPAddress]:
    return [ipaddress.IPv4Address("127.0.0.1")]


class _Errors(logging.Handler):
    """What asyncio logs at ERROR: a task's exception nobody caught is a proxy crash."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(self.format(record))


@pytest.fixture(scope="module")
def crashes() -> Iterator[_Errors]:
    handler = _Errors()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@dataclass(frozen=True)
class Expected:
    decision: Verdict
    reason: Reason
    # Where the proxy dialled (for an allowed request or tunnel) and what was asked of it.
    port: int | None = None
    flight: bytes | None = None


def _refused(refusal: Refused | Decision) -> Expected:
    return Expected(decision=Verdict.DENY, reason=refusal.reason)


def expect_tunnel(policy: NetworkPolicy, target: Target, admitted: Decision, data: bytes,
                  connect: bool) -> Expected:
    flight = read_whole_flight(data)
    verdict = judge_flight(flight, host=target.host, port=target.port, policy=policy, connect=connect)
    if isinstance(verdict, Refused):
        return Expected(decision=Verdict.DENY, reason=verdict.reason, port=target.port, flight=b"")
    decision = verdict if verdict is not None else admitted
    return Expected(decision=Verdict.ALLOW, reason=decision.reason, port=target.port, flight=data)


def _body_end(conn: h11.Connection) -> h11.Event | Refused:
    while True:
        event = _next_event(conn)
        if not isinstance(event, h11.Data):
            return event


def expect_connection(policy: NetworkPolicy, raw: bytes, servers: Loopback) -> list[Expected]:
    """The records the proxy writes for one client connection that sends ``raw`` then EOF.

    Mirrors the server's loop, one request at a time, with the pure decisions; also
    checks each head it lets through against what the head names.
    """
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(raw)
    expected: list[Expected] = []
    while True:
        parsed = read_request(conn)
        if parsed is None:
            return expected
        if isinstance(parsed, Refused):
            return [*expected, _refused(parsed)]
        event, head = parsed
        target = judge_head(event, head)
        if isinstance(target, Refused):
            return [*expected, _refused(target)]
        assert_target_is_what_the_head_says(head, target)
        if target.action is not Action.ATTEST:
            admitted = admission(policy, target, loopback_resolve)
            if not admitted.allowed:
                return [*expected, _refused(admitted)]
            assert target.host == "pypi.test" and target.port in (servers.origin.port, servers.echo.port)
            if target.action is Action.TUNNEL:
                _body_end(conn)
                return [*expected, expect_tunnel(policy, target, admitted, conn.trailing_data[0], True)]
        end = _body_end(conn)
        if isinstance(end, Refused):
            return [*expected, _refused(end)]
        if not isinstance(end, h11.EndOfMessage):
            # The client left mid-body: an attestation never began, a forward already went out.
            if target.action is Action.ATTEST:
                return expected
            return [*expected, Expected(decision=Verdict.ALLOW, reason=admitted.reason, port=target.port)]
        if target.action is Action.ATTEST:
            expected.append(Expected(decision=Verdict.ALLOW, reason=Reason.ATTESTATION))
        elif target.port == servers.echo.port:
            # The echo server sends the request back, which is no HTTP response.
            return [*expected, Expected(decision=Verdict.DENY, reason=Reason.UPSTREAM_FAILED,
                                        port=target.port)]
        else:
            expected.append(Expected(decision=Verdict.ALLOW, reason=admitted.reason, port=target.port))
        # Both answers carry a Content-Length, so whether the connection carries another
        # request is h11's call from the client's head alone.
        conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
        conn.send(h11.EndOfMessage())
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return expected
        conn.start_next_cycle()


def socket_policy(servers: Loopback) -> NetworkPolicy:
    return sans_policy(servers.origin.port, servers.echo.port)


def _exchange(address: tuple[str, int], payload: bytes) -> bytes:
    """Send ``payload`` and EOF, and everything the proxy sends back until it closes."""
    with socket.create_connection(address, timeout=30) as sock:
        with contextlib.suppress(OSError):  # a refused tunnel may already be reset
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        return read_until_closed(sock)


def _follow_up(address: tuple[str, int], servers: Loopback) -> None:
    """A well-formed request after the fuzzed one still gets its answer: the proxy survived."""
    authority = f"pypi.test:{servers.origin.port}"
    with connect(address) as sock:
        sock.sendall(f"GET http://{authority}{FOLLOW_UP} HTTP/1.1\r\nHost: {authority}\r\n"
                     "Connection: close\r\n\r\n".encode())
        reply = read_reply(sock)
    assert (reply.status, reply.body) == (200, b"hello " + FOLLOW_UP.encode())


@dataclass
class Run:
    answer: bytes
    records: list[EgressRecord]
    policy: NetworkPolicy
    origin_seen: list[h11.Request]
    echoed: int


@contextlib.contextmanager
def fresh_servers() -> Iterator[Loopback]:
    servers = Loopback(origin=Origin(), echo=EchoServer())
    try:
        yield servers
    finally:
        servers.close()


def run_proxy(servers: Loopback, crashes: _Errors, payload: Callable[[EgressProxy], bytes],
              kind: ListenerKind) -> Run:
    """A fresh proxy, one fuzzed connection to its ``kind`` listener, a follow-up, and its records once stopped."""
    crashes.seen.clear()
    resolver = AllLoopback()
    proxy = EgressProxy(socket_policy(servers), resolver=resolver).start()
    try:
        address = proxy.listen_tcp(Channel.SHELL)
        fuzzed = proxy.listen_tcp(Channel.SHELL, kind=kind) if kind is not ListenerKind.PROXY else address
        answer = _exchange(fuzzed, payload(proxy))
        _follow_up(address, servers)
    finally:
        proxy.stop()
    origin_seen, echoed = servers.origin.seen(), servers.echo.seen.echoed
    # A task's uncaught exception is logged when the task is collected.
    gc.collect()
    assert crashes.seen == [], crashes.seen
    records = proxy.records()
    follow = [r for r in records if r.path == FOLLOW_UP]
    assert [(r.decision, r.status) for r in follow] == [(Verdict.ALLOW, 200)]
    # Only the overrides' loopback servers can be reached; nothing else was dialled.
    assert all(r.resolved in (None, "127.0.0.1") for r in records)
    # A name the name rules refuse is never even resolved: the lookup itself would leak it.
    assert all(decide_name(proxy.policy, Request(channel=Channel.SHELL, host=host, port=port)).allowed
               for host, port in resolver.asked)
    return Run(answer=answer, records=[r for r in records if r.path != FOLLOW_UP], policy=proxy.policy,
               origin_seen=[r for r in origin_seen if r.target != FOLLOW_UP.encode()], echoed=echoed)


def _names_heard(request: h11.Request) -> list[str]:
    head = b"%s %s HTTP/1.1\r\n" % (request.method, request.target)
    head += b"".join(b"%s: %s\r\n" % header for header in request.headers)
    return flight_names(head + b"\r\n")


def assert_matches(run: Run, expected: list[Expected], servers: Loopback, *, connect: bool) -> None:
    """The records are the ones the pure decisions predict, and the servers saw only what they allow."""
    event(" then ".join(f"{e.decision} {e.reason}" for e in expected) or "no record")
    assert [(r.decision, r.reason) for r in run.records] == [(e.decision, e.reason) for e in expected]
    for record in run.records:
        if record.decision is Verdict.ALLOW and record.reason is not Reason.ATTESTATION:
            assert record.host is not None and record.port is not None
            request = Request(channel=Channel.SHELL, host=record.host, port=record.port)
            assert decide_name(run.policy, request).allowed
            assert decide_addresses(run.policy, request, loopback_resolve(record.host)).allowed
    dialled = {e.port for e in expected}
    if run.origin_seen:
        assert servers.origin.port in dialled
        # Whether the proxy wrote the request (a forward) or carried it (a tunnel), it
        # names nothing but the host that was allowed.
        assert all(_canonical(name) == "pypi.test" for r in run.origin_seen for name in _names_heard(r))
    if run.echoed:
        assert servers.echo.port in dialled
    tunnels = [e for e in expected if e.flight is not None and e.port == servers.echo.port]
    if tunnels:
        (tunnel,) = tunnels
        # What went up is what the flight was judged as, echoed back; a refused flight sent nothing.
        assert run.echoed == len(tunnel.flight or b"")
        answer = run.answer
        if connect:
            established, _, answer = answer.partition(b"\r\n\r\n")
            assert established.startswith(b"HTTP/1.1 200 ")
        # A refused flight's reset may even cut the answer short: never more than nothing.
        assert answer == tunnel.flight if tunnel.flight else answer == b""


@SOCKETS
@given(head=heads())
@counted
def test_fuzzed_heads_over_a_socket(head: Head, crashes: _Errors) -> None:
    with fresh_servers() as servers:
        raw = head.render(servers.origin.port, servers.echo.port)
        run = run_proxy(servers, crashes, lambda proxy: raw, ListenerKind.PROXY)
        expected = expect_connection(run.policy, raw, servers)
        assert_matches(run, expected, servers, connect=True)
    if expected and expected[0].decision is Verdict.DENY and expected[0].port is None:
        # Refused before anything was dialled: the answer's status is the refusal's.
        assert int(run.answer.split(b" ", 2)[1]) == Refused(expected[0].reason, "").status


@SOCKETS
@given(head=heads("connect"), case=flights)
@counted
def test_fuzzed_connect_tunnels_over_a_socket(head: Head, case: FlightCase, crashes: _Errors) -> None:
    with fresh_servers() as servers:
        ports = (servers.origin.port, servers.echo.port)
        raw = head.render(*ports) + case.render(*ports)
        run = run_proxy(servers, crashes, lambda proxy: raw, ListenerKind.PROXY)
        expected = expect_connection(run.policy, raw, servers)
        assert_matches(run, expected, servers, connect=True)
    for e in expected:
        if e.flight:
            flight = read_whole_flight(e.flight)
            assert flight_violations(run.policy, case, e.flight, flight, "pypi.test", e.port or 0,
                                     True) == []


FLOW_NAMES = ("pypi.test", "pypi.org", "ip:127.0.0.1", "ip:93.184.216.34", "ip:198.19.255.254")


@SOCKETS
@given(name=mostly(st.just("pypi.test"), st.sampled_from(FLOW_NAMES), odds=3),
       port=mostly(st.just("{echo}"), st.sampled_from(("{up}", "443", "80", "22")), odds=3), case=flights)
@example(name="pypi.test", port="{echo}",
         case=Head(request_line="GET http://evil.test/ HTTP/1.1", lines=("Host: pypi.test",), eol="\r\n",
                   body=b"", edits=()))
@counted
def test_fuzzed_redirected_flows_over_a_socket(name: str, port: str, case: FlightCase,
                                               crashes: _Errors) -> None:
    chosen: dict[str, str] = {}
    with fresh_servers() as servers:
        ports = (servers.origin.port, servers.echo.port)
        data = case.render(*ports)
        port_number = int(_fill(port, *ports))

        def flow(proxy: EgressProxy) -> bytes:
            # A redirected flow names the address the program dialled: what the DNS stub
            # answered for an allowed name, or any other address.
            address = name[3:] if name.startswith("ip:") else str(proxy.synthetic.address_for(name))
            chosen["host"] = proxy.synthetic.name_for(ipaddress.ip_address(address)) or address
            return f"tcp {address} {port_number}\n".encode() + data

        run = run_proxy(servers, crashes, flow, ListenerKind.TRANSPARENT)
        host = canonical_host(chosen["host"])
        target = Target(action=Action.TUNNEL, method="", host=host, port=port_number, path=None)
        admitted = admission(run.policy, target, loopback_resolve)
        expected = [expect_tunnel(run.policy, target, admitted, data, False) if admitted.allowed
                    else _refused(admitted)]
        assert_matches(run, expected, servers, connect=False)
    assert all(r.capture is Capture.TRANSPARENT for r in run.records)
    if expected[0].flight:
        flight = read_whole_flight(data)
        assert flight_violations(run.policy, case, data, flight, host, port_number, False) == []
