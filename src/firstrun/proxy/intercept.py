"""TLS inspection: the proxy ends the client's TLS, judges each request, and re-encrypts.

Guarantee: an inspected CONNECT tunnel (``policy.methods.inspects``) carries TLS
or nothing. The real server is verified against the system trust store before
the client is shown a certificate from the run's CA, and each decrypted request
is judged (``exchange.inner_request``) before any byte of it goes upstream, so a
refused upload reaches nobody; a served docs host's tunnel has no upstream, the
docs reader answers. Each request leaves one ``EgressRecord`` besides the
tunnel's, and only these requests ever get a credential swapped in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import h11

from firstrun.policy.decision import Reason
from firstrun.policy.hosts import parse_ip_literal
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import Channel
from firstrun.policy.process import SANDBOX_CA_BUNDLE
from firstrun.proxy.credentials import MaskedCredential, mint
from firstrun.proxy.errors import PeerGone, Refused, UpstreamGone
from firstrun.proxy.exchange import (
    Answer,
    Clock,
    Command,
    ExchangeEvent,
    Forward,
    Handler,
    InnerContext,
    PageText,
    ReadPage,
    Record,
    Refuse,
    inner_request,
)
from firstrun.proxy.flight import judge_first_flight
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.tls import MAX_CLIENT_HELLO, Hello, HelloStatus, parse_client_hello
from firstrun.proxy.wire import Progress, SocketStream, answer, forward, linger, read_head

if TYPE_CHECKING:
    from firstrun.proxy.ca import RunCA
    from firstrun.proxy.limits import ProxyLimits

_READ = 1 << 16


@dataclass(frozen=True, kw_only=True)
class Interception:
    """What the proxy needs to inspect TLS: the run's CA, upstream trust, masked credentials."""

    ca: RunCA
    upstream: ssl.SSLContext
    credentials: tuple[MaskedCredential, ...] = ()


class _TLS:
    """One TLS endpoint over a ``SocketStream``, driven through memory BIOs: a ``ByteStream`` itself."""

    def __init__(self, raw: SocketStream,
                 obj_factory: Callable[[ssl.MemoryBIO, ssl.MemoryBIO], ssl.SSLObject],
                 gone: type[Exception]) -> None:
        self._raw = raw
        self._loop = asyncio.get_running_loop()
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
        if data:
            self.raw_out += await self._raw.send(data, timeout)

    async def _fill(self, timeout: float) -> bool:
        """Feed what the peer sent next; False when ``timeout`` passed first."""
        data = await self._raw.recv(timeout)
        if data is None:
            return False
        if data:
            self.feed(data)
        else:
            self._in.write_eof()
        return True

    async def _run(self, op: Callable[[], object], timeout: float) -> object:
        while True:
            try:
                result = op()
            except ssl.SSLWantReadError:
                await self._flush(timeout)
                if not await self._fill(timeout):
                    raise self._gone("receive failed: timed out") from None
                continue
            await self._flush(timeout)
            return result

    async def handshake(self, timeout: float) -> None:
        """Raises ``ssl.SSLError`` (a certificate error included) or ``gone``."""
        await self._run(self._obj.do_handshake, timeout)

    async def recv(self, timeout: float) -> bytes | None:
        """Plaintext; b"" when the peer closed, cleanly or not; None when ``timeout`` passed."""
        # One deadline for the whole read: a peer dribbling a record byte by byte
        # gets no more time than one that sends nothing.
        deadline = self._loop.time() + timeout
        while True:
            try:
                data = self._obj.read(_READ)
            except ssl.SSLWantReadError:
                await self._flush(timeout)
                if not await self._fill(deadline - self._loop.time()):
                    return None
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            except ssl.SSLError as exc:
                raise self._gone(f"TLS error: {exc.reason or exc}") from None
            await self._flush(timeout)
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


@dataclass(frozen=True, kw_only=True)
class InterceptResult:
    bytes_up: int
    bytes_down: int
    # Why the tunnel as a whole was refused (bad SNI, not TLS, a server that
    # failed verification); None when it carried requests, each recorded.
    refusal: Refused | None


class InterceptedTunnel:
    """One admitted CONNECT, decrypted: a sequence of requests, each judged by ``exchange.inner_request``."""

    def __init__(
        self, *, client: SocketStream, upstream: SocketStream | None, host: str, port: int,
        initial: bytes, resolved: str | None, channel: Channel, policy: InspectionPolicy,
        interception: Interception, limits: ProxyLimits, clock: Clock,
        emit: Callable[[EgressRecord], None],
        read_page: Callable[[str], Awaitable[str]] | None = None,
    ) -> None:
        """``upstream`` None: a docs host served as page reads, each read by ``read_page``."""
        self._loop = asyncio.get_running_loop()
        self._client_raw = client
        self._upstream_raw = upstream
        self._host = host
        self._port = port
        self._initial = initial
        self._resolved = resolved
        self._channel = channel
        self._policy = policy
        self._interception = interception
        self._limits = limits
        self._clock = clock
        self._emit = emit
        self._read_page = read_page
        self._client: _TLS | None = None
        self._upstream: _TLS | None = None
        # What the current request's forward has carried, should it be cut short.
        self._progress: Progress | None = None

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
        upstream_refusal = await self._connect_upstream() \
            if self._upstream_raw is not None else None
        self._client = _TLS(
            self._client_raw,
            lambda i, o: self._interception.ca.server_context(self._host).wrap_bio(
                i, o, server_side=True),
            PeerGone,
        )
        self._client.feed(data)
        try:
            await self._client.handshake(self._limits.head_timeout_s)
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
            await self._client.close(self._limits.linger_timeout_s)
            if self._upstream is not None:
                await self._upstream.close(self._limits.linger_timeout_s)
        return self._result(None)

    # -- the handshakes -------------------------------------------------------

    async def _first_flight(self) -> tuple[bytes, Hello] | None:
        buf = bytearray(self._initial)
        deadline = self._loop.time() + self._limits.head_timeout_s
        while True:
            hello = parse_client_hello(bytes(buf))
            if hello.status is not HelloStatus.INCOMPLETE:
                return bytes(buf), hello
            if len(buf) >= MAX_CLIENT_HELLO:
                return bytes(buf), Hello(status=HelloStatus.MALFORMED)
            try:
                chunk = await self._client_raw.recv(deadline - self._loop.time())
            except PeerGone:
                return None
            if chunk is None:
                return (bytes(buf), Hello(status=HelloStatus.MALFORMED)) if buf else None
            if not chunk:
                return (bytes(buf), hello) if buf else None
            buf += chunk

    def _judge_hello(self, hello: Hello) -> Refused | None:
        # The ClientHello must name the CONNECT target (SNI; only a tunnel to
        # an IP literal may omit it) and must not hide it (ECH).
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
        assert self._upstream_raw is not None
        self._upstream = _TLS(
            self._upstream_raw,
            lambda i, o: self._interception.upstream.wrap_bio(
                i, o, server_side=False, server_hostname=self._host),
            UpstreamGone,
        )
        try:
            await self._upstream.handshake(self._limits.connect_timeout_s)
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
        assert self._client is not None
        # The client is offered HTTP/1.1 only (ALPN, ``ca.ALPN``), which h11
        # parses. Each request's record (scheme ``https``: method, path, status,
        # bytes, reason, the names of the credentials swapped in) is built by
        # ``exchange``; a Host naming another host or port than the CONNECT is
        # refused there, and a body is read at most up to the policy's cap.
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_head_bytes)
        up = h11.Connection(h11.CLIENT)
        context = InnerContext(
            channel=self._channel, policy=self._policy, host=self._host, port=self._port,
            resolved=self._resolved, credentials=self._interception.credentials,
            clock=self._clock, max_head_bytes=self._limits.max_head_bytes,
            upstream_refusal=upstream_refusal, served=self._upstream_raw is None,
        )
        while True:
            stamp = (self._clock.iso(), self._clock.monotonic())
            head = await read_head(self._client, conn, clock=self._clock,
                                   head_timeout=self._limits.head_timeout_s,
                                   idle_timeout=self._limits.idle_timeout_s, stamp=stamp)
            if head is None:
                return
            if not await self._drive(Handler(inner_request(context)), head, conn, up):
                return
            conn.start_next_cycle()
            up.start_next_cycle()

    async def _drive(self, handler: Handler, event: ExchangeEvent, conn: h11.Connection,
                     up: h11.Connection) -> bool:
        """Run one decrypted request to its end; True when the tunnel may carry another."""
        assert self._client is not None
        keep = False
        next_event: ExchangeEvent | None = event
        self._progress = None
        try:
            while next_event is not None:
                step_keep, next_event = await self._execute(handler.handle(next_event), conn, up)
                if step_keep is not None:
                    keep = step_keep
        except BaseException:
            # Stopped midway (the proxy is stopping): what went out is still recorded.
            progress = self._progress.done() if self._progress is not None else None
            for command in handler.abandon(progress):
                if isinstance(command, Record):
                    self._emit(command.record)
            raise
        return keep

    async def _execute(self, commands: list[Command], conn: h11.Connection,
                       up: h11.Connection) -> tuple[bool | None, ExchangeEvent | None]:
        """Carry out one step's commands: whether the tunnel may go on (None: this step
        does not say), and the answer."""
        assert self._client is not None
        keep: bool | None = None
        next_event: ExchangeEvent | None = None
        for command in commands:
            if isinstance(command, Record):
                self._emit(command.record)
            elif isinstance(command, Refuse):
                with contextlib.suppress(PeerGone):
                    await self._client.send(command.data, self._limits.idle_timeout_s)
                    # The client may still be sending the refused body; closing
                    # on unread input would reset it before it reads the 403.
                    await linger(self._client, timeout=self._limits.linger_timeout_s,
                                 limit=self._limits.linger_bytes)
                return False, None
            elif isinstance(command, ReadPage):
                assert self._read_page is not None
                next_event = PageText(text=await self._read_page(command.url))
            elif isinstance(command, Answer):
                self._progress = Progress(status=command.status)
                done = await answer(self._client, conn, command, self._limits.idle_timeout_s)
                # A client that said ``Connection: close`` leaves h11 unable to go on.
                keep = done.keep_alive and conn.our_state is h11.DONE \
                    and conn.their_state is h11.DONE
                next_event = done
            elif isinstance(command, Forward):
                assert self._upstream is not None
                self._progress = Progress()
                done = await forward(self._client, conn, self._upstream, up, command,
                                     limits=self._limits, progress=self._progress)
                keep = done.keep_alive and up.our_state is h11.DONE and up.their_state is h11.DONE
                next_event = done
        return keep, next_event


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
