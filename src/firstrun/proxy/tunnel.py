"""Carry a tunnel's bytes (CONNECT, or a redirected connection), after judging its first flight.

Guarantee: no client byte reaches the upstream before the client's first
flight has been judged (``flight.judge_flight``); a refused flight closes the
tunnel with nothing forwarded. Upstream bytes flow to the client from the
start, so protocols where the server speaks first work. A tunnel can always be
ended (``abort()``), and its result says how it ended (``TunnelEnd``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import os
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from firstrun.policy.decision import Decision
from firstrun.proxy.errors import Refused
from firstrun.proxy.flight import Flight, FlightKind, read_flight
from firstrun.proxy.records import TunnelEnd

_CHUNK = 1 << 20
_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class TunnelResult:
    bytes_up: int
    bytes_down: int
    # Set when the first-flight check closed the tunnel.
    refusal: Refused | None
    # What the first flight was (None: the client left before it could tell).
    flight: FlightKind | None = None
    # The decision a raw stream went under (its tcp rule, or report mode's).
    decision: Decision | None = None
    ended: TunnelEnd | None = None


Judge = Callable[[Flight], Decision | Refused | None]


class _Pumps:
    """Threads that move tunnels' bytes, kept a while between tunnels.

    Never a bounded pool (the loop's executor): tunnels live for minutes, and
    a few of them would starve every other. Every job gets a thread at once,
    an idle one when there is one, else a new one; starting a thread (and
    waiting for it to start) was a third of a new tunnel's setup. A thread
    idle for ``IDLE_S`` ends. Daemon threads: a tunnel never holds the
    interpreter's exit.
    """

    IDLE_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                # Taken and handed over under one lock: each idle thread gets one job.
                self._idle -= 1
                self._jobs.put(job)
                return
        threading.Thread(target=self._work, args=(job,), name="firstrun-tunnel",
                         daemon=True).start()

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    try:
                        # A job handed over as the wait ran out is still this thread's.
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


_PUMPS = _Pumps()


def _in_thread(fn: Callable[[], _T]) -> asyncio.Future[_T]:
    future: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except Exception as exc:  # re-raised in the awaiting coroutine
            future.set_exception(exc)

    _PUMPS.submit(run)
    return asyncio.wrap_future(future)


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass  # already shut down or reset: either way it is closed


class Tunnel:
    """Both directions of one established tunnel; ``judge`` decides its first flight."""

    def __init__(
        self, *, client: socket.socket, upstream: socket.socket, initial: bytes, judge: Judge
    ) -> None:
        self._client = client
        self._upstream = upstream
        self._initial = initial
        self._judge = judge
        self._lock = threading.Lock()
        self._ended: TunnelEnd | None = None

    def _end(self, how: TunnelEnd) -> None:
        """Note how the tunnel ended: the first to say so, from either thread, wins."""
    # The first EOF or error on either side, a refusal, the proxy's stop, or a
    # thread the proxy could not start.
        with self._lock:
            if self._ended is None:
                self._ended = how

    # Shutting down both sockets wakes any thread blocked on them: this is what
    # lets an error in either direction, or ``abort()``, end the whole tunnel.
    def _shut(self) -> None:
        _shutdown(self._client, socket.SHUT_RDWR)
        _shutdown(self._upstream, socket.SHUT_RDWR)

    def abort(self) -> None:
        """End the tunnel from outside (the proxy is stopping)."""
        self._end(TunnelEnd.PROXY_STOPPED)
        self._shut()

    async def run(self) -> TunnelResult:
        self._client.setblocking(True)
        self._upstream.setblocking(True)
        try:
            up = _in_thread(self._up)
        except RuntimeError:
            # No thread to be had (a pids or memory limit): nothing was carried.
            self._end(TunnelEnd.PROXY_FAILED)
            self._shut()
            return self._result(0, (0, None, None, None))
        try:
            down = _in_thread(lambda: self._pump(self._upstream, self._client, from_client=False))
        except RuntimeError:
            self._end(TunnelEnd.PROXY_FAILED)
            self._shut()
            return self._result(0, await up)
        try:
            upward, bytes_down = await asyncio.gather(up, down)
        finally:
            self._shut()
        return self._result(bytes_down, upward)

    def _result(self, bytes_down: int,
                upward: tuple[int, Refused | None, FlightKind | None, Decision | None]) -> TunnelResult:
        bytes_up, refusal, flight, decision = upward
        return TunnelResult(bytes_up=bytes_up, bytes_down=bytes_down, refusal=refusal,
                            flight=flight, decision=decision, ended=self._ended)

    def _pump(self, src: socket.socket, dst: socket.socket, *, from_client: bool) -> int:
        """Move bytes from ``src`` to ``dst`` until EOF; returns the count moved."""
        # ``os.splice`` through a pipe, one blocking thread per direction, so
        # payload never passes through Python buffers: this is what keeps a
        # tunnel near the speed of a direct connection. EOF half-closes ``dst``
        # and leaves the other direction running; an error shuts down both.
        closed, src_reset, dst_reset = (
            (TunnelEnd.CLIENT_CLOSED, TunnelEnd.CLIENT_RESET, TunnelEnd.UPSTREAM_RESET)
            if from_client else
            (TunnelEnd.UPSTREAM_CLOSED, TunnelEnd.UPSTREAM_RESET, TunnelEnd.CLIENT_RESET))
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        total = 0
        try:
            try:
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _CHUNK)
            except OSError:
                pass  # the default 64 KiB pipe is slower but still correct
            while True:
                try:
                    pending = os.splice(src.fileno(), write_end, _CHUNK)
                except OSError:
                    self._end(src_reset)
                    self._shut()
                    return total
                if pending == 0:
                    break
                while pending:
                    try:
                        moved = os.splice(read_end, dst.fileno(), pending)
                    except OSError:
                        self._end(dst_reset)
                        self._shut()
                        return total
                    pending -= moved
                    total += moved
        finally:
            os.close(read_end)
            os.close(write_end)
        self._end(closed)
        _shutdown(dst, socket.SHUT_WR)
        return total

    def _first_flight(self) -> tuple[bytes, Flight] | None:
        buf = bytearray(self._initial)
        while True:
            flight = read_flight(bytes(buf), eof=False)
            if flight is not None:
                return bytes(buf), flight
            try:
                chunk = self._client.recv(1 << 16)
            except OSError:
                self._end(TunnelEnd.CLIENT_RESET)
                self._shut()
                return None
            if not chunk:
                self._end(TunnelEnd.CLIENT_CLOSED)
                flight = read_flight(bytes(buf), eof=True)
                assert flight is not None
                return bytes(buf), flight
            buf += chunk

    def _up(self) -> tuple[int, Refused | None, FlightKind | None, Decision | None]:
        first = self._first_flight()
        if first is None:
            _shutdown(self._upstream, socket.SHUT_WR)
            return 0, None, None, None
        data, flight = first
        verdict = self._judge(flight)
        if isinstance(verdict, Refused):
            self._end(TunnelEnd.REFUSED)
            self._shut()
            return 0, verdict, flight.kind, None
        if not data:
            _shutdown(self._upstream, socket.SHUT_WR)
            return 0, None, flight.kind, verdict
        try:
            self._upstream.sendall(data)
        except OSError:
            self._end(TunnelEnd.UPSTREAM_RESET)
            self._shut()
            return 0, None, flight.kind, verdict
        return (len(data) + self._pump(self._client, self._upstream, from_client=True), None,
                flight.kind, verdict)
