"""The proxy's data plane: byte streams, a request head read, and one forward, shared by both paths.

Guarantee: the plain path (``clients``) and the inspected path (``intercept``)
carry an exchange's bytes with the same code, over a ``ByteStream`` (a socket or
a TLS session), and neither decides anything: what went wrong comes back in the
``Done`` the exchange judges. Every read and write is bounded by time (a
stalled peer is a gone peer) and every read by memory (a peer that sends
faster than we forward waits in the kernel, not in our buffer).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import h11

from firstrun.policy.decision import Reason
from firstrun.proxy.errors import (
    PeerGone,
    Refused,
    UpstreamGone,
    UpstreamStalled,
    refusal_for_protocol_error,
    upstream_failure,
)
from firstrun.proxy.exchange import Answer, Clock, Done, Forward, HeadRefused, RequestHead
from firstrun.proxy.request import downstream_headers

_READ = 1 << 16


class ByteStream(Protocol):
    """A byte stream with bounded waits; errors are the stream's ``gone`` type."""

    async def recv(self, timeout: float) -> bytes | None:
        """Bytes (b"" at EOF), or None when ``timeout`` passed first."""

    async def send(self, data: bytes, timeout: float) -> int:
        """Send every byte of ``data``, or raise ``gone``; returns ``len(data)``."""


class SocketStream(asyncio.Protocol):
    """One TCP or Unix connection driven by the event loop's transport.

    Reading stops while more than ``_READ`` bytes wait unread, so a fast
    sender is held back by the kernel; ``send`` returns once the transport
    holds nothing back, as ``sock_sendall`` would.
    """

    def __init__(self, gone: type[Exception]) -> None:
        self._gone = gone
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._eof = False
        self._lost: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None
        self._writer: asyncio.Future[None] | None = None
        self._paused = False
        self._write_paused = False

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        # Paused whenever anything is held back: ``send`` waits for the kernel to take it all.
        transport.set_write_buffer_limits(high=0)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= _READ and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return True  # keep our side open: a half-closed client still reads its answer

    def connection_lost(self, exc: BaseException | None) -> None:
        # ``exc`` is None for a clean close (ours, or the peer's after its EOF).
        self._eof = True
        self._lost = self._lost or exc
        self._wake_reader()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def _wake_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    def _wake_writer(self) -> None:
        if self._writer is not None and not self._writer.done():
            self._writer.set_result(None)

    # -- ByteStream ------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Open, and nothing unread: safe to send a new request on (an upstream kept alive)."""
        return not self._eof and not self._buf and self._transport is not None \
            and not self._transport.is_closing()

    def take(self) -> bytes:
        data = bytes(self._buf)
        self._buf.clear()
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def _wait(self, attr: str, timeout: float) -> bool:
        """Wait for a wake-up on ``attr``'s future; False when ``timeout`` passed first."""
        future = self._loop.create_future()
        setattr(self, attr, future)
        timer = self._loop.call_later(max(timeout, 0.0), _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            setattr(self, attr, None)

    async def recv(self, timeout: float) -> bytes | None:
        if not self._buf and not self._eof:
            await self._wait("_reader", timeout)
            if not self._buf and not self._eof:
                return None
        if self._buf:
            return self.take()
        if self._lost is not None:
            raise self._gone(f"receive failed: {self._lost}")
        return b""

    async def send(self, data: bytes, timeout: float) -> int:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise self._gone("send failed: connection closed")
        transport.write(data)
        if self._write_paused:
            await self._wait("_writer", timeout)
            if self._write_paused:
                raise self._gone("send failed: the peer stopped reading")
            if self._lost is not None or self._transport is None:
                raise self._gone("send failed: connection closed")
        return len(data)

    def shutdown_write(self) -> None:
        if self._transport is not None and self._transport.can_write_eof():
            try:
                self._transport.write_eof()
            except OSError:
                pass

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close now, and discard what was read but not taken: nothing more is read from here."""
        self._buf.clear()
        self._eof = True
        self._lost = self._lost or ConnectionAbortedError("closed by the proxy")
        if self._transport is not None:
            self._transport.abort()
        self._wake_reader()

    def detach(self) -> tuple[socket.socket, bytes]:
        """The connection's own socket (blocking) and what was read but not taken; this
        stream is over. Only once every send has returned, so nothing is held back."""
        transport = self._transport
        assert transport is not None and transport.get_write_buffer_size() == 0
        transport.pause_reading()
        unread = self.take()
        sock = transport.get_extra_info("socket")
        own = socket.socket(fileno=os.dup(sock.fileno()))
        # Closes the transport's descriptor only; the connection lives on in ``own``.
        transport.abort()
        self._transport = None
        own.setblocking(True)
        return own, unread


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


async def open_stream(sock: socket.socket, gone: type[Exception]) -> SocketStream:
    """Wrap a connected socket in a ``SocketStream``."""
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(lambda: SocketStream(gone), sock=sock)
    return stream


async def accept_stream(sock: socket.socket, gone: type[Exception]) -> SocketStream:
    loop = asyncio.get_running_loop()
    _, stream = await loop.connect_accepted_socket(lambda: SocketStream(gone), sock)
    return stream


# -- reading a request ----------------------------------------------------------


async def read_head(stream: ByteStream, conn: h11.Connection, *, clock: Clock, head_timeout: float,
                    idle_timeout: float, stamp: tuple[str, float]) -> RequestHead | HeadRefused | None:
    """The next request's head and the exact bytes of it; None if the client left (or
    stayed silent past ``idle_timeout`` between requests). A head begun and not finished
    within ``head_timeout`` is refused (408).

    ``stamp`` is the exchange's start when no byte of this head was read yet;
    the head's first byte restarts it.
    """
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    ts, started = stamp
    try:
        while True:
            before = conn.trailing_data[0]
            if before and deadline is None:
                deadline = loop.time() + head_timeout
                ts, started = clock.iso(), clock.monotonic()
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                return HeadRefused(refusal=refusal_for_protocol_error(exc), ts=ts, started=started)
            if isinstance(event, h11.Request):
                # h11 consumed exactly the head: the framing guards judge those bytes.
                raw = before[: len(before) - len(conn.trailing_data[0])]
                return RequestHead(event=event, raw=raw, ts=ts, started=started)
            if isinstance(event, h11.ConnectionClosed):
                return None
            if deadline is None:
                data = await stream.recv(idle_timeout)
                if data is None:
                    return None
            else:
                data = await stream.recv(deadline - loop.time())
                if data is None:
                    return HeadRefused(refusal=Refused(Reason.REQUEST_TIMEOUT,
                                                       "request head not complete in time"),
                                       ts=ts, started=started)
            conn.receive_data(data)
    except PeerGone:
        # Closed or reset, mid-head or not: nothing was asked, nothing to record.
        return None


async def client_event(stream: ByteStream, conn: h11.Connection, timeout: float) -> h11.Event:
    """The client's next event in the current request; raises ``Refused`` or ``PeerGone``."""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise refusal_for_protocol_error(exc) from None
        if event is h11.NEED_DATA:
            data = await stream.recv(timeout)
            if data is None:
                raise PeerGone("client stalled mid-request")
            conn.receive_data(data)
            continue
        if isinstance(event, h11.ConnectionClosed):
            raise PeerGone("client closed mid-request")
        return event


async def drain_body(stream: ByteStream, conn: h11.Connection, timeout: float) -> None:
    while not isinstance(await client_event(stream, conn, timeout), h11.EndOfMessage):
        pass


async def answer(stream: ByteStream, conn: h11.Connection, command: Answer,
                 timeout: float) -> Done:
    """The request's body drained, then the proxy's own answer: its ``status`` once the
    request was read whole, whether or not the client stayed for the answer."""
    try:
        await drain_body(stream, conn, timeout)
    except Refused as refusal:
        return Done(refusal=refusal)
    except PeerGone:
        return Done()
    events: list[h11.Event] = [h11.Response(status_code=command.status,
                                            headers=command.headers, reason=b"OK")]
    if command.body:
        events.append(h11.Data(data=command.body))
    events.append(h11.EndOfMessage())
    data = b"".join(conn.send(e) or b"" for e in events)
    try:
        sent = await stream.send(data, timeout)
    except PeerGone:
        return Done(status=command.status)
    return Done(bytes_down=sent, status=command.status, keep_alive=True)


def _upstream_next(up: h11.Connection) -> object:
    """The upstream's next event from what h11 holds (``h11.NEED_DATA`` when it needs
    more); a broken response or a close is ``UpstreamGone``."""
    try:
        event = up.next_event()
    except h11.RemoteProtocolError as exc:
        raise UpstreamGone(f"invalid HTTP from upstream ({exc.error_status_hint})") from None
    if isinstance(event, h11.ConnectionClosed):
        raise UpstreamGone("upstream closed")
    return event


async def upstream_event(stream: ByteStream, up: h11.Connection, timeout: float) -> h11.Event:
    while (event := _upstream_next(up)) is h11.NEED_DATA:
        data = await stream.recv(timeout)
        if data is None:
            raise UpstreamStalled("upstream stalled")
        up.receive_data(data)
    return cast(h11.Event, event)


async def linger(stream: ByteStream, *, timeout: float, limit: int) -> None:
    """Discard the client's unread input for a bounded time and amount.

    Closing with unread input makes the kernel send a reset, which can
    destroy a refusal before the client reads it.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    drained = 0
    try:
        while drained < limit:
            data = await stream.recv(deadline - loop.time())
            if not data:
                return
            drained += len(data)
    except PeerGone:
        return


# -- one forward ----------------------------------------------------------------


class Timeouts(Protocol):
    idle_timeout_s: float
    upstream_timeout_s: float


Redial = Callable[[], Awaitable[tuple[ByteStream, h11.Connection]]]
# Sent again on a fresh connection when a kept-alive one turns out closed:
# methods a server may see twice (RFC 9110 section 9.2.2), with no body.
_RETRIED = frozenset({b"GET", b"HEAD", b"OPTIONS"})


async def forward(client: ByteStream, conn: h11.Connection, upstream: ByteStream, up: h11.Connection,
                  command: Forward, *, limits: Timeouts, redial: Redial | None = None,
                  progress: Progress | None = None) -> Done:
    """Carry out ``command``: the request up, the response back.

    The body streams upstream, or, under a cap, is read whole and judged
    before a byte goes up; the response comes back with its hop-by-hop
    headers dropped.

    ``redial`` is given when ``upstream`` was kept alive from an earlier
    request: if it fails before a byte of response, a bodiless idempotent
    request goes once more on the connection ``redial`` makes (the server
    closed an idle connection as we reused it, so it never saw the request).
    """
    carried = progress or Progress()
    try:
        return await _forward(client, conn, upstream, up, command, limits, carried, redial)
    except (PeerGone, h11.LocalProtocolError):
        # LocalProtocolError: the client already has part of a response it can
        # no longer be given whole; closing is the answer.
        return carried.done()


class Progress:
    """What a data-plane command has carried so far, for its ``Done`` however it ends
    (its driver reads it when the command is cut short, ``Handler.abandon``).

    ``up`` counts every byte sent upstream, a request sent again on a fresh
    connection included: each went out.
    """

    def __init__(self, *, status: int | None = None) -> None:
        self.up = 0
        self.down = 0
        self.status = status

    def done(self, *, refusal: Refused | None = None, keep_alive: bool = False) -> Done:
        return Done(bytes_up=self.up, bytes_down=self.down, status=self.status,
                    refusal=refusal, keep_alive=keep_alive)


async def _forward(client: ByteStream, conn: h11.Connection, upstream: ByteStream, up: h11.Connection,
                   command: Forward, limits: Timeouts, carried: Progress,
                   redial: Redial | None) -> Done:
    async def to_client(*events: h11.Event) -> None:
        data = b"".join(conn.send(e) or b"" for e in events)
        carried.down += await client.send(data, limits.idle_timeout_s)

    async def to_upstream(data: bytes) -> None:
        carried.up += await upstream.send(data, limits.idle_timeout_s)

    bodiless = True
    try:
        if command.cap is not None:
            if conn.they_are_waiting_for_100_continue:
                await to_client(h11.InformationalResponse(status_code=100, headers=[]))
            body = bytearray()
            while not isinstance(
                    event := await client_event(client, conn, limits.idle_timeout_s),
                    h11.EndOfMessage):
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > command.cap:
                        return carried.done(refusal=command.cap_refusal)
            data = up.send(command.request) or b""
            if body:
                bodiless = False
                data += up.send(h11.Data(data=bytes(body))) or b""
            await to_upstream(data + (up.send(h11.EndOfMessage()) or b""))
        else:
            await to_upstream(up.send(command.request) or b"")
            if conn.they_are_waiting_for_100_continue:
                await to_client(h11.InformationalResponse(status_code=100, headers=[]))
            while True:
                event = await client_event(client, conn, limits.idle_timeout_s)
                if isinstance(event, h11.Data):
                    bodiless = False
                    await to_upstream(up.send(h11.Data(data=event.data)) or b"")
                elif isinstance(event, h11.EndOfMessage):
                    await to_upstream(up.send(h11.EndOfMessage()) or b"")
                    break
        try:
            response = await upstream_event(upstream, up, limits.upstream_timeout_s)
        except UpstreamGone as gone:
            # Closed or reset before a byte of response: a server that dropped
            # the idle connection as we reused it, and never saw the request.
            if redial is None or not bodiless or command.request.method not in _RETRIED \
                    or isinstance(gone, UpstreamStalled) or up.trailing_data[0]:
                raise
            upstream, up = await redial()
            await to_upstream((up.send(command.request) or b"") + (up.send(h11.EndOfMessage()) or b""))
            response = await upstream_event(upstream, up, limits.upstream_timeout_s)
        while isinstance(response, h11.InformationalResponse):
            # 1xx are hop-by-hop: the proxy already answered Expect itself.
            response = await upstream_event(upstream, up, limits.upstream_timeout_s)
        if not isinstance(response, h11.Response):
            raise UpstreamGone("no response head")
    except UpstreamGone:
        return carried.done(refusal=upstream_failure(command.host, connected=True))
    except Refused as refusal:
        return carried.done(refusal=refusal)
    carried.status = response.status_code
    # The head waits for what of the body is already here, so a small
    # response leaves in one write; never for bytes still to come.
    pending = conn.send(h11.Response(status_code=response.status_code, reason=response.reason,
                                     headers=downstream_headers(list(response.headers)))) or b""
    try:
        while True:
            part = _upstream_next(up)
            if part is h11.NEED_DATA:
                if pending:
                    carried.down += await client.send(pending, limits.idle_timeout_s)
                    pending = b""
                part = await upstream_event(upstream, up, limits.upstream_timeout_s)
            if isinstance(part, h11.Data):
                pending += conn.send(h11.Data(data=part.data)) or b""
            elif isinstance(part, h11.EndOfMessage):
                pending += conn.send(h11.EndOfMessage()) or b""
                carried.down += await client.send(pending, limits.idle_timeout_s)
                break
    except UpstreamGone:
        # The client already has our status line, or is about to: closing is all that is left.
        if pending:
            with contextlib.suppress(PeerGone):
                carried.down += await client.send(pending, limits.idle_timeout_s)
        return carried.done()
    return carried.done(keep_alive=conn.our_state is h11.DONE and conn.their_state is h11.DONE)
