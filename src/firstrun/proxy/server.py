"""The egress proxy: the only route out of every sandbox.

Guarantee: every request and tunnel is decided by ``firstrun.policy.network``
alone (the canonical name first, then every address it resolved to), and the
proxy dials only checked addresses, never the name again. Each leaves exactly
one ``EgressRecord``, refusals included, within a budget that fails closed
(``records``); malformed input gets a 4xx with a one-line reason, and none of
it can crash the proxy or hold a connection slot forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from firstrun.errors import ProxyError
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.clients import CLIENTS, ListenerKind, ProxyClient
from firstrun.proxy.core import PageReader, ProxyCore, Resolver, system_resolver
from firstrun.proxy.dns import preload as preload_dns
from firstrun.proxy.errors import PeerGone, listen_failed
from firstrun.proxy.exchange import Clock, Decisions
from firstrun.proxy.intercept import Interception
from firstrun.proxy.limits import ProxyLimits
from firstrun.proxy.records import EgressRecord, RecordLog, now_iso
from firstrun.proxy.wire import accept_stream

_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class _Listener:
    sock: socket.socket
    channel: Channel
    unix_path: str | None
    kind: ListenerKind = ListenerKind.PROXY


class EgressProxy:
    """The recording egress proxy; see the module docstring for what it guarantees."""

    # The decision is ``exchange``'s, with no sockets; ``clients`` are its
    # drivers (they read, and carry out the commands that come back), ``wire``
    # its data plane, and this class the listeners and the lifetime that hold
    # them together. With TLS inspection, each decrypted request inside a
    # shell-channel tunnel leaves one more record (``intercept``), and plain
    # HTTP on the shell channel is judged by the same ``policy.methods`` rules
    # before anything is dialled. A stalled head gets 408.

    def __init__(
        self,
        policy: NetworkPolicy,
        *,
        record_path: str | None = None,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
        on_record: Callable[[EgressRecord], None] | None = None,
        interception: Interception | None = None,
        pages: PageReader | None = None,
    ) -> None:
        # Inspection is all or nothing: rules without a CA to decrypt with, or
        # a CA without rules to apply, would each be a quiet downgrade.
        if (interception is None) != (policy.inspection is None):
            raise ProxyError(
                "TLS inspection needs both the policy's inspection rules and an Interception"
            )
        # Serving docs hosts as page reads decrypts their requests and hands them
        # to the run's docs reader: without either, a fetch would be lost.
        if policy.serve_docs and (interception is None or pages is None):
            raise ProxyError("serving docs hosts as page reads needs TLS inspection and a "
                             "page reader")
        self.interception = interception
        self.limits = limits or ProxyLimits()
        # ``on_record`` sees each record the moment it is written (see RecordLog).
        self.clock = Clock(monotonic=time.monotonic, iso=now_iso, new_id=lambda: uuid.uuid4().hex)
        # Each request reserves its record once its head is read, before it is
        # judged, dialled or answered, so nothing goes out that could not be
        # recorded. When a reservation is refused, that request and every later
        # one on every listener get a 503 ``record_budget_exhausted`` and are
        # counted, not recorded; ``stop`` writes one closing record with the
        # count. A refused request closes its connection, so a keep-alive
        # connection carries at most one denial and a flood costs a connection
        # per request. A TLS-inspected tunnel admitted before the budget was
        # spent still records each decrypted request it carries (they went
        # out); once the budget has no room, the proxy closes such a tunnel's
        # client connection after its current request.
        self._log = RecordLog(record_path, on_record=on_record,
                              max_records=self.limits.max_records,
                              max_bytes=self.limits.max_record_bytes)
        # ``http://attest.firstrun.invalid/`` is answered by the proxy itself
        # with this nonce, so a sandbox can prove which proxy it reached.
        self.nonce = secrets.token_urlsafe(24)
        # What every client connection shares; they reach the proxy through it alone.
        # A plain request may reuse an upstream connection an earlier one left
        # idle, only to an address its own decision checked for the same name
        # (``core.Pool``); a name's resolution is reused for ``core.RESOLVED_S``.
        self._core = ProxyCore(Decisions(policy), log=self._log,
                               resolver=resolver or system_resolver, limits=self.limits,
                               clock=self.clock, nonce=self.nonce, interception=interception,
                               pages=pages)
        # What the transparent DNS answered: the names behind synthetic addresses.
        self.synthetic = self._core.synthetic
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listeners: list[tuple[_Listener, asyncio.Task[None]]] = []
        self._clients: dict[ProxyClient, asyncio.Task[None]] = {}

    @property
    def policy(self) -> NetworkPolicy:
        """The policy in force, with the proxy's own listeners as ``proxy_addresses``."""
        return self._core.policy

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> EgressProxy:
        # The proxy runs its own asyncio loop in a daemon thread, so synchronous
        # callers (the runner, the CLI, tests) drive it with plain method calls.
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
        self._core.pool.close()
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
        # Every TCP listener joins ``proxy_addresses``, so the proxy never dials itself.
        policy = self.policy
        self._core.decisions = Decisions(policy.with_proxy_addresses(
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
            client = CLIENTS[listener.kind](self._core, stream, listener.channel)
            task = loop.create_task(client.run())
            self._clients[client] = task

            def done(_: asyncio.Task[None], client: ProxyClient = client) -> None:
                self._clients.pop(client, None)
                slots.release()

            task.add_done_callback(done)

    # -- records --------------------------------------------------------------

    def records(self) -> list[EgressRecord]:
        return self._log.snapshot()

    def denied(self) -> list[EgressRecord]:
        return [r for r in self._log.snapshot() if r.denied]


def capture_listeners(proxy: EgressProxy, sockdir: str) -> dict[str, str]:
    """The proxy's listeners for redirected flows and DNS, as ``ProxyEndpoint`` fields."""
    # Transparent capture's two kinds of traffic (``ListenerKind``): flows a
    # sandbox's relay redirected, each named by the address the program
    # dialled, which the proxy maps back to the name its DNS answered it for,
    # then decides and carries exactly like a CONNECT to that name (records say
    # ``capture: transparent``), its first flight judged before a byte goes up
    # (``flight``); and DNS queries, which it answers itself from the policy
    # (``dns``), never resolving or forwarding one, recording each refused name
    # once.
    return {
        "transparent_path": proxy.listen_unix(os.path.join(sockdir, "transparent.sock"),
                                              Channel.SHELL, ListenerKind.TRANSPARENT),
        "dns_path": proxy.listen_unix(os.path.join(sockdir, "dns.sock"), Channel.SHELL,
                                      ListenerKind.DNS),
    }
