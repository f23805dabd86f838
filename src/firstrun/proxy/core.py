"""What every connection of one proxy shares, and the one way its drivers reach it.

Guarantee: a client driver (``clients``) judges by the proxy's current
decisions, touches the record budget only through ``reserve``, ``settle``
and ``write_inner``, resolves a name at most once per ``RESOLVED_S``, dials
only the addresses it is given, and reuses an upstream connection only from
the ``Pool``, keyed by the address its own decision checked. ``EgressProxy``
builds one ``ProxyCore`` and owns its lifetime.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import h11

from firstrun.policy.addresses import IPAddress
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.dns import SyntheticNames
from firstrun.proxy.exchange import Clock, Decisions, ProxyContext, Record, RecordMode, Release
from firstrun.proxy.intercept import Interception
from firstrun.proxy.limits import ProxyLimits
from firstrun.proxy.records import EgressRecord, RecordLog
from firstrun.proxy.wire import SocketStream

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
"""Resolve a canonical host once; raise ``OSError`` or return [] when it does not resolve."""

PageReader = Callable[[str], str]
"""The run's docs reader for a page fetched from the sandbox (``serve_docs``): a URL in,
the text the agent sees out (a failed read says so in the text); blocking."""

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


class Pool:
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
        self._idle: dict[PoolKey, list[tuple[float, Upstream]]] = {}
        # One sweep at a time closes what stayed idle too long, however many were given.
        self._sweep: asyncio.TimerHandle | None = None

    def take(self, key: PoolKey, now: float) -> Upstream | None:
        entries = self._idle.get(key)
        while entries:
            since, upstream = entries.pop()
            if now - since <= self.IDLE_S and upstream.stream.idle:
                return upstream
            upstream.stream.close()
        return None

    def give(self, upstream: Upstream, now: float) -> None:
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


PoolKey = tuple[Channel, str, int, IPAddress]


@dataclass(kw_only=True)
class Upstream:
    """An upstream HTTP connection: its stream and the h11 state of its current request."""

    key: PoolKey
    stream: SocketStream
    h11: h11.Connection
    reused: bool = False


class ProxyCore:
    """One proxy's decisions, record log, resolver, dialer and upstream pool, as its clients see them."""

    def __init__(self, decisions: Decisions, *, log: RecordLog, resolver: Resolver,
                 limits: ProxyLimits, clock: Clock, nonce: str,
                 interception: Interception | None, pages: PageReader | None = None) -> None:
        # Replaced, never changed, when a listener adds a proxy address.
        self.decisions = decisions
        self.limits = limits
        self.clock = clock
        self.nonce = nonce
        self.interception = interception
        self._pages = pages
        # What the transparent DNS answered: the names behind synthetic addresses.
        self.synthetic = SyntheticNames()
        self.pool = Pool()
        self._log = log
        self._resolver = resolver
        # A name's addresses, each set checked again by every request that uses it.
        self._resolutions: dict[tuple[str, int], tuple[float, tuple[IPAddress, ...]]] = {}
        # A name refused once is recorded once (its A, AAAA and retries are one refusal).
        self._dns_refused: set[str | None] = set()
        self._dns_lock = threading.Lock()

    @property
    def policy(self) -> NetworkPolicy:
        return self.decisions.policy

    def context(self, channel: Channel) -> ProxyContext:
        """What an exchange on ``channel`` is judged by, now."""
        return ProxyContext(channel=channel, decisions=self.decisions, clock=self.clock,
                            nonce=self.nonce, max_head_bytes=self.limits.max_head_bytes)

    async def read_page(self, url: str) -> str:
        """The docs reader's text for ``url``, read off the event loop (it blocks, and it
        reaches the docs through this very proxy's docs channel)."""
        assert self._pages is not None, "serve_docs needs a page reader (EgressProxy checks)"
        return await asyncio.get_running_loop().run_in_executor(None, self._pages, url)

    def reserve(self, channel: Channel) -> bool:
        return self._log.reserve(channel)

    def settle(self, command: Record | Release) -> None:
        """Carry out the exchange's ``Record`` (into its reservation, offered, or written) or ``Release``."""
        if isinstance(command, Release):
            self._log.release()
        elif command.mode is RecordMode.RESERVED:
            self._log.append(command.record, reserved=True)
        elif command.mode is RecordMode.OFFERED:
            self._log.offer(command.record)
        else:
            self._log.append(command.record)

    def write_inner(self, record: EgressRecord) -> bool:
        """Write a decrypted request's record (it went out); False once the budget has no room."""
        self._log.append(record)
        return self._log.has_room()

    def first_dns_refusal(self, name: str | None) -> bool:
        """Whether ``name`` is refused here for the first time: its A, AAAA and retries are one."""
        with self._dns_lock:
            if name in self._dns_refused:
                return False
            self._dns_refused.add(name)
            return True

    async def resolve(self, host: str, port: int) -> tuple[IPAddress, ...]:
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

    async def connect(self, addresses: Sequence[IPAddress],
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
