"""The drivers of the proxy's listeners: one per client connection.

Guarantee: a driver only reads and writes its connection's bytes, reports
what happened to the exchange (``exchange``) and carries out the commands
that come back; every decision and every record is the exchange's, and
everything shared with the proxy's other connections is reached through
its ``ProxyCore`` alone. ``ListenerKind`` says which driver a listener runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from enum import StrEnum

import h11

from firstrun.policy.addresses import IPAddress
from firstrun.policy.decision import Reason
from firstrun.policy.network import Channel
from firstrun.proxy.core import PoolKey, ProxyCore, Upstream
from firstrun.proxy.dns import answer as dns_answer
from firstrun.proxy.errors import PeerGone, Refused, UpstreamGone
from firstrun.proxy.exchange import (
    Answer,
    Carry,
    Command,
    Dial,
    Dialled,
    Done,
    ExchangeEvent,
    FlowOpened,
    Forward,
    Handler,
    NameRefused,
    PageText,
    ReadPage,
    Record,
    Refuse,
    Release,
    Reserve,
    Reserved,
    Resolve,
    Resolved,
    dns_refusal,
    flow,
    proxy_request,
)
from firstrun.proxy.flight import judge_flight
from firstrun.proxy.intercept import InterceptedTunnel
from firstrun.proxy.records import EgressRecord, TunnelEnd
from firstrun.proxy.request import Target
from firstrun.proxy.tunnel import Tunnel
from firstrun.proxy.wire import (
    Progress,
    SocketStream,
    answer,
    client_event,
    forward,
    linger,
    open_stream,
    read_head,
)


class ProxyClient:
    """One client connection on a proxy listener: a sequence of requests, or one tunnel.

    The driver of ``exchange.proxy_request``: it reads each head, hands the
    events to the exchange and carries out the commands that come back.
    """

    def __init__(self, core: ProxyCore, stream: SocketStream, channel: Channel) -> None:
        self._core = core
        self._limits = core.limits
        self._stream = stream
        self._channel = channel
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_head_bytes)
        self.tunnel: Tunnel | None = None
        # What the current exchange dialled: a fresh socket, or a kept-alive upstream.
        self._dialled: socket.socket | None = None
        self._dialled_key: PoolKey | None = None
        self._upstream: Upstream | None = None
        # Set by a refusal: the connection ends, after a lingering close.
        self._refused = False
        # What the data-plane command under way has carried, should it be cut short.
        self._progress: Progress | None = None

    async def run(self) -> None:
        try:
            await self._requests()
            if self._refused and self.tunnel is None:
                await self._linger()
        finally:
            self._end_upstream(keep=False)
            if self.tunnel is None:
                self._stream.close()

    async def _requests(self) -> None:
        clock = self._core.clock
        while True:
            head = await read_head(self._stream, self._h11, clock=clock,
                                   head_timeout=self._limits.head_timeout_s,
                                   idle_timeout=self._limits.idle_timeout_s,
                                   stamp=(clock.iso(), clock.monotonic()))
            if head is None:
                return
            keep = await self._drive(Handler(proxy_request(self._core.context(self._channel))), head)
            if not keep or self._h11.our_state is not h11.DONE \
                    or self._h11.their_state is not h11.DONE:
                return
            self._h11.start_next_cycle()

    async def _linger(self) -> None:
        # Stop writing, then discard input for a bounded time and amount.
        self._stream.shutdown_write()
        await linger(self._stream, timeout=self._limits.linger_timeout_s,
                     limit=self._limits.linger_bytes)

    async def _drive(self, handler: Handler, event: ExchangeEvent) -> bool:
        """Run one exchange to its end; True when the connection may carry another."""
        keep = False
        next_event: ExchangeEvent | None = event
        try:
            while next_event is not None:
                commands = handler.handle(next_event)
                next_event = None
                for command in commands:
                    answer = await self._execute(command)
                    if isinstance(answer, Done):
                        keep = answer.keep_alive
                    if answer is not None:
                        next_event = answer
        except BaseException:
            # Stopped midway (the proxy is stopping, or a bug): the exchange still
            # settles, with what its data plane had carried.
            progress = self._progress.done() if self._progress is not None else None
            for command in handler.abandon(progress):
                self._core.settle(command)
            raise
        finally:
            self._progress = None
        return keep and not self._refused

    async def _execute(self, command: Command) -> ExchangeEvent | None:
        core = self._core
        if isinstance(command, Reserve):
            return Reserved(ok=core.reserve(command.channel))
        if isinstance(command, Release | Record):
            core.settle(command)
        elif isinstance(command, Resolve):
            return Resolved(addresses=await core.resolve(command.host, command.port))
        elif isinstance(command, Dial):
            return Dialled(address=await self._dial(command))
        elif isinstance(command, Refuse):
            self._refused = True
            with contextlib.suppress(PeerGone):
                await self._stream.send(command.data, self._limits.idle_timeout_s)
        elif isinstance(command, Answer):
            return await self._answer(command)
        elif isinstance(command, Forward):
            return await self._forward(command)
        elif isinstance(command, Carry):
            return await self._carry(command)
        elif isinstance(command, ReadPage):
            return PageText(text=await core.read_page(command.url))
        return None

    # -- upstream connections -------------------------------------------------

    async def _dial(self, command: Dial) -> IPAddress | None:
        """A kept-alive connection to a checked address, or a new one to the first that answers."""
        if command.reuse:
            for addr in command.addresses:
                key = (command.channel, command.host, command.port, addr)
                upstream = self._core.pool.take(key, time.monotonic())
                if upstream is not None:
                    upstream.reused = True
                    self._upstream = upstream
                    return addr
        found = await self._core.connect(command.addresses, command.port)
        if found is None:
            return None
        addr, sock = found
        self._dialled = sock
        self._dialled_key = (command.channel, command.host, command.port, addr)
        return addr

    async def _fresh_upstream(self) -> Upstream:
        """The socket just dialled, as an HTTP upstream."""
        sock, key = self._dialled, self._dialled_key
        assert sock is not None and key is not None
        self._dialled = None
        stream = await open_stream(sock, UpstreamGone)
        self._upstream = Upstream(key=key, stream=stream, h11=h11.Connection(h11.CLIENT))
        return self._upstream

    def _end_upstream(self, *, keep: bool) -> None:
        """Keep the current upstream for the next request, or close it."""
        if self._dialled is not None:
            self._dialled.close()
            self._dialled = None
        upstream, self._upstream = self._upstream, None
        if upstream is None:
            return
        if keep:
            self._core.pool.give(upstream, time.monotonic())
        else:
            upstream.stream.close()

    async def _redial(self) -> tuple[SocketStream, h11.Connection]:
        """A new connection to the address the kept-alive one had reached (checked then)."""
        old = self._upstream
        assert old is not None
        old.stream.close()
        self._upstream = None
        _, _, port, addr = old.key
        found = await self._core.connect((addr,), port)
        if found is None:
            raise UpstreamGone("cannot reconnect upstream")
        self._dialled, self._dialled_key = found[1], old.key
        upstream = await self._fresh_upstream()
        return upstream.stream, upstream.h11

    # -- carrying out the exchange's commands ---------------------------------

    async def _forward(self, command: Forward) -> Done:
        upstream = self._upstream or await self._fresh_upstream()
        self._progress = Progress()
        done = await forward(self._stream, self._h11, upstream.stream, upstream.h11, command,
                             limits=self._limits, redial=self._redial if upstream.reused else None,
                             progress=self._progress)
        self._end_upstream(keep=done.keep_alive)
        return done

    async def _answer(self, command: Answer) -> Done:
        """The request's body drained, then the answer: its ``status`` once the request
        was read whole, whether or not the client stayed for the answer."""
        self._progress = Progress(status=command.status)
        return await answer(self._stream, self._h11, command, self._limits.idle_timeout_s)

    async def _carry(self, command: Carry) -> Done:
        initial = b""
        if command.established:
            try:
                if not isinstance(await client_event(self._stream, self._h11,
                                                     self._limits.idle_timeout_s),
                                  h11.EndOfMessage):
                    return Done(refusal=Refused(Reason.MALFORMED_REQUEST, "CONNECT with a body"))
                established = h11.Response(status_code=200, reason=b"Connection established",
                                           headers=[])
                await self._stream.send(self._h11.send(established) or b"",
                                        self._limits.idle_timeout_s)
            except Refused as refusal:
                return Done(refusal=refusal)
            except PeerGone:
                # Gone before its 200: the client's own leaving.
                return Done(ended=TunnelEnd.CLIENT_CLOSED)
            self._progress = Progress(status=200)
            initial = self._h11.trailing_data[0]
        return await self._through(command, initial, status=200 if command.established else None)

    async def _through(self, command: Carry, initial: bytes, *, status: int | None) -> Done:
        if command.served:
            return await self._intercept(command.target, None, initial, status, resolved=None,
                                         channel=command.channel)
        upstream_sock, self._dialled = self._dialled, None
        assert upstream_sock is not None and self._dialled_key is not None
        if command.inspect:
            return await self._intercept(command.target, upstream_sock, initial, status,
                                         resolved=str(self._dialled_key[3]),
                                         channel=command.channel)
        policy = self._core.policy
        target = command.target
        try:
            try:
                client_sock, unread = self._stream.detach()
            except OSError:
                # The client reset while its tunnel was admitted: nothing to carry.
                return Done(status=status, ended=TunnelEnd.CLIENT_RESET)
            tunnel = Tunnel(
                client=client_sock, upstream=upstream_sock, initial=initial + unread,
                judge=lambda flight: judge_flight(flight, host=target.host, port=target.port,
                                                  policy=policy, connect=command.established),
            )
            self.tunnel = tunnel
            try:
                result = await tunnel.run()
            finally:
                client_sock.close()
        finally:
            upstream_sock.close()
        return Done(bytes_up=result.bytes_up, bytes_down=result.bytes_down, status=status,
                    flight=result.flight, decision=result.decision, closed=result.refusal,
                    ended=result.ended)

    async def _intercept(self, target: Target, upstream_sock: socket.socket | None,
                         initial: bytes, status: int | None, *, resolved: str | None,
                         channel: Channel) -> Done:
        """Decrypt the tunnel; with no ``upstream_sock`` (served) the docs reader answers."""
        core = self._core
        policy = core.policy.inspection
        interception = core.interception
        assert policy is not None and interception is not None
        upstream = None
        if upstream_sock is not None:
            try:
                upstream = await open_stream(upstream_sock, UpstreamGone)
            except OSError:
                upstream_sock.close()
                return Done(status=status)
        try:
            result = await InterceptedTunnel(
                client=self._stream, upstream=upstream, host=target.host, port=target.port,
                initial=initial, resolved=resolved, channel=channel,
                policy=policy, interception=interception, emit=self._emit_inner,
                limits=self._limits, clock=core.clock, read_page=core.read_page,
            ).run()
        finally:
            if upstream is not None:
                upstream.close()
        return Done(bytes_up=result.bytes_up, bytes_down=result.bytes_down, status=status,
                    closed=result.refusal)

    def _emit_inner(self, record: EgressRecord) -> None:
        """A decrypted request's record: written (it went out); a full budget ends the tunnel.

        The tunnel reserves nothing per inner request, so once the budget has
        no room it must not read another. Closing the client here, before the
        tunnel's next read, discards whatever the client sent since; the
        tunnel's next read fails as a peer gone.
        """
        if not self._core.write_inner(record):
            self._stream.abort()


# A transparent flow's header, written by the sandbox's relay: "tcp|udp ADDRESS PORT\n".
_MAX_FLOW_HEADER = 128


class TransparentClient(ProxyClient):
    """One flow the sandbox's relay redirected here: a header naming where it was going, then
    its bytes (a TCP connection), or nothing more (a datagram that was refused).

    The address is mapped back to the name the DNS stub answered it for (an
    address that stands for no name is decided as the IP literal it is),
    then ``exchange.flow`` decides it exactly as a CONNECT to that name. Its
    record says ``capture: transparent``.
    """

    async def run(self) -> None:
        try:
            header = await self._flow_header()
            if header is None:
                return
            (kind, address, port), self._rest = header
            name = self._core.synthetic.name_for(address)
            clock = self._core.clock
            opened = FlowOpened(kind=kind, host=name if name is not None else str(address),
                                port=port, ts=clock.iso(), started=clock.monotonic())
            await self._drive(Handler(flow(self._core.context(self._channel))), opened)
        finally:
            self._end_upstream(keep=False)
            if self.tunnel is None:
                self._stream.close()

    async def _flow_header(self) -> tuple[tuple[str, IPAddress, int], bytes] | None:
        buf = b""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.head_timeout_s
        try:
            while b"\n" not in buf:
                if len(buf) > _MAX_FLOW_HEADER:
                    return None
                data = await self._stream.recv(deadline - loop.time())
                if not data:
                    return None
                buf += data
        except PeerGone:
            return None
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

    async def _answer(self, command: Answer) -> Done:
        """Answer a plain GET to the attestation host, as the proxy-aware path does."""
        buf = self._rest
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.head_timeout_s
        try:
            while b"\r\n\r\n" not in buf and len(buf) < self._limits.max_head_bytes:
                data = await self._stream.recv(deadline - loop.time())
                if not data:
                    break
                buf += data
        except PeerGone:
            return Done(bytes_up=len(buf))
        self._progress = Progress(status=command.status)
        self._progress.up = len(buf)
        try:
            sent = await self._stream.send(command.raw, self._limits.idle_timeout_s)
        except PeerGone:
            return Done(bytes_up=len(buf), status=command.status)
        return Done(bytes_up=len(buf), bytes_down=sent, status=command.status)

    async def _carry(self, command: Carry) -> Done:
        return await self._through(command, self._rest, status=None)


class DnsClient(ProxyClient):
    """DNS over one stream, framed as DNS over TCP is (RFC 1035 4.2.2): each query is
    answered by ``dns.answer`` from the policy alone, and each refused name recorded."""

    async def run(self) -> None:
        try:
            while (query := await self._frame()) is not None:
                clock = self._core.clock
                stamp = clock.iso(), clock.monotonic()
                result = dns_answer(query, policy=self._core.policy, names=self._core.synthetic)
                if result.refusal is not None and self._core.first_dns_refusal(result.name):
                    refused = NameRefused(name=result.name, qtype=result.qtype,
                                          decision=result.refusal, ts=stamp[0], started=stamp[1])
                    for command in Handler(dns_refusal(self._channel, clock)).handle(refused):
                        assert isinstance(command, Record)
                        self._core.settle(command)
                if result.wire is not None:
                    frame = len(result.wire).to_bytes(2, "big") + result.wire
                    await self._stream.send(frame, self._limits.idle_timeout_s)
        except PeerGone:
            pass
        finally:
            self._stream.close()

    async def _frame(self) -> bytes | None:
        buf = b""
        need = 2
        while True:
            while len(buf) < need:
                data = await self._stream.recv(self._limits.idle_timeout_s)
                if not data:
                    return None
                buf += data
            if need == 2:
                need = 2 + int.from_bytes(buf[:2], "big")
                continue
            # One query per frame, and no pipelining past it.
            return buf[2:need]


class ListenerKind(StrEnum):
    """What a listener speaks: proxy requests (HTTP and CONNECT), redirected flows, or DNS."""

    PROXY = "proxy"
    TRANSPARENT = "transparent"
    DNS = "dns"


CLIENTS: dict[ListenerKind, type[ProxyClient]] = {
    ListenerKind.PROXY: ProxyClient, ListenerKind.TRANSPARENT: TransparentClient,
    ListenerKind.DNS: DnsClient,
}
