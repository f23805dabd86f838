"""What a stream's first bytes say it is, and whether it may carry that to the host it reached.

Guarantee: ``read_flight`` is pure: it says whether a tunnel's first bytes are
a TLS ClientHello, an HTTP/1 request head or a raw stream, or that it needs
more. ``judge_flight``, pure too, refuses a flight to the host and port the
name rules allowed when its SNI, Host or request-target names another host,
when it hides its name (ECH) or sends two Hosts, when it is malformed, and
when it is a raw stream no ``tcp`` rule (or CONNECT entry for its port) covers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from firstrun.errors import PolicyError
from firstrun.policy.decision import Decision, Reason
from firstrun.policy.hosts import canonical_host
from firstrun.policy.network import NetworkPolicy, decide_stream
from firstrun.proxy.errors import Refused
from firstrun.proxy.request import parse_authority
from firstrun.proxy.tls import MAX_CLIENT_HELLO, Hello, HelloStatus, parse_client_hello

# An HTTP/1 head is judged whole; one larger than this is not a request we forward.
MAX_HTTP_HEAD = 64 * 1024
_METHOD_START = re.compile(rb"[A-Z]{3,12} ")
# The start of a request line, cut before its first space.
_METHOD_PREFIX = re.compile(rb"[A-Z]{1,12}")
_REQUEST_LINE = re.compile(rb"[A-Z]{3,12} \S+ HTTP/1\.[01]\r?\n")


class FlightKind(StrEnum):
    EMPTY = "empty"
    TLS = "tls"
    HTTP = "http"
    RAW = "raw"


@dataclass(frozen=True, kw_only=True)
class Flight:
    kind: FlightKind
    hello: Hello | None = None
    # HTTP: every Host header's value, as sent.
    hosts: tuple[str, ...] = ()
    # HTTP: the authority an absolute- or authority-form request-target names, as sent.
    authority: str | None = None


def read_flight(data: bytes, *, eof: bool) -> Flight | None:
    """What ``data`` is, or None when more bytes are needed to tell (and ``eof`` is false)."""
    if not data:
        return Flight(kind=FlightKind.EMPTY) if eof else None
    hello = parse_client_hello(data)
    if hello.status is HelloStatus.INCOMPLETE:
        if eof or len(data) >= MAX_CLIENT_HELLO:
            return Flight(kind=FlightKind.TLS, hello=Hello(status=HelloStatus.MALFORMED))
        return None
    if hello.status is not HelloStatus.NOT_TLS:
        return Flight(kind=FlightKind.TLS, hello=hello)
    if not _METHOD_START.match(data[:13]):
        if not eof and _METHOD_PREFIX.fullmatch(data[:13]):
            return None
        return Flight(kind=FlightKind.RAW)
    end = data.find(b"\r\n\r\n")
    if end < 0 and not eof and len(data) < MAX_HTTP_HEAD:
        return None
    if not _REQUEST_LINE.match(data):
        return Flight(kind=FlightKind.RAW)
    head = data[: end if end >= 0 else len(data)]
    hosts = tuple(
        line.split(b":", 1)[1].strip().decode("latin-1")
        for line in head.split(b"\n")[1:]
        if line.lower().startswith(b"host:")
    )
    target = data.split(b" ", 2)[1]
    return Flight(kind=FlightKind.HTTP, hosts=hosts, authority=_target_authority(target))


def _target_authority(target: bytes) -> str | None:
    """The authority a request-target names, or None for origin-form (``/path``) and ``*``."""
    if target.startswith(b"/") or target == b"*":
        return None
    text = target.decode("latin-1")
    _, sep, rest = text.partition("://")
    if not sep:
        return text
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def judge_first_flight(hello: Hello, host: str) -> Refused | None:
    """Whether a client's first flight may go to ``host`` (canonical)."""
    if hello.status is HelloStatus.MALFORMED or hello.status is HelloStatus.INCOMPLETE:
        return Refused(Reason.MALFORMED_REQUEST, "malformed TLS ClientHello", host=host)
    if hello.status is HelloStatus.NOT_TLS:
        return None
    if hello.ech:
        # The checked name would be the decoy: a CDN in front of an allowed
        # host would route on the encrypted one, to any of its tenants.
        return Refused(Reason.ENCRYPTED_CLIENT_HELLO,
                       "encrypted ClientHello hides the server name", host=host)
    if hello.sni is None:
        return None
    try:
        sni = canonical_host(hello.sni)
    except PolicyError:
        sni = None
    if sni != host:
        return Refused(Reason.SNI_MISMATCH, f"SNI {hello.sni!r} is not {host}", host=host)
    return None


def _host_of(value: str) -> str | None:
    name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    try:
        return canonical_host(name.strip("[]"))
    except PolicyError:
        return None


def _authority_host(authority: str) -> str | None:
    # The proxy's own strict reading: userinfo, a backslash or a bad port is no
    # authority two parsers agree on, so it names no allowed host.
    try:
        return parse_authority(authority, default_port=80)[0]
    except Refused:
        return None


def judge_flight(flight: Flight, *, host: str, port: int, policy: NetworkPolicy,
                 connect: bool) -> Decision | Refused | None:
    """None: the flight goes as the name rules allowed it. A ``Decision``: it goes,
    under that decision instead (a raw stream by its ``tcp`` rule, or one report
    mode lets through). ``Refused``: it does not go."""
    if flight.kind is FlightKind.EMPTY:
        # The client closed without a byte: nothing went out.
        return None
    if flight.kind is FlightKind.TLS:
        # An SNI, when sent, must name the host; ECH and malformed hellos are refused.
        assert flight.hello is not None
        return judge_first_flight(flight.hello, host)
    if flight.kind is FlightKind.HTTP:
        # One Host naming the host, or none (HTTP/1.0): servers route on Host,
        # and a Host the policy never saw would reach a host it never allowed.
        # A request-target that names a destination itself (absolute-form
        # ``http://host/``, or authority-form) must name the host too, since a
        # server routes on it rather than on Host (RFC 9112 section 3.2.2).
        if len(flight.hosts) > 1:
            return Refused(Reason.SMUGGLING_SUSPECTED, "more than one Host header", host=host)
        if flight.hosts and _host_of(flight.hosts[0]) != host:
            return Refused(Reason.HOST_MISMATCH, f"Host {flight.hosts[0]!r} is not {host}",
                           host=host)
        if flight.authority is not None and _authority_host(flight.authority) != host:
            return Refused(Reason.HOST_MISMATCH,
                           f"request target names {flight.authority!r}, not {host}", host=host)
        return None
    # A raw stream needs a ``tcp`` rule for that exact name and port, or, in a
    # CONNECT tunnel, an entry naming that port; report mode passes it,
    # recorded as what would have been refused.
    decision = decide_stream(policy, host, port, connect=connect)
    if not decision.allowed:
        return Refused(decision.reason, f"a stream that is neither TLS nor HTTP to {host}:{port} "
                       "needs a tcp rule for it", layer=decision.layer, host=host)
    # A tcp rule, or report mode letting a refusal through, is what the record says.
    return decision if decision.reason is not Reason.ALLOWED_BY_LIST else None
