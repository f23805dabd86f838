"""TLS inspection: the proxy ends the client's TLS, judges each request, and re-encrypts.

Guarantee: with ``--inspect-tls`` a CONNECT tunnel that the network policy
admitted carries TLS or nothing. The client's ClientHello must name the
CONNECT target (SNI) and must not hide it (ECH); the proxy then verifies the
real server against the system trust store before it shows the client a
certificate from the run's CA (``ca.RunCA``), and offers the client only
HTTP/1.1 (ALPN), which h11 parses. Every decrypted request must carry a
Host header naming the same host and port as the CONNECT, and is decided by
``policy.methods.decide_inner`` before any byte of it goes upstream: a
refused upload reaches nobody, and its body is read at most up to the
policy's cap. Each decrypted request leaves one ``EgressRecord`` (scheme
``https``: method, path, status, bytes, reason, and the names of the
credentials swapped into it); the tunnel itself keeps its own record.

Credential placeholders are swapped (``credentials.substitute``) only here,
so never in plain HTTP, and only for the host each credential names.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import os
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import h11

from firstrun.policy.decision import Decision, Reason, Verdict
from firstrun.policy.hosts import parse_ip_literal
from firstrun.policy.methods import InnerRequest, InspectionPolicy, decide_inner
from firstrun.policy.network import Channel
from firstrun.policy.process import SANDBOX_CA_BUNDLE
from firstrun.proxy.credentials import MaskedCredential, mint, substitute
from firstrun.proxy.errors import (
    PeerGone,
    Refused,
    UpstreamGone,
    refusal_for_protocol_error,
)
from firstrun.proxy.flight import judge_first_flight
from firstrun.proxy.records import EgressRecord, Scheme, now_iso
from firstrun.proxy.request import (
    authority_text,
    check_framing,
    downstream_headers,
    end_to_end,
    parse_authority,
)
from firstrun.proxy.tls import MAX_CLIENT_HELLO, Hello, HelloStatus, parse_client_hello

if TYPE_CHECKING:
    from firstrun.proxy.ca import RunCA

_READ = 1 << 16


@dataclass(frozen=True, kw_only=True)
class Interception:
    """What the proxy needs to inspect TLS: the run's CA, upstream trust, masked credentials."""

    ca: RunCA
    upstream: ssl.SSLContext
    credentials: tuple[MaskedCredential, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    head_s: float
    idle_s: float
    connect_s: float
    upstream_s: float
    linger_s: float
    linger_bytes: int
    max_head_bytes: int


class _TLS:
    """One TLS endpoint over a non-blocking socket, driven by the event loop through memory BIOs."""

    def __init__(self, sock: socket.socket, obj_factory: Callable[[ssl.MemoryBIO, ssl.MemoryBIO], ssl.SSLObject],
                 gone: type[Exception]) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = obj_factory(self._in, self._out)
        self._gone = gone
        self.raw_in = 0
        self.raw_out = 0

    def feed(self, data: bytes) -> None:
        self._in.write(data)
        self.raw_in += len(data)

    async def _flush(self, timeout: float) -> None:
        data = self._out.read()
        if not data:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._loop.sock_sendall(self._sock, data)
        except OSError as exc:  # TimeoutError included
            raise self._gone(f"send failed: {exc.strerror or exc}") from None
        self.raw_out += len(data)

    async def _fill(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                data = await self._loop.sock_recv(self._sock, _READ)
        except OSError as exc:  # TimeoutError included
            raise self._gone(f"receive failed: {exc.strerror or exc}") from None
        if data:
            self.feed(data)
        else:
            self._in.write_eof()

    async def _run(self, op: Callable[[], object], timeout: float) -> object:
        while True:
            try:
                result = op()
            except ssl.SSLWantReadError:
                await self._flush(timeout)
                await self._fill(timeout)
                continue
            await self._flush(timeout)
            return result

    async def handshake(self, timeout: float) -> None:
        """Raises ``ssl.SSLError`` (a certificate error included) or ``gone``."""
        await self._run(self._obj.do_handshake, timeout)

    async def recv(self, timeout: float) -> bytes:
        """Plaintext; b"" when the peer closed, cleanly or not."""
        try:
            data = await self._run(lambda: self._obj.read(_READ), timeout)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return b""
        except ssl.SSLError as exc:
            raise self._gone(f"TLS error: {exc.reason or exc}") from None
        assert isinstance(data, bytes)
        return data

    async def send(self, data: bytes, timeout: float) -> int:
        # A memory BIO takes every byte: SSL_write returns only once all are written.
        try:
            await self._run(lambda: self._obj.write(data), timeout)
        except ssl.SSLError as exc:
            raise self._gone(f"TLS error: {exc.reason or exc}") from None
        return len(data)

    async def close(self, timeout: float) -> None:
        # close_notify, best effort: the socket closes right after either way.
        with contextlib.suppress(ssl.SSLError, PeerGone, UpstreamGone):
            self._obj.unwrap()
        with contextlib.suppress(PeerGone, UpstreamGone):
            await self._flush(timeout)


class _Inner:
    """What one decrypted request has shown so far; becomes its record."""

    def __init__(self, channel: Channel, host: str, port: int, resolved: str | None) -> None:
        self.ts = now_iso()
        self.started = time.monotonic()
        self.channel = channel
        self.host = host
        self.port = port
        self.resolved = resolved
        self.method: str | None = None
        self.path: str | None = None
        self.decision: Decision | None = None
        self.refusal: Refused | None = None
        self.status: int | None = None
        self.bytes_up = 0
        self.bytes_down = 0
        self.credentials: tuple[str, ...] = ()

    def record(self) -> EgressRecord | None:
        if self.refusal is not None:
            verdict, reason, layer = Verdict.DENY, self.refusal.reason, self.refusal.layer
            override = None
        elif self.decision is not None:
            verdict, reason, layer = Verdict.ALLOW, self.decision.reason, self.decision.layer
            override = self.decision.override
        else:
            return None
        return EgressRecord(
            ts=self.ts, id=uuid.uuid4().hex, channel=self.channel, method=self.method,
            scheme=Scheme.HTTPS, host=self.host, port=self.port, path=self.path,
            decision=verdict, reason=reason, layer=layer, would_deny=None, override=override,
            resolved=self.resolved, status=self.status, bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            duration_ms=round((time.monotonic() - self.started) * 1000, 3),
            credentials=self.credentials,
        )


@dataclass(frozen=True, kw_only=True)
class InterceptResult:
    bytes_up: int
    bytes_down: int
    # Why the tunnel as a whole was refused (bad SNI, not TLS, a server that
    # failed verification); None when it carried requests, each recorded.
    refusal: Refused | None


class InterceptedTunnel:
    """One admitted CONNECT, decrypted: a sequence of judged HTTP/1.1 requests."""

    def __init__(
        self, *, client: socket.socket, upstream: socket.socket, host: str, port: int,
        initial: bytes, resolved: str | None, channel: Channel, policy: InspectionPolicy,
        interception: Interception, timeouts: Timeouts, emit: Callable[[EgressRecord], None],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._client_sock = client
        self._upstream_sock = upstream
        self._host = host
        self._port = port
        self._initial = initial
        self._resolved = resolved
        self._channel = channel
        self._policy = policy
        self._interception = interception
        self._t = timeouts
        self._emit = emit
        self._client: _TLS | None = None
        self._upstream: _TLS | None = None

    def _result(self, refusal: Refused | None) -> InterceptResult:
        up = self._client.raw_in if self._client else len(self._initial)
        down = self._client.raw_out if self._client else 0
        return InterceptResult(bytes_up=up, bytes_down=down, refusal=refusal)

    async def run(self) -> InterceptResult:
        flight = await self._first_flight()
        if flight is None:
            return self._result(None)
        data, hello = flight
        refusal = self._judge_hello(hello)
        if refusal is not None:
            return self._result(refusal)
        upstream_refusal = await self._connect_upstream()
        self._client = _TLS(
            self._client_sock,
            lambda i, o: self._interception.ca.server_context(self._host).wrap_bio(
                i, o, server_side=True),
            PeerGone,
        )
        self._client.feed(data)
        try:
            await self._client.handshake(self._t.head_s)
        except (ssl.SSLError, PeerGone) as exc:
            return self._result(Refused(
                Reason.CLIENT_TLS_FAILED,
                f"the client refused the run CA's certificate for {self._host} "
                f"(does it trust the run's CA bundle?): {exc}",
                host=self._host,
            ))
        try:
            await self._serve(upstream_refusal)
        finally:
            await self._client.close(self._t.linger_s)
            if self._upstream is not None:
                await self._upstream.close(self._t.linger_s)
        return self._result(None)

    # -- the handshakes -------------------------------------------------------

    async def _first_flight(self) -> tuple[bytes, Hello] | None:
        buf = bytearray(self._initial)
        deadline = self._loop.time() + self._t.head_s
        while True:
            hello = parse_client_hello(bytes(buf))
            if hello.status is not HelloStatus.INCOMPLETE:
                return bytes(buf), hello
            if len(buf) >= MAX_CLIENT_HELLO:
                return bytes(buf), Hello(status=HelloStatus.MALFORMED)
            try:
                async with asyncio.timeout(max(deadline - self._loop.time(), 0.0)):
                    chunk = await self._loop.sock_recv(self._client_sock, _READ)
            except TimeoutError:
                return (bytes(buf), Hello(status=HelloStatus.MALFORMED)) if buf else None
            except OSError:
                return None
            if not chunk:
                return (bytes(buf), hello) if buf else None
            buf += chunk

    def _judge_hello(self, hello: Hello) -> Refused | None:
        refusal = judge_first_flight(hello, self._host)
        if refusal is not None:
            return refusal
        if hello.status is HelloStatus.NOT_TLS:
            # Opaque bytes would carry requests no rule could see.
            return Refused(Reason.TLS_REQUIRED, f"tunnel to {self._host} does not carry TLS",
                           host=self._host)
        if hello.sni is None and parse_ip_literal(self._host) is None:
            return Refused(Reason.SNI_MISMATCH, f"no SNI in a tunnel to {self._host}",
                           host=self._host)
        return None

    async def _connect_upstream(self) -> Refused | None:
        """Verify the real server; the refusal answers the client's first request."""
        self._upstream = _TLS(
            self._upstream_sock,
            lambda i, o: self._interception.upstream.wrap_bio(
                i, o, server_side=False, server_hostname=self._host),
            UpstreamGone,
        )
        try:
            await self._upstream.handshake(self._t.connect_s)
        except ssl.SSLCertVerificationError as exc:
            self._upstream = None
            return Refused(Reason.UPSTREAM_CERTIFICATE_INVALID,
                           f"{self._host}: {exc.verify_message}", host=self._host)
        except (ssl.SSLError, UpstreamGone) as exc:
            self._upstream = None
            return Refused(Reason.UPSTREAM_FAILED, f"TLS to {self._host} failed: {exc}",
                           host=self._host)
        return None

    # -- the requests ---------------------------------------------------------

    async def _serve(self, upstream_refusal: Refused | None) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._t.max_head_bytes)
        up = h11.Connection(h11.CLIENT)
        while True:
            inner = _Inner(self._channel, self._host, self._port, self._resolved)
            try:
                keep = await self._one(conn, up, inner, upstream_refusal)
            except Refused as refusal:
                await self._refuse(conn, inner, refusal)
                keep = False
            except (PeerGone, UpstreamGone, h11.LocalProtocolError):
                # LocalProtocolError: the client already has part of a response
                # it can no longer be given whole; closing is the answer.
                keep = False
            finally:
                record = inner.record()
                if record is not None:
                    self._emit(record)
            if not keep:
                return
            conn.start_next_cycle()
            up.start_next_cycle()

    async def _client_event(self, conn: h11.Connection, timeout: float) -> h11.Event:
        assert self._client is not None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise refusal_for_protocol_error(exc) from None
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await self._client.recv(timeout))

    async def _head(self, conn: h11.Connection, inner: _Inner) -> tuple[h11.Request, bytes] | None:
        assert self._client is not None
        deadline: float | None = None
        while True:
            before = conn.trailing_data[0]
            if before and deadline is None:
                deadline = self._loop.time() + self._t.head_s
                inner.ts, inner.started = now_iso(), time.monotonic()
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise refusal_for_protocol_error(exc) from None
            if isinstance(event, h11.Request):
                return event, before[: len(before) - len(conn.trailing_data[0])]
            if isinstance(event, h11.ConnectionClosed):
                return None
            timeout = self._t.idle_s if deadline is None else deadline - self._loop.time()
            if timeout <= 0:
                raise Refused(Reason.REQUEST_TIMEOUT, "request head not complete in time")
            try:
                data = await self._client.recv(timeout)
            except PeerGone:
                if deadline is None:
                    return None
                raise Refused(Reason.REQUEST_TIMEOUT, "request head not complete in time") from None
            conn.receive_data(data)

    def _check_request(self, event: h11.Request, raw: bytes, inner: _Inner) -> int | None:
        """Judge the head; returns the declared body length (None when chunked)."""
        headers = list(event.headers)
        check_framing(headers, raw, max_head_bytes=self._t.max_head_bytes)
        try:
            inner.method = event.method.decode("ascii")
            inner.path = event.target.decode("ascii")
        except UnicodeDecodeError:
            raise Refused(Reason.MALFORMED_REQUEST, "non-ASCII request line") from None
        if not inner.path.startswith("/"):
            raise Refused(Reason.MALFORMED_REQUEST,
                          "request target inside a tunnel must be origin-form", host=self._host)
        hosts = [value for name, value in headers if name == b"host"]
        # HTTP/1.0 may omit Host, and two could name two hosts: exactly one is judged.
        if len(hosts) != 1:
            raise Refused(Reason.HOST_MISMATCH,
                          f"{len(hosts)} Host headers inside the tunnel; exactly one is needed",
                          host=self._host)
        text = hosts[0].decode("ascii", "replace")
        try:
            named = parse_authority(text, default_port=443)
        except Refused:
            named = None
        if named != (self._host, self._port):
            raise Refused(Reason.HOST_MISMATCH,
                          f"Host {text!r} is not the CONNECT target {self._host}:{self._port}",
                          host=self._host)
        length = next((v for n, v in headers if n == b"content-length"), None)
        if length is not None:
            return int(length)
        return None if any(n == b"transfer-encoding" for n, _ in headers) else 0

    def _decide(self, inner: _Inner, body_bytes: int) -> Decision:
        assert inner.method is not None and inner.path is not None
        decision = decide_inner(self._policy, InnerRequest(
            host=self._host, port=self._port, method=inner.method, path=inner.path,
            body_bytes=body_bytes,
        ))
        if not decision.allowed:
            raise Refused(decision.reason, f"{inner.method} {self._host}{inner.path}",
                          layer=decision.layer, host=self._host)
        return decision

    async def _one(self, conn: h11.Connection, up: h11.Connection, inner: _Inner,
                   upstream_refusal: Refused | None) -> bool:
        head = await self._head(conn, inner)
        if head is None:
            return False
        event, raw = head
        declared = self._check_request(event, raw, inner)
        if upstream_refusal is not None:
            raise upstream_refusal
        inner.decision = self._decide(inner, declared or 0)
        body = await self._read_body(conn, inner)
        if declared is None:
            inner.decision = self._decide(inner, len(body))
        assert self._upstream is not None
        headers = end_to_end(list(event.headers))
        headers, inner.credentials = substitute(
            headers, self._interception.credentials, host=self._host, port=self._port)
        host = authority_text(self._host, self._port, default_port=443).encode("ascii")
        request = h11.Request(method=event.method, target=event.target,
                              headers=[(b"host", host), *headers])
        try:
            out = up.send(request) or b""
            if body:
                out += up.send(h11.Data(data=body)) or b""
            out += up.send(h11.EndOfMessage()) or b""
            inner.bytes_up += await self._upstream.send(out, self._t.idle_s)
            response = await self._upstream_event(up)
            while isinstance(response, h11.InformationalResponse):
                response = await self._upstream_event(up)
            if not isinstance(response, h11.Response):
                raise UpstreamGone("no response head")
        except UpstreamGone:
            raise Refused(Reason.UPSTREAM_FAILED, f"upstream failed before responding: {self._host}",
                          host=self._host) from None
        inner.status = response.status_code
        await self._to_client(conn, inner, h11.Response(
            status_code=response.status_code, reason=response.reason,
            headers=downstream_headers(list(response.headers)),
        ))
        while True:
            part = await self._upstream_event(up)
            if isinstance(part, h11.Data):
                await self._to_client(conn, inner, h11.Data(data=part.data))
            elif isinstance(part, h11.EndOfMessage):
                await self._to_client(conn, inner, h11.EndOfMessage())
                break
        return (conn.our_state is h11.DONE and conn.their_state is h11.DONE
                and up.our_state is h11.DONE and up.their_state is h11.DONE)

    async def _read_body(self, conn: h11.Connection, inner: _Inner) -> bytes:
        """The whole request body, never more than the cap: nothing goes upstream before it is judged."""
        if conn.they_are_waiting_for_100_continue:
            await self._to_client(conn, inner, h11.InformationalResponse(status_code=100, headers=[]))
        body = bytearray()
        while True:
            event = await self._client_event(conn, self._t.idle_s)
            if isinstance(event, h11.Data):
                body += event.data
                self._decide(inner, len(body))
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise PeerGone("client closed mid-request")

    async def _upstream_event(self, up: h11.Connection) -> h11.Event:
        assert self._upstream is not None
        while True:
            try:
                event = up.next_event()
            except h11.RemoteProtocolError as exc:
                raise UpstreamGone(f"invalid HTTP from upstream ({exc.error_status_hint})") from None
            if event is h11.NEED_DATA:
                up.receive_data(await self._upstream.recv(self._t.upstream_s))
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise UpstreamGone("upstream closed")
            return event

    async def _to_client(self, conn: h11.Connection, inner: _Inner, *events: h11.Event) -> None:
        assert self._client is not None
        data = b"".join(conn.send(e) or b"" for e in events)
        inner.bytes_down += await self._client.send(data, self._t.idle_s)

    async def _refuse(self, conn: h11.Connection, inner: _Inner, refusal: Refused) -> None:
        inner.refusal = refusal
        inner.decision = None
        inner.status = refusal.status
        body = f"firstrun proxy: {refusal.reason.value}: {refusal.detail}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"x-firstrun-reason", refusal.reason.value.encode()),
            (b"connection", b"close"),
        ]
        events: list[h11.Event] = [h11.Response(
            status_code=refusal.status, headers=headers,
            reason=http.HTTPStatus(refusal.status).phrase.encode(),
        )]
        if inner.method != "HEAD":
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        with contextlib.suppress(h11.LocalProtocolError, PeerGone):
            # LocalProtocolError: a response was already under way; closing is the answer.
            await self._to_client(conn, inner, *events)
            await self._linger()

    async def _linger(self) -> None:
        # The client may still be sending the refused body; closing on
        # unread input would reset the connection before it reads the 403.
        assert self._client is not None
        deadline = self._loop.time() + self._t.linger_s
        drained = 0
        while drained < self._t.linger_bytes:
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return
            try:
                data = await self._client.recv(remaining)
            except PeerGone:
                return
            if not data:
                return
            drained += len(data)


def new_interception(
    inspection: InspectionPolicy, *, env: Mapping[str, str], extra_cafiles: Sequence[str] = (),
) -> Interception:
    """A fresh run CA (its key in this process's memory only), upstream trust and masked credentials.

    ``extra_cafiles`` are CA files trusted upstream besides the system store.
    Raises ``UsageError`` for a credential whose value is not in ``env``.
    """
    # Imported here: X.509 (cryptography) costs a plain session's start nothing.
    from firstrun.proxy.ca import RunCA, upstream_context

    return Interception(ca=RunCA(), upstream=upstream_context(extra_cafiles),
                        credentials=mint(inspection.credentials, env))


def prepare_interception(
    inspection: InspectionPolicy, *, env: Mapping[str, str], bundle_dir: str,
    extra_cafiles: Sequence[str] = (),
) -> tuple[Interception, str]:
    """A fresh run CA, upstream trust and masked credentials, and the sandbox's trust bundle.

    The bundle (the system CAs, ``$SSL_CERT_FILE`` when set, then the run's CA)
    is written to ``bundle_dir/trust.pem``, world-readable because a
    sandbox uid reads it; it holds certificates only. ``bundle_dir`` must be
    a directory no sandbox can see (the harness's private proxy directory).
    Raises ``UsageError`` for a credential whose value is not in ``env``.
    """
    interception = new_interception(inspection, env=env, extra_cafiles=extra_cafiles)
    ca = interception.ca
    sources = [SANDBOX_CA_BUNDLE, *([env["SSL_CERT_FILE"]] if env.get("SSL_CERT_FILE") else [])]
    path = os.path.join(bundle_dir, "trust.pem")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(ca.trust_bundle(sources))
    os.chmod(path, 0o644)
    return interception, path
