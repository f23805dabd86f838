"""From a request head that h11 parsed to what the proxy will do with it.

Guarantee: ``classify_request`` either returns a ``Target`` whose host is
canonical and whose port is the one that will be dialled, or raises
``Refused``: it refuses any head two parties could read two ways (ambiguous
framing, a non-canonical authority, a Host naming another host or port).
Forwarded headers lose the hop-by-hop ones and keep the framing headers.
Pure: no I/O; the HTTP grammar is h11's, this module judges its fields.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum

import h11

from firstrun.errors import PolicyError
from firstrun.policy.decision import Reason
from firstrun.policy.hosts import canonical_host, parse_port
from firstrun.policy.network import ATTESTATION_HOST
from firstrun.proxy.errors import Refused

Headers = list[tuple[bytes, bytes]]


class Action(StrEnum):
    FORWARD = "forward"
    TUNNEL = "tunnel"
    ATTEST = "attest"


@dataclass(frozen=True, kw_only=True)
class Target:
    action: Action
    method: str
    host: str
    port: int
    # Origin-form path and query for FORWARD and ATTEST; None for a tunnel.
    path: str | None


FORWARD_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
ATTEST_METHODS = frozenset({"GET", "HEAD"})

_OBS_FOLD = re.compile(rb"\n[ \t]")
_CONTENT_LENGTH_LINE = re.compile(rb"^content-length[ \t]*:([^\r\n]*)", re.IGNORECASE | re.MULTILINE)

_NOT_FORWARDED = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade",
        b"host", b"expect",
    }
)
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


def _malformed(detail: str) -> Refused:
    return Refused(Reason.MALFORMED_REQUEST, detail)


def parse_authority(text: str, *, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` as (canonical host, port); ``default_port`` None requires a port."""
    # Refused: userinfo, a path, an empty or non-canonical port (``:0443``,
    # ``:+443``, ``:443 ``; only ``1``-``65535`` in plain decimal without a
    # leading zero is a port).
    if not text or any(c in text for c in "@/?#\\%") or not text.isprintable() or " " in text:
        raise _malformed(f"invalid authority {text!r}")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise _malformed(f"invalid authority {text!r}")
        host_text, rest = text[1:end], text[end + 1 :]
        try:
            ipaddress.IPv6Address(host_text)
        except ValueError:
            raise _malformed(f"invalid IPv6 literal in {text!r}") from None
        if rest and not rest.startswith(":"):
            raise _malformed(f"invalid authority {text!r}")
        port_text = rest[1:] if rest else None
    else:
        host_text, sep, port_text_raw = text.rpartition(":")
        if not sep:
            host_text, port_text = text, None
        else:
            port_text = port_text_raw
        if ":" in host_text:
            raise _malformed(f"IPv6 literal without brackets in {text!r}")
    if port_text is None:
        if default_port is None:
            raise _malformed(f"no port in {text!r}")
        port = default_port
    else:
        try:
            port = parse_port(port_text)
        except PolicyError:
            raise _malformed(f"invalid port {port_text!r}") from None
    if not host_text:
        raise _malformed(f"no host in {text!r}")
    try:
        host = canonical_host(host_text)
    except PolicyError:
        raise Refused(Reason.INVALID_HOST, f"invalid host {host_text!r}") from None
    return host, port


def authority_text(host: str, port: int, *, default_port: int) -> str:
    """The Host header value for a canonical host and port."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"


def _header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def check_framing(headers: Headers, head: bytes, *, max_head_bytes: int) -> None:
    """Refuse a head that is too big or whose body framing is ambiguous."""
    # Content-Length with Transfer-Encoding, more than one Content-Length (even
    # with equal values, which h11 would quietly merge), and obs-fold line
    # continuations (which h11 would quietly unfold).
    if len(head) > max_head_bytes:
        raise Refused(Reason.HEADERS_TOO_LARGE, f"request head over {max_head_bytes} bytes")
    names = {name for name, _ in headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        raise Refused(Reason.SMUGGLING_SUSPECTED, "both Content-Length and Transfer-Encoding")
    lengths = _CONTENT_LENGTH_LINE.findall(head)
    if len(lengths) > 1 or any(b"," in value for value in lengths):
        raise Refused(Reason.SMUGGLING_SUSPECTED, "more than one Content-Length")
    if _OBS_FOLD.search(head):
        raise Refused(Reason.SMUGGLING_SUSPECTED, "obs-fold header continuation")


def parse_target(method: str, target: str) -> Target:
    """Where the request wants to go, from its method and request-target."""
    # Refused: a CONNECT target with a path or without a port, an origin-form
    # or asterisk-form request sent to a proxy, and ``https://`` in absolute
    # form (TLS goes through CONNECT).
    if method == "CONNECT":
        host, port = parse_authority(target, default_port=None)
        return Target(action=Action.TUNNEL, method=method, host=host, port=port, path=None)
    if target.startswith("/") or target == "*":
        raise _malformed("origin-form request sent to a proxy")
    lowered = target[:8].lower()
    if lowered.startswith("https://"):
        raise _malformed("https in absolute form; use CONNECT")
    if not lowered.startswith("http://"):
        raise _malformed(f"not an http URL: {target[:64]!r}")
    if "#" in target:
        raise _malformed("fragment in request target")
    rest = target[len("http://") :]
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    host, port = parse_authority(rest[:end], default_port=80)
    path = rest[end:] or "/"
    if path.startswith("?"):
        path = "/" + path
    action = Action.ATTEST if host == ATTESTATION_HOST else Action.FORWARD
    allowed = ATTEST_METHODS if action is Action.ATTEST else FORWARD_METHODS
    if method not in allowed:
        raise Refused(Reason.UNSUPPORTED_METHOD, f"method {method} not forwarded", host=host)
    return Target(action=action, method=method, host=host, port=port, path=path)


def check_host_header(target: Target, headers: Headers) -> None:
    """A Host header, when sent, must name exactly the target's host and port."""
    # Upstreams (CDNs especially) route on Host, and a Host the policy never
    # saw would reach a host the policy never allowed.
    raw = _header(headers, b"host")
    if raw is None:
        return
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _malformed("non-ASCII Host header") from None
    # A CONNECT's Host often omits the port; it then means the target's.
    default = target.port if target.action is Action.TUNNEL else 80
    try:
        host, port = parse_authority(text, default_port=default)
    except Refused:
        raise Refused(
            Reason.HOST_MISMATCH, f"Host {text!r} is not {target.host}", host=target.host
        ) from None
    if (host, port) != (target.host, target.port):
        raise Refused(
            Reason.HOST_MISMATCH,
            f"Host {host}:{port} is not {target.host}:{target.port}",
            host=target.host,
        )


def classify_request(event: h11.Request, head: bytes, *, max_head_bytes: int) -> Target:
    """The whole judgement of one request head; raises ``Refused``."""
    headers: Headers = list(event.headers)
    check_framing(headers, head, max_head_bytes=max_head_bytes)
    try:
        method = event.method.decode("ascii")
        target_text = event.target.decode("ascii")
    except UnicodeDecodeError:
        raise _malformed("non-ASCII request line") from None
    target = parse_target(method, target_text)
    if target.action is Action.TUNNEL and (
        _header(headers, b"transfer-encoding") is not None
        or (_header(headers, b"content-length") or b"0") != b"0"
    ):
        raise _malformed("CONNECT with a body")
    check_host_header(target, headers)
    return target


def end_to_end(headers: Headers) -> Headers:
    """``headers`` without hop-by-hop ones, those named in Connection, and ``Proxy-*``."""
    # Hop-by-hop as RFC 9110 section 7.6.1 lists them. The framing headers
    # always stay, so h11 frames the body exactly as it was validated.
    listed = {
        token.strip().lower()
        for name, value in headers
        if name == b"connection"
        for token in value.split(b",")
    }
    return [
        (name, value)
        for name, value in headers
        if name in _FRAMING
        or (name not in _NOT_FORWARDED and not name.startswith(b"proxy-") and name not in listed)
    ]


def upstream_headers(headers: Headers, target: Target) -> Headers:
    """Headers for the upstream request: end-to-end ones and our Host.

    The upstream connection is the proxy's own, kept alive for the next
    request to the same checked address (HTTP/1.1's default), whatever the
    client asked of its own connection.
    """
    host = authority_text(target.host, target.port, default_port=80).encode("ascii")
    return [(b"host", host), *end_to_end(headers)]


def downstream_headers(headers: Headers) -> Headers:
    """Headers of the upstream's response that the client gets."""
    return end_to_end(headers)
