"""The egress proxy: the only route out of every sandbox.

Guarantee: every request and every tunnel is decided by
``firstrun.policy.network`` alone (``decide_name`` on the canonical name,
then, only if that allowed it, one resolution through the injected resolver
and ``decide_addresses`` over every address returned), and the proxy dials
only addresses that were checked, never the name again. Each request or
tunnel leaves exactly one ``EgressRecord``, refusals included (with TLS
inspection, each decrypted request inside a shell-channel tunnel leaves one
more, see ``intercept``, and plain HTTP on the shell channel is judged by the
same ``policy.methods`` rules before anything is dialled): malformed or
ambiguous input gets a 4xx with a one-line reason, a stalled head gets 408,
and none of it can crash the proxy or hold a connection slot forever.

Records are bounded and the bound fails closed (``ProxyLimits.max_records``
and ``max_record_bytes``, see ``records``): each request reserves its record
once its head is read, before it is judged, dialled or answered, so nothing
goes out that could not be recorded. When a reservation is refused, that
request and every later one on every listener get a 503
``record_budget_exhausted`` and are counted, not recorded; the proxy writes
one closing record with the count when it stops. A refused request closes
its connection, so a keep-alive connection carries at most one denial and a
flood costs a connection per request. A TLS-inspected tunnel admitted before
the budget was spent still records each decrypted request it carries (they
went out); once the budget has no room, the proxy closes such a tunnel's
client connection after its current request, so only what the tunnel had
already read from that client can follow.

Besides proxy requests, a listener may take transparent capture's two
kinds of traffic (``ListenerKind``): flows a sandbox's relay redirected,
each named by the address the program dialled, which the proxy maps back
to the name its DNS answered it for and then decides and carries exactly
like a CONNECT to that name (records say ``capture: transparent``); and DNS
queries, which it answers itself from the policy (``proxy.dns``), never
resolving or forwarding one, recording each refused name once. A tunnel's
first flight is judged before a byte goes up (``proxy.flight``): TLS must
name the host, HTTP must carry its Host, and any other stream needs a
``tcp`` rule (or, asked for by CONNECT, an entry naming its port).

The proxy runs its own asyncio loop in a daemon thread, so synchronous
callers (the runner, the CLI, tests) drive it with plain method calls. Every
TCP listener's address is added to the policy's ``proxy_addresses``, so the
proxy never dials itself. A request for ``http://attest.firstrun.invalid/``
is answered by the proxy itself with its ``nonce``, so a sandbox can prove
which proxy it reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import ipaddress
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any, TypeVar

import h11

from firstrun.errors import ProxyError
from firstrun.policy.addresses import IPAddress
from firstrun.policy.decision import Decision, DecisionLayer, Reason, Verdict
from firstrun.policy.hosts import parse_ip_literal
from firstrun.policy.methods import InnerRequest, InspectionPolicy, decide_inner
from firstrun.policy.network import ATTESTATION_HOST, Channel, NetworkPolicy, Request, decide_addresses, decide_name
from firstrun.proxy.dns import DnsAnswer, SyntheticNames
from firstrun.proxy.dns import answer as dns_answer
from firstrun.proxy.dns import preload as preload_dns
from firstrun.proxy.errors import (
    PeerGone,
    Refused,
    UpstreamGone,
    listen_failed,
    refusal_for_protocol_error,
    upstream_failure,
)
from firstrun.proxy.flight import FlightKind, judge_flight
from firstrun.proxy.intercept import InterceptedTunnel, Interception, Timeouts
from firstrun.proxy.records import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_RECORDS,
    Capture,
    EgressRecord,
    RecordLog,
    Scheme,
    now_iso,
)
from firstrun.proxy.request import (
    Action,
    Target,
    classify_request,
    downstream_headers,
    upstream_headers,
)
from firstrun.proxy.tunnel import Tunnel

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
"""Resolve a canonical host once; raise ``OSError`` or return [] when it does not resolve."""

_READ = 1 << 16
_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class ProxyLimits:
    max_head_bytes: int = 64 * 1024
    # From a request's first byte to the end of its head: the slowloris bound.
    head_timeout_s: float = 10.0
    # Waiting for the next request on a kept-alive connection, or for body
    # bytes, or for the client to take our bytes.
    idle_timeout_s: float = 120.0
    resolve_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    upstream_timeout_s: float = 300.0
    # Open client connections per listener; more wait in the listen backlog.
    max_connections: int = 128
    backlog: int = 128
    # After a refusal, how long and how much unread input the proxy drains so
    # the client reads the 4xx instead of a reset (a "lingering close").
    linger_timeout_s: float = 2.0
    linger_bytes: int = 1 << 20
    # The record budget, per proxy: every listener shares it (see records).
    max_records: int = DEFAULT_MAX_RECORDS
    max_record_bytes: int = DEFAULT_MAX_BYTES


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """``getaddrinfo`` on the event loop's executor: every address, each once."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if addr not in found:
            found.append(addr)
    return found


class _Exchange:
    """What one request or tunnel has shown so far; becomes its record."""

    def __init__(self, channel: Channel, capture: Capture = Capture.PROXY) -> None:
        self.channel = channel
        self.capture = capture
        # What a tunnel's first flight was, once judged.
        self.flight: FlightKind | None = None
        # Set for what is no HTTP request nor tunnel (a refused datagram).
        self.scheme: Scheme | None = None
        self.name_would_deny: Reason | None = None
        self.ts = now_iso()
        self.started = time.monotonic()
        self.target: Target | None = None
        self.method: str | None = None
        self.allowed: Decision | None = None
        self.override: str | None = None
        self.refusal: Refused | None = None
        self.resolved: str | None = None
        self.status: int | None = None
        self.bytes_up = 0
        self.bytes_down = 0
        # Holds a place in the record budget (RecordLog.reserve).
        self.reserved = False
        # Its record is written (a refusal is recorded before its answer leaves).
        self.settled = False

    def begin(self) -> None:
        self.ts = now_iso()
        self.started = time.monotonic()

    def record(self) -> EgressRecord | None:
        target = self.target
        if self.refusal is not None:
            verdict, reason, layer = Verdict.DENY, self.refusal.reason, self.refusal.layer
            # A name report mode let through that then did not resolve keeps
            # what the name rules would have said: learning an allow-list needs
            # it. A refusal by the floor itself is no name rule's to report.
            would_deny = self.name_would_deny if self.refusal.reason is Reason.RESOLVE_FAILED \
                else None
            override = None
            host = self.refusal.host or (target.host if target else None)
        elif self.allowed is not None:
            verdict, reason, layer = Verdict.ALLOW, self.allowed.reason, self.allowed.layer
            would_deny, override = self.allowed.would_deny, self.override
            host = target.host if target else None
        else:
            return None
        scheme = self.scheme
        if target is not None and scheme is None:
            scheme = Scheme.HTTP
            if target.action is Action.TUNNEL:
                scheme = Scheme.HTTPS_TUNNEL if self.capture is Capture.PROXY \
                    else _TRANSPARENT_SCHEMES.get(self.flight, Scheme.TCP)
        return EgressRecord(
            ts=self.ts,
            id=uuid.uuid4().hex,
            channel=self.channel,
            method=(target.method or None) if target else self.method,
            scheme=scheme,
            host=host,
            port=target.port if target else None,
            path=target.path if target else None,
            decision=verdict,
            reason=reason,
            layer=layer,
            would_deny=would_deny,
            override=override,
            resolved=self.resolved,
            status=self.status,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            duration_ms=round((time.monotonic() - self.started) * 1000, 3),
            capture=self.capture,
        )


# A redirected flow's record names what it carried, once its first flight
# showed it (a CONNECT tunnel's stays https-tunnel, as it always was).
_TRANSPARENT_SCHEMES = {FlightKind.TLS: Scheme.HTTPS_TUNNEL, FlightKind.HTTP: Scheme.HTTP_TUNNEL}


def _policy_refusal(decision: Decision) -> Refused:
    return Refused(decision.reason, decision.host, layer=decision.layer, host=decision.host)


class _Client:
    """One client connection: a sequence of requests, or one tunnel."""

    def __init__(self, proxy: EgressProxy, sock: socket.socket, channel: Channel) -> None:
        self._proxy = proxy
        self._limits = proxy.limits
        self._sock = sock
        self._channel = channel
        self._loop = asyncio.get_running_loop()
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_head_bytes)
        self.tunnel: Tunnel | None = None
        self._refused = False

    async def run(self) -> None:
        try:
            while await self._exchange():
                if self._h11.our_state is not h11.DONE or self._h11.their_state is not h11.DONE:
                    return
                self._h11.start_next_cycle()
            if self._refused and self.tunnel is None:
                await self._linger()
        finally:
            self._sock.close()

    async def _linger(self) -> None:
        # Closing with unread input makes the kernel send a reset, which can
        # destroy the refusal before the client reads it. Stop writing, then
        # discard input for a bounded time and amount.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        deadline = self._loop.time() + self._limits.linger_timeout_s
        drained = 0
        with contextlib.suppress(PeerGone):
            while drained < self._limits.linger_bytes:
                data = await self._recv(self._sock, deadline - self._loop.time(), PeerGone)
                if not data:
                    return
                drained += len(data)

    async def _exchange(self) -> bool:
        """Serve one request; True when the connection may carry another."""
        ex = _Exchange(self._channel)
        try:
            return await self._serve(ex)
        except Refused as refusal:
            await self._refuse(ex, refusal)
            return False
        except PeerGone:
            return False
        finally:
            self._settle(ex)

    def _settle(self, ex: _Exchange) -> None:
        """Write ``ex``'s record, once: into its reservation, or offered when it holds none."""
        if ex.settled:
            return
        ex.settled = True
        log = self._proxy._log
        record = ex.record()
        if ex.reserved:
            if record is None:
                log.release()
            else:
                log.append(record, reserved=True)
        elif record is not None:
            # Unreserved means refused before anything was judged or
            # forwarded: recorded if the budget has room, else counted.
            log.offer(record)

    async def _serve(self, ex: _Exchange) -> bool:
        head = await self._read_head(ex)
        if head is None:
            return False
        event, raw = head
        ex.method = event.method.decode("ascii", "replace")
        if not self._proxy._log.reserve(self._channel):
            raise Refused(
                Reason.RECORD_BUDGET_EXHAUSTED,
                "the proxy's egress record budget is spent; it forwards nothing it cannot record",
            )
        ex.reserved = True
        ex.target = classify_request(event, raw, max_head_bytes=self._limits.max_head_bytes)
        target = ex.target
        if target.action is Action.ATTEST:
            return await self._attest(ex)
        if target.action is Action.FORWARD:
            self._judge_method(target, event)
        upstream = await self._admit(ex, target)
        try:
            if target.action is Action.TUNNEL:
                await self._tunnel(ex, target, upstream)
                return False
            return await self._forward(ex, event, target, upstream)
        finally:
            upstream.close()

    # -- reading the client ---------------------------------------------------

    async def _recv(self, sock: socket.socket, timeout: float, gone: type[Exception]) -> bytes | None:
        """Bytes from ``sock`` (b"" at EOF), or None when ``timeout`` passed first."""
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                return await self._loop.sock_recv(sock, _READ)
        except TimeoutError:
            return None
        except OSError as exc:
            raise gone(f"receive failed: {exc.strerror or exc}") from None

    async def _send(self, sock: socket.socket, data: bytes, gone: type[Exception]) -> int:
        try:
            async with asyncio.timeout(self._limits.idle_timeout_s):
                await self._loop.sock_sendall(sock, data)
        except OSError as exc:  # TimeoutError included: a peer that will not read
            raise gone(f"send failed: {exc.strerror or exc}") from None
        return len(data)

    async def _read_head(self, ex: _Exchange) -> tuple[h11.Request, bytes] | None:
        """The next request and the exact bytes of its head; None if the client left quietly."""
        conn = self._h11
        deadline: float | None = None
        while True:
            before = conn.trailing_data[0]
            if before and deadline is None:
                deadline = self._loop.time() + self._limits.head_timeout_s
                ex.begin()
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise refusal_for_protocol_error(exc) from None
            if isinstance(event, h11.Request):
                # h11 consumed exactly the head: the framing guards judge those bytes.
                return event, before[: len(before) - len(conn.trailing_data[0])]
            if isinstance(event, h11.ConnectionClosed):
                return None
            if deadline is None:
                data = await self._recv(self._sock, self._limits.idle_timeout_s, PeerGone)
                if data is None:
                    return None
            else:
                data = await self._recv(self._sock, deadline - self._loop.time(), PeerGone)
                if data is None:
                    raise Refused(Reason.REQUEST_TIMEOUT, "request head not complete in time")
            conn.receive_data(data)

    async def _client_event(self) -> h11.Event:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise refusal_for_protocol_error(exc) from None
            if event is h11.NEED_DATA:
                data = await self._recv(self._sock, self._limits.idle_timeout_s, PeerGone)
                if data is None:
                    raise PeerGone("client stalled mid-request")
                self._h11.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise PeerGone("client closed mid-request")
            return event

    async def _drain_request_body(self) -> None:
        while not isinstance(await self._client_event(), h11.EndOfMessage):
            pass

    async def _to_client(self, ex: _Exchange, *events: h11.Event) -> None:
        data = b"".join(self._h11.send(e) or b"" for e in events)
        ex.bytes_down += await self._send(self._sock, data, PeerGone)

    # -- answers the proxy gives itself ---------------------------------------

    async def _refuse(self, ex: _Exchange, refusal: Refused) -> None:
        self._refused = True
        ex.refusal = refusal
        ex.status = refusal.status
        body = f"firstrun proxy: {refusal.reason.value}: {refusal.detail}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"x-firstrun-reason", refusal.reason.value.encode()),
            (b"connection", b"close"),
        ]
        phrase = http.HTTPStatus(refusal.status).phrase.encode()
        events: list[h11.Event] = [
            h11.Response(status_code=refusal.status, headers=headers, reason=phrase)
        ]
        if ex.method != "HEAD":
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        try:
            data = b"".join(self._h11.send(e) or b"" for e in events)
        except h11.LocalProtocolError:
            data = b""  # a response was already under way; closing is the answer
        ex.bytes_down += len(data)
        # Recorded before it is answered: a client that has read its 403 and
        # moved on must find the refusal already in the log and told.
        self._settle(ex)
        with contextlib.suppress(PeerGone):
            await self._send(self._sock, data, PeerGone)

    async def _attest(self, ex: _Exchange) -> bool:
        await self._drain_request_body()
        ex.allowed = Decision(
            verdict=Verdict.ALLOW, reason=Reason.ATTESTATION, layer=DecisionLayer.PROTOCOL,
            host=ex.target.host if ex.target else "",
        )
        body = self._proxy.nonce.encode("ascii")
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        ex.status = 200
        events: list[h11.Event] = [h11.Response(status_code=200, headers=headers, reason=b"OK")]
        if ex.method != "HEAD":
            events.append(h11.Data(data=body))
        await self._to_client(ex, *events, h11.EndOfMessage())
        return True

    # -- the decision ---------------------------------------------------------

    def _inspection(self) -> InspectionPolicy | None:
        """The method rules, for the shell channel when the run inspects; else None."""
        return self._proxy.policy.inspection if self._channel is Channel.SHELL else None

    def _judge_method(self, target: Target, event: h11.Request) -> None:
        """Under inspection plain HTTP is judged like decrypted HTTPS, before anything is dialled."""
        inspection = self._inspection()
        if inspection is None:
            return
        declared = next((int(v) for n, v in event.headers if n == b"content-length"), 0)
        decision = decide_inner(inspection, InnerRequest(
            host=target.host, port=target.port, method=target.method, path=target.path or "/",
            body_bytes=declared,
        ))
        if not decision.allowed:
            raise Refused(decision.reason, f"{target.method} {target.host}{target.path}",
                          layer=decision.layer, host=target.host)

    async def _admit(self, ex: _Exchange, target: Target) -> socket.socket:
        """Decide, resolve once, decide again, and dial a checked address."""
        policy = self._proxy.policy
        request = Request(channel=self._channel, host=target.host, port=target.port)
        by_name = decide_name(policy, request)
        if not by_name.allowed:
            raise _policy_refusal(by_name)
        ex.name_would_deny = by_name.would_deny
        literal = parse_ip_literal(target.host)
        addresses = [literal] if literal is not None else await self._proxy._resolve(target)
        by_address = decide_addresses(policy, request, addresses)
        if not by_address.allowed:
            raise _policy_refusal(by_address)
        if not addresses:
            # Report mode let an unresolvable name through: there is nothing to dial.
            raise Refused(
                Reason.RESOLVE_FAILED, target.host, layer=DecisionLayer.FLOOR, host=target.host
            )
        ex.allowed = by_name if by_name.would_deny is not None else by_address
        ex.override = by_address.override or by_name.override
        return await self._dial(ex, target, addresses)

    async def _dial(
        self, ex: _Exchange, target: Target, addresses: Sequence[IPAddress]
    ) -> socket.socket:
        try:
            async with asyncio.timeout(self._limits.connect_timeout_s):
                for addr in addresses:
                    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
                    sock = socket.socket(family, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    try:
                        await self._loop.sock_connect(sock, (str(addr), target.port))
                    except OSError:
                        sock.close()
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    ex.resolved = str(addr)
                    return sock
        except TimeoutError:
            pass
        raise upstream_failure(target.host, connected=False)

    # -- carrying the traffic -------------------------------------------------

    async def _tunnel(self, ex: _Exchange, target: Target, upstream: socket.socket) -> None:
        if not isinstance(await self._client_event(), h11.EndOfMessage):
            raise Refused(Reason.MALFORMED_REQUEST, "CONNECT with a body")
        established = h11.Response(status_code=200, reason=b"Connection established", headers=[])
        await self._to_client(ex, established)
        ex.status = 200
        await self._through(ex, target, upstream, self._h11.trailing_data[0])

    async def _through(self, ex: _Exchange, target: Target, upstream: socket.socket,
                       initial: bytes) -> None:
        """An admitted tunnel: decrypted under inspection, else carried as it is.

        Only the shell channel carries untrusted traffic; the docs channel is
        the harness's own reader, which verifies the real server itself. A
        stream a ``tcp`` rule names (ssh, a database) is carried as it is
        even under inspection: there is no TLS in it to open.
        """
        by_rule = any(p.matches(target.host, target.port) for p in self._proxy.policy.tcp)
        if self._inspection() is not None and not by_rule:
            await self._intercept(ex, target, upstream, initial)
            return
        await self._carry(ex, target, upstream, initial)

    async def _carry(self, ex: _Exchange, target: Target, upstream: socket.socket,
                     initial: bytes) -> None:
        """Carry an admitted tunnel's bytes once its first flight passed ``judge_flight``."""
        policy = self._proxy.policy
        tunnel = Tunnel(
            client=self._sock, upstream=upstream, initial=initial,
            judge=lambda flight: judge_flight(flight, host=target.host, port=target.port,
                                              policy=policy, connect=ex.capture is Capture.PROXY),
        )
        self.tunnel = tunnel
        result = await tunnel.run()
        ex.bytes_up, ex.bytes_down = result.bytes_up, result.bytes_down
        ex.flight = result.flight
        if result.decision is not None:
            ex.allowed = result.decision
        if result.refusal is not None:
            ex.refusal = result.refusal
            ex.status = None

    async def _intercept(self, ex: _Exchange, target: Target, upstream: socket.socket,
                         initial: bytes) -> None:
        policy = self._proxy.policy.inspection
        interception = self._proxy.interception
        assert policy is not None and interception is not None
        limits = self._limits
        result = await InterceptedTunnel(
            client=self._sock, upstream=upstream, host=target.host, port=target.port,
            initial=initial, resolved=ex.resolved, channel=self._channel,
            policy=policy, interception=interception, emit=self._emit_inner,
            timeouts=Timeouts(
                head_s=limits.head_timeout_s, idle_s=limits.idle_timeout_s,
                connect_s=limits.connect_timeout_s, upstream_s=limits.upstream_timeout_s,
                linger_s=limits.linger_timeout_s, linger_bytes=limits.linger_bytes,
                max_head_bytes=limits.max_head_bytes,
            ),
        ).run()
        ex.bytes_up, ex.bytes_down = result.bytes_up, result.bytes_down
        if result.refusal is not None:
            ex.refusal = result.refusal
            ex.status = None

    def _emit_inner(self, record: EgressRecord) -> None:
        """A decrypted request's record: written (it went out); a full budget ends the tunnel.

        The tunnel reserves nothing per inner request, so once the budget has
        no room it must not read another. Closing the client socket here,
        before the tunnel's next read, discards whatever the client sent
        since (shutting down the read side would not: Linux still returns
        bytes already queued); the tunnel's next read fails as a peer gone.
        """
        log = self._proxy._log
        log.append(record)
        if not log.has_room():
            self._sock.close()

    async def _forward(
        self, ex: _Exchange, event: h11.Request, target: Target, upstream: socket.socket
    ) -> bool:
        up = h11.Connection(h11.CLIENT)
        headers = upstream_headers(list(event.headers), target)
        request = h11.Request(method=event.method, target=target.path or "/", headers=headers)
        inspection = self._inspection()
        try:
            if inspection is not None:
                # Read and judged whole before a byte goes upstream, as in a tunnel.
                body = await self._capped_body(ex, inspection, target)
                data = up.send(request) or b""
                if body:
                    data += up.send(h11.Data(data=body)) or b""
                data += up.send(h11.EndOfMessage()) or b""
                ex.bytes_up += await self._send(upstream, data, UpstreamGone)
            else:
                await self._stream_body(ex, up, request, upstream)
            response = await self._upstream_event(up, upstream)
            while isinstance(response, h11.InformationalResponse):
                # 1xx are hop-by-hop: the proxy already answered Expect itself.
                response = await self._upstream_event(up, upstream)
            if not isinstance(response, h11.Response):
                raise UpstreamGone("no response head")
        except UpstreamGone:
            raise upstream_failure(target.host, connected=True) from None
        ex.status = response.status_code
        await self._to_client(
            ex,
            h11.Response(
                status_code=response.status_code,
                headers=downstream_headers(list(response.headers)),
                reason=response.reason,
            ),
        )
        try:
            while True:
                body = await self._upstream_event(up, upstream)
                if isinstance(body, h11.Data):
                    await self._to_client(ex, h11.Data(data=body.data))
                elif isinstance(body, h11.EndOfMessage):
                    await self._to_client(ex, h11.EndOfMessage())
                    return True
        except UpstreamGone:
            # The client already has our status line: closing is all that is left.
            return False

    async def _stream_body(
        self, ex: _Exchange, up: h11.Connection, request: h11.Request, upstream: socket.socket
    ) -> None:
        ex.bytes_up += await self._send(upstream, up.send(request) or b"", UpstreamGone)
        if self._h11.they_are_waiting_for_100_continue:
            await self._to_client(ex, h11.InformationalResponse(status_code=100, headers=[]))
        while True:
            body_event = await self._client_event()
            if isinstance(body_event, h11.Data):
                chunk = up.send(h11.Data(data=body_event.data)) or b""
                ex.bytes_up += await self._send(upstream, chunk, UpstreamGone)
            elif isinstance(body_event, h11.EndOfMessage):
                ex.bytes_up += await self._send(upstream, up.send(h11.EndOfMessage()) or b"", UpstreamGone)
                return

    async def _capped_body(self, ex: _Exchange, inspection: InspectionPolicy, target: Target) -> bytes:
        if self._h11.they_are_waiting_for_100_continue:
            await self._to_client(ex, h11.InformationalResponse(status_code=100, headers=[]))
        body = bytearray()
        while not isinstance(event := await self._client_event(), h11.EndOfMessage):
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > inspection.max_body_bytes:
                    raise Refused(Reason.BODY_TOO_LARGE,
                                  f"body over {inspection.max_body_bytes} bytes",
                                  layer=DecisionLayer.METHODS, host=target.host)
        return bytes(body)

    async def _upstream_event(self, up: h11.Connection, sock: socket.socket) -> h11.Event:
        while True:
            try:
                event = up.next_event()
            except h11.RemoteProtocolError as exc:
                raise UpstreamGone(f"invalid HTTP from upstream ({exc.error_status_hint})") from None
            if event is h11.NEED_DATA:
                data = await self._recv(sock, self._limits.upstream_timeout_s, UpstreamGone)
                if data is None:
                    raise UpstreamGone("upstream stalled")
                up.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise UpstreamGone("upstream closed")
            return event


# A transparent flow's header, written by the sandbox's relay: "tcp|udp ADDRESS PORT\n".
_MAX_FLOW_HEADER = 128


class _TransparentClient(_Client):
    """One flow the sandbox's relay redirected here: a header naming where it was going, then
    its bytes (a TCP connection), or nothing more (a datagram that was refused).

    The address is mapped back to the name the DNS stub answered it for and
    decided by name, exactly as a CONNECT to that name would be (an address
    that stands for no name is decided as the IP literal it is); the flow
    is then carried like a CONNECT tunnel, first flight judged, without the
    CONNECT handshake. Its record says ``capture: transparent``.
    """

    async def run(self) -> None:
        try:
            header = await self._flow_header()
            if header is None:
                return
            (kind, address, port), rest = header
            ex = _Exchange(self._channel, Capture.TRANSPARENT)
            ex.begin()
            try:
                await self._flow(ex, kind, address, port, rest)
            except Refused as refusal:
                ex.refusal, ex.status = refusal, None
            except PeerGone:
                pass
            finally:
                self._settle(ex)
        finally:
            self._sock.close()

    async def _flow_header(self) -> tuple[tuple[str, IPAddress, int], bytes] | None:
        buf = b""
        deadline = self._loop.time() + self._limits.head_timeout_s
        while b"\n" not in buf:
            if len(buf) > _MAX_FLOW_HEADER:
                return None
            data = await self._recv(self._sock, deadline - self._loop.time(), PeerGone)
            if not data:
                return None
            buf += data
        line, rest = buf.split(b"\n", 1)
        try:
            kind, address, port_text = line.decode("ascii").split(" ")
            port = int(port_text)
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return None
        if kind not in ("tcp", "udp") or not 0 < port < 65536:
            return None
        return (kind, parsed, port), rest

    async def _flow(self, ex: _Exchange, kind: str, address: IPAddress, port: int,
                    rest: bytes) -> None:
        name = self._proxy.synthetic.name_for(address)
        host = name if name is not None else str(address)
        target = Target(action=Action.TUNNEL, method="", host=host, port=port, path=None)
        ex.target = target
        if kind == "udp":
            ex.scheme = Scheme.UDP
            raise Refused(Reason.UDP_NOT_ALLOWED, f"a datagram to {host}:{port}: only DNS "
                          "leaves the sandbox over UDP", layer=DecisionLayer.PROTOCOL, host=host)
        if not self._proxy._log.reserve(self._channel):
            raise Refused(Reason.RECORD_BUDGET_EXHAUSTED,
                          "the proxy's egress record budget is spent; it forwards nothing it "
                          "cannot record")
        ex.reserved = True
        if host == ATTESTATION_HOST:
            await self._attest_flow(ex, rest)
            return
        upstream = await self._admit(ex, target)
        try:
            ex.status = 200
            await self._through(ex, target, upstream, rest)
        finally:
            upstream.close()

    async def _attest_flow(self, ex: _Exchange, rest: bytes) -> None:
        """Answer a plain GET to the attestation host with the nonce, as the proxy-aware path does."""
        buf = rest
        deadline = self._loop.time() + self._limits.head_timeout_s
        while b"\r\n\r\n" not in buf and len(buf) < self._limits.max_head_bytes:
            data = await self._recv(self._sock, deadline - self._loop.time(), PeerGone)
            if not data:
                break
            buf += data
        ex.bytes_up = len(buf)
        ex.allowed = Decision(verdict=Verdict.ALLOW, reason=Reason.ATTESTATION,
                              layer=DecisionLayer.PROTOCOL, host=ATTESTATION_HOST)
        ex.scheme = Scheme.HTTP_TUNNEL
        body = self._proxy.nonce.encode("ascii")
        reply = (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n"
                 b"cache-control: no-store\r\nconnection: close\r\n"
                 b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        ex.status = 200
        ex.bytes_down = await self._send(self._sock, reply, PeerGone)


class _DnsClient(_Client):
    """DNS over one stream, framed as DNS over TCP is (RFC 1035 4.2.2): each query is
    answered by ``dns.answer`` from the policy alone, and each refused name recorded."""

    async def run(self) -> None:
        try:
            while (query := await self._frame()) is not None:
                result = dns_answer(query, policy=self._proxy.policy, names=self._proxy.synthetic)
                if result.refusal is not None and self._proxy._first_dns_refusal(result.name):
                    self._proxy._log.offer(self._dns_record(result))
                if result.wire is not None:
                    frame = len(result.wire).to_bytes(2, "big") + result.wire
                    await self._send(self._sock, frame, PeerGone)
        except PeerGone:
            pass
        finally:
            self._sock.close()

    async def _frame(self) -> bytes | None:
        buf = b""
        need = 2
        while True:
            while len(buf) < need:
                data = await self._recv(self._sock, self._limits.idle_timeout_s, PeerGone)
                if not data:
                    return None
                buf += data
            if need == 2:
                need = 2 + int.from_bytes(buf[:2], "big")
                continue
            # One query per frame, and no pipelining past it.
            return buf[2:need]

    def _dns_record(self, result: DnsAnswer) -> EgressRecord:
        decision = result.refusal
        assert decision is not None
        return EgressRecord(
            ts=now_iso(), id=uuid.uuid4().hex, channel=self._channel, method=result.qtype,
            scheme=Scheme.DNS, host=result.name, port=53, path=None,
            decision=decision.verdict, reason=decision.reason, layer=decision.layer,
            would_deny=decision.would_deny, override=None, resolved=None, status=None,
            bytes_up=0, bytes_down=0, duration_ms=0.0, capture=Capture.TRANSPARENT,
        )


class ListenerKind(StrEnum):
    """What a listener speaks: proxy requests (HTTP and CONNECT), redirected flows, or DNS."""

    PROXY = "proxy"
    TRANSPARENT = "transparent"
    DNS = "dns"


_CLIENTS: dict[ListenerKind, type[_Client]] = {
    ListenerKind.PROXY: _Client, ListenerKind.TRANSPARENT: _TransparentClient,
    ListenerKind.DNS: _DnsClient,
}


@dataclass(frozen=True, kw_only=True)
class _Listener:
    sock: socket.socket
    channel: Channel
    unix_path: str | None
    kind: ListenerKind = ListenerKind.PROXY


class EgressProxy:
    """The recording egress proxy; see the module docstring for what it guarantees."""

    def __init__(
        self,
        policy: NetworkPolicy,
        *,
        record_path: str | None = None,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
        on_record: Callable[[EgressRecord], None] | None = None,
        interception: Interception | None = None,
    ) -> None:
        # Inspection is all or nothing: rules without a CA to decrypt with, or
        # a CA without rules to apply, would each be a quiet downgrade.
        if (interception is None) != (policy.inspection is None):
            raise ProxyError(
                "TLS inspection needs both the policy's inspection rules and an Interception"
            )
        self.interception = interception
        self._policy = policy
        self._resolver: Resolver = resolver or system_resolver
        self.limits = limits or ProxyLimits()
        # ``on_record`` sees each record the moment it is written (see RecordLog).
        self._log = RecordLog(record_path, on_record=on_record,
                              max_records=self.limits.max_records,
                              max_bytes=self.limits.max_record_bytes)
        self.nonce = secrets.token_urlsafe(24)
        # What the transparent DNS answered: the names behind synthetic addresses.
        self.synthetic = SyntheticNames()
        # A name refused once is recorded once (its A, AAAA and retries are one refusal).
        self._dns_refused: set[str | None] = set()
        self._dns_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listeners: list[tuple[_Listener, asyncio.Task[None]]] = []
        self._clients: dict[_Client, asyncio.Task[None]] = {}

    @property
    def policy(self) -> NetworkPolicy:
        """The policy in force, with the proxy's own listeners as ``proxy_addresses``."""
        return self._policy

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> EgressProxy:
        if self._thread is not None:
            raise ProxyError("proxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="firstrun-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = None
        self._thread = None
        self._log.close()

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._loop is None:
            coro.close()
            raise ProxyError("proxy not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _shutdown(self) -> None:
        for listener, task in self._listeners:
            task.cancel()
            listener.sock.close()
            if listener.unix_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(listener.unix_path)
        self._listeners.clear()
        for client, task in list(self._clients.items()):
            # A tunnel ends when its sockets do, and then writes its record.
            if client.tunnel is not None:
                client.tunnel.abort()
            else:
                task.cancel()
        await asyncio.gather(*self._clients.values(), return_exceptions=True)

    # -- listeners ------------------------------------------------------------

    def listen_unix(self, path: str, channel: Channel,
                    kind: ListenerKind = ListenerKind.PROXY) -> str:
        """Listen on a new Unix socket at ``path`` (mode 0o666: a sandbox uid connects)."""
        return self._call(self._listen_unix(path, channel, kind))

    def listen_tcp(self, channel: Channel, host: str = "127.0.0.1", port: int = 0,
                   kind: ListenerKind = ListenerKind.PROXY) -> tuple[str, int]:
        """Listen on TCP; port 0 picks a free one. Returns the bound address."""
        return self._call(self._listen_tcp(channel, host, port, kind))

    async def _listen_unix(self, path: str, channel: Channel, kind: ListenerKind) -> str:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o666)
            sock.listen(self.limits.backlog)
        except OSError as exc:
            sock.close()
            raise listen_failed(exc, path) from None
        self._add_listener(_Listener(sock=sock, channel=channel, unix_path=path, kind=kind))
        return path

    async def _listen_tcp(self, channel: Channel, host: str, port: int,
                          kind: ListenerKind) -> tuple[str, int]:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(self.limits.backlog)
        except OSError as exc:
            sock.close()
            raise listen_failed(exc, f"{host}:{port}") from None
        bound_host, bound_port = sock.getsockname()[:2]
        self._policy = self._policy.with_proxy_addresses(
            [*self._policy.proxy_addresses, (bound_host, bound_port)]
        )
        self._add_listener(_Listener(sock=sock, channel=channel, unix_path=None, kind=kind))
        return bound_host, bound_port

    def _add_listener(self, listener: _Listener) -> None:
        if listener.kind is ListenerKind.DNS:
            # The sandbox's first query comes once it is up; until then the
            # harness mostly waits, and dnspython imports in that time.
            preload_dns()
        listener.sock.setblocking(False)
        task = asyncio.get_running_loop().create_task(self._accept(listener))
        self._listeners.append((listener, task))

    async def _accept(self, listener: _Listener) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.limits.max_connections)
        while True:
            await slots.acquire()
            try:
                sock, _ = await loop.sock_accept(listener.sock)
            except OSError:
                # EMFILE or an aborted handshake: back off instead of spinning.
                slots.release()
                await asyncio.sleep(0.05)
                continue
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _CLIENTS[listener.kind](self, sock, listener.channel)
            task = loop.create_task(client.run())
            self._clients[client] = task

            def done(_: asyncio.Task[None], client: _Client = client) -> None:
                self._clients.pop(client, None)
                slots.release()

            task.add_done_callback(done)

    def _first_dns_refusal(self, name: str | None) -> bool:
        with self._dns_lock:
            if name in self._dns_refused:
                return False
            self._dns_refused.add(name)
            return True

    async def _resolve(self, target: Target) -> list[IPAddress]:
        try:
            async with asyncio.timeout(self.limits.resolve_timeout_s):
                return list(await self._resolver(target.host, target.port))
        except OSError:  # gaierror and TimeoutError included
            return []

    # -- records --------------------------------------------------------------

    def records(self) -> list[EgressRecord]:
        return self._log.snapshot()

    def denied(self) -> list[EgressRecord]:
        return [r for r in self._log.snapshot() if r.denied]


def capture_listeners(proxy: EgressProxy, sockdir: str) -> dict[str, str]:
    """The proxy's listeners for redirected flows and DNS, as ``ProxyEndpoint`` fields."""
    return {
        "transparent_path": proxy.listen_unix(os.path.join(sockdir, "transparent.sock"),
                                              Channel.SHELL, ListenerKind.TRANSPARENT),
        "dns_path": proxy.listen_unix(os.path.join(sockdir, "dns.sock"), Channel.SHELL,
                                      ListenerKind.DNS),
    }
