"""The egress proxy: the only route out of every sandbox.

Guarantee: every request and every tunnel is decided by
``firstrun.policy.network`` alone (``decide_name`` on the canonical name,
then, only if that allowed it, a resolution through the injected resolver
and ``decide_addresses`` over every address returned), and the proxy dials
only addresses that were checked, never the name again. The decision is
``exchange``'s, with no sockets; this module is its driver (it reads, and
carries out the commands that come back) and ``wire`` its data plane.

Each request or tunnel leaves exactly one ``EgressRecord``, refusals
included (with TLS inspection, each decrypted request inside a
shell-channel tunnel leaves one more, see ``intercept``, and plain HTTP on
the shell channel is judged by the same ``policy.methods`` rules before
anything is dialled): malformed or ambiguous input gets a 4xx with a
one-line reason, a stalled head gets 408, and none of it can crash the
proxy or hold a connection slot forever.

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
callers (the runner, the CLI, tests) drive it with plain method calls. A
plain request may reuse an upstream connection an earlier one left idle,
only to an address its own decision checked for the same name
(``_Pool``); a name's resolution is reused for ``RESOLVED_S``. Every TCP
listener's address is added to the policy's ``proxy_addresses``, so the
proxy never dials itself. A request for ``http://attest.firstrun.invalid/``
is answered by the proxy itself with its ``nonce``, so a sandbox can prove
which proxy it reached.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from firstrun.policy.decision import Reason
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.dns import SyntheticNames
from firstrun.proxy.dns import answer as dns_answer
from firstrun.proxy.dns import preload as preload_dns
from firstrun.proxy.errors import PeerGone, Refused, UpstreamGone, listen_failed
from firstrun.proxy.exchange import (
    Answer,
    Carry,
    Clock,
    Command,
    Decisions,
    Dial,
    Dialled,
    Done,
    Event,
    FlowOpened,
    Forward,
    Handler,
    NameRefused,
    ProxyContext,
    Record,
    RecordMode,
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
from firstrun.proxy.intercept import InterceptedTunnel, Interception
from firstrun.proxy.limits import ProxyLimits
from firstrun.proxy.records import (
    EgressRecord,
    RecordLog,
    TunnelEnd,
    now_iso,
)
from firstrun.proxy.request import Target
from firstrun.proxy.tunnel import Tunnel
from firstrun.proxy.wire import (
    Progress,
    SocketStream,
    accept_stream,
    client_event,
    drain_body,
    forward,
    linger,
    open_stream,
    read_head,
)

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
"""Resolve a canonical host once; raise ``OSError`` or return [] when it does not resolve."""

_T = TypeVar("_T")
# How long a name's resolution is used before it is asked again, and how many are kept.
RESOLVED_S = 30.0
RESOLUTIONS_MAX = 4096


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


class _Pool:
    """Upstream connections kept alive between plain requests, each for one checked address.

    A connection is keyed by channel, host, port and the address it reached,
    so a request reuses one only when its own decision checked that address
    for that name. It is kept only while idle for at most ``IDLE_S`` (servers
    commonly close idle connections after 2 to 5 s, and a request sent as
    they do is lost) and only when its last exchange ended cleanly.
    """

    IDLE_S = 1.0
    PER_KEY = 128

    def __init__(self) -> None:
        self._idle: dict[_PoolKey, list[tuple[float, _Upstream]]] = {}
        # One sweep at a time closes what stayed idle too long, however many were given.
        self._sweep: asyncio.TimerHandle | None = None

    def take(self, key: _PoolKey, now: float) -> _Upstream | None:
        entries = self._idle.get(key)
        while entries:
            since, upstream = entries.pop()
            if now - since <= self.IDLE_S and upstream.stream.idle:
                return upstream
            upstream.stream.close()
        return None

    def give(self, upstream: _Upstream, now: float) -> None:
        up = upstream.h11
        entries = self._idle.setdefault(upstream.key, [])
        # Bytes past the last response (h11 holds them) would answer the next request.
        if up.our_state is not h11.DONE or up.their_state is not h11.DONE or up.trailing_data[0] \
                or not upstream.stream.idle or len(entries) >= self.PER_KEY:
            upstream.stream.close()
            return
        up.start_next_cycle()
        entries.append((now, upstream))
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(self.IDLE_S, self._expire)

    def _expire(self) -> None:
        self._sweep = None
        now = time.monotonic()
        for key, entries in list(self._idle.items()):
            kept = [(since, up) for since, up in entries if now - since <= self.IDLE_S]
            for since, up in entries:
                if now - since > self.IDLE_S:
                    up.stream.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        if self._idle:
            self._sweep = asyncio.get_running_loop().call_later(self.IDLE_S, self._expire)

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for entries in self._idle.values():
            for _, upstream in entries:
                upstream.stream.close()
        self._idle.clear()


_PoolKey = tuple[Channel, str, int, IPAddress]


@dataclass(kw_only=True)
class _Upstream:
    """An upstream HTTP connection: its stream and the h11 state of its current request."""

    key: _PoolKey
    stream: SocketStream
    h11: h11.Connection
    reused: bool = False


class _Client:
    """One client connection on a proxy listener: a sequence of requests, or one tunnel.

    The driver of ``exchange.proxy_request``: it reads each head, hands the
    events to the exchange and carries out the commands that come back.
    """

    def __init__(self, proxy: EgressProxy, stream: SocketStream, channel: Channel) -> None:
        self._proxy = proxy
        self._limits = proxy.limits
        self._stream = stream
        self._channel = channel
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_head_bytes)
        self.tunnel: Tunnel | None = None
        # What the current exchange dialled: a fresh socket, or a kept-alive upstream.
        self._dialled: socket.socket | None = None
        self._dialled_key: _PoolKey | None = None
        self._upstream: _Upstream | None = None
        # Set by a refusal: the connection ends, after a lingering close.
        self._refused = False
        # What the data-plane command under way has carried, should it be cut short.
        self._progress: Progress | None = None

    def _context(self) -> ProxyContext:
        return ProxyContext(channel=self._channel, decisions=self._proxy._decisions,
                            clock=self._proxy.clock, nonce=self._proxy.nonce,
                            max_head_bytes=self._limits.max_head_bytes)

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
        clock = self._proxy.clock
        while True:
            head = await read_head(self._stream, self._h11, clock=clock,
                                   head_timeout=self._limits.head_timeout_s,
                                   idle_timeout=self._limits.idle_timeout_s,
                                   stamp=(clock.iso(), clock.monotonic()))
            if head is None:
                return
            keep = await self._drive(Handler(proxy_request(self._context())), head)
            if not keep or self._h11.our_state is not h11.DONE \
                    or self._h11.their_state is not h11.DONE:
                return
            self._h11.start_next_cycle()

    async def _linger(self) -> None:
        # Stop writing, then discard input for a bounded time and amount.
        self._stream.shutdown_write()
        await linger(self._stream, timeout=self._limits.linger_timeout_s,
                     limit=self._limits.linger_bytes)

    async def _drive(self, handler: Handler, event: Event) -> bool:
        """Run one exchange to its end; True when the connection may carry another."""
        keep = False
        next_event: Event | None = event
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
                self._proxy._settle(command)
            raise
        finally:
            self._progress = None
        return keep and not self._refused

    async def _execute(self, command: Command) -> Event | None:
        proxy = self._proxy
        if isinstance(command, Reserve):
            return Reserved(ok=proxy._log.reserve(command.channel))
        if isinstance(command, Release | Record):
            proxy._settle(command)
        elif isinstance(command, Resolve):
            return Resolved(addresses=await proxy._resolve(command.host, command.port))
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
        return None

    # -- upstream connections -------------------------------------------------

    async def _dial(self, command: Dial) -> IPAddress | None:
        """A kept-alive connection to a checked address, or a new one to the first that answers."""
        if command.reuse:
            for addr in command.addresses:
                key = (command.channel, command.host, command.port, addr)
                upstream = self._proxy._pool.take(key, time.monotonic())
                if upstream is not None:
                    upstream.reused = True
                    self._upstream = upstream
                    return addr
        found = await self._proxy._connect(command.addresses, command.port)
        if found is None:
            return None
        addr, sock = found
        self._dialled = sock
        self._dialled_key = (command.channel, command.host, command.port, addr)
        return addr

    async def _fresh_upstream(self) -> _Upstream:
        """The socket just dialled, as an HTTP upstream."""
        sock, key = self._dialled, self._dialled_key
        assert sock is not None and key is not None
        self._dialled = None
        stream = await open_stream(sock, UpstreamGone)
        self._upstream = _Upstream(key=key, stream=stream, h11=h11.Connection(h11.CLIENT))
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
            self._proxy._pool.give(upstream, time.monotonic())
        else:
            upstream.stream.close()

    async def _redial(self) -> tuple[SocketStream, h11.Connection]:
        """A new connection to the address the kept-alive one had reached (checked then)."""
        old = self._upstream
        assert old is not None
        old.stream.close()
        self._upstream = None
        _, _, port, addr = old.key
        found = await self._proxy._connect((addr,), port)
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
        try:
            await drain_body(self._stream, self._h11, self._limits.idle_timeout_s)
        except Refused as refusal:
            return Done(refusal=refusal)
        except PeerGone:
            return Done()
        self._progress = Progress(status=command.status)
        events: list[h11.Event] = [h11.Response(status_code=command.status,
                                                headers=command.headers, reason=b"OK")]
        if command.body:
            events.append(h11.Data(data=command.body))
        events.append(h11.EndOfMessage())
        data = b"".join(self._h11.send(e) or b"" for e in events)
        try:
            sent = await self._stream.send(data, self._limits.idle_timeout_s)
        except PeerGone:
            return Done(status=command.status)
        return Done(bytes_down=sent, status=command.status, keep_alive=True)

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
        upstream_sock, self._dialled = self._dialled, None
        assert upstream_sock is not None and self._dialled_key is not None
        if command.inspect:
            return await self._intercept(command.target, upstream_sock, initial, status,
                                         resolved=str(self._dialled_key[3]))
        policy = self._proxy.policy
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

    async def _intercept(self, target: Target, upstream_sock: socket.socket, initial: bytes,
                         status: int | None, *, resolved: str) -> Done:
        proxy = self._proxy
        policy = proxy.policy.inspection
        interception = proxy.interception
        assert policy is not None and interception is not None
        try:
            upstream = await open_stream(upstream_sock, UpstreamGone)
        except OSError:
            upstream_sock.close()
            return Done(status=status)
        try:
            result = await InterceptedTunnel(
                client=self._stream, upstream=upstream, host=target.host, port=target.port,
                initial=initial, resolved=resolved, channel=self._channel,
                policy=policy, interception=interception, emit=self._emit_inner,
                limits=self._limits, clock=proxy.clock,
            ).run()
        finally:
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
        log = self._proxy._log
        log.append(record)
        if not log.has_room():
            self._stream.abort()


# A transparent flow's header, written by the sandbox's relay: "tcp|udp ADDRESS PORT\n".
_MAX_FLOW_HEADER = 128


class _TransparentClient(_Client):
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
            name = self._proxy.synthetic.name_for(address)
            clock = self._proxy.clock
            opened = FlowOpened(kind=kind, host=name if name is not None else str(address),
                                port=port, ts=clock.iso(), started=clock.monotonic())
            await self._drive(Handler(flow(self._context())), opened)
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


class _DnsClient(_Client):
    """DNS over one stream, framed as DNS over TCP is (RFC 1035 4.2.2): each query is
    answered by ``dns.answer`` from the policy alone, and each refused name recorded."""

    async def run(self) -> None:
        try:
            while (query := await self._frame()) is not None:
                clock = self._proxy.clock
                stamp = clock.iso(), clock.monotonic()
                result = dns_answer(query, policy=self._proxy.policy, names=self._proxy.synthetic)
                if result.refusal is not None and self._proxy._first_dns_refusal(result.name):
                    refused = NameRefused(name=result.name, qtype=result.qtype,
                                          decision=result.refusal, ts=stamp[0], started=stamp[1])
                    for command in Handler(dns_refusal(self._channel, clock)).handle(refused):
                        assert isinstance(command, Record)
                        self._proxy._settle(command)
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
        self._decisions = Decisions(policy)
        self._resolver: Resolver = resolver or system_resolver
        self.limits = limits or ProxyLimits()
        # ``on_record`` sees each record the moment it is written (see RecordLog).
        self.clock = Clock(monotonic=time.monotonic, iso=now_iso, new_id=lambda: uuid.uuid4().hex)
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
        self._pool = _Pool()
        # A name's addresses, each set checked again by every request that uses it.
        self._resolutions: dict[tuple[str, int], tuple[float, tuple[IPAddress, ...]]] = {}

    @property
    def policy(self) -> NetworkPolicy:
        """The policy in force, with the proxy's own listeners as ``proxy_addresses``."""
        return self._decisions.policy

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
        self._pool.close()
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
        policy = self.policy
        self._decisions = Decisions(policy.with_proxy_addresses(
            [*policy.proxy_addresses, (bound_host, bound_port)]))
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
            try:
                stream = await accept_stream(sock, PeerGone)
            except OSError:
                sock.close()
                slots.release()
                continue
            client = _CLIENTS[listener.kind](self, stream, listener.channel)
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

    async def _resolve(self, host: str, port: int) -> tuple[IPAddress, ...]:
        """Every address ``host`` resolves to, from the resolver at most once per ``RESOLVED_S``.

        Only answers are kept, never a failure: a name that did not resolve is
        asked again next time.
        """
        now = time.monotonic()
        kept = self._resolutions.get((host, port))
        if kept is not None and now - kept[0] < RESOLVED_S:
            return kept[1]
        try:
            async with asyncio.timeout(self.limits.resolve_timeout_s):
                found = tuple(await self._resolver(host, port))
        except OSError:  # gaierror and TimeoutError included
            return ()
        if found:
            if len(self._resolutions) >= RESOLUTIONS_MAX:
                # A hostile client can name as many allowed hosts as it likes.
                self._resolutions.clear()
            self._resolutions[(host, port)] = (now, found)
        return found

    async def _connect(self, addresses: Sequence[IPAddress],
                       port: int) -> tuple[IPAddress, socket.socket] | None:
        """A connection to the first of ``addresses`` that answers within the connect timeout."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.limits.connect_timeout_s):
                for addr in addresses:
                    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
                    sock = socket.socket(family, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    try:
                        await loop.sock_connect(sock, (str(addr), port))
                    except OSError:
                        sock.close()
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return addr, sock
        except TimeoutError:
            pass
        return None

    def _settle(self, command: Record | Release) -> None:
        if isinstance(command, Release):
            self._log.release()
        elif command.mode is RecordMode.RESERVED:
            self._log.append(command.record, reserved=True)
        elif command.mode is RecordMode.OFFERED:
            self._log.offer(command.record)
        else:
            self._log.append(command.record)

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
