"""Spacing between requests to one docs host, across every thread that reads.

Guarantee: for one host key, requests made inside ``Politeness.turn`` never
overlap, and each starts at least ``delay_s`` after the previous one to that
host ended, whichever reader or thread made it. A sweep shares one
``Politeness`` across its workers, so running ten tasks against one docs site
is no ruder than running one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class _HostState:
    __slots__ = ("lock", "last_end")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_end: float | None = None


class Politeness:
    """Per-host locks and the time each host was last asked something."""

    def __init__(
        self,
        *,
        # Injectable so tests can assert the spacing from recorded timestamps instead
        # of timing real waits.
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._hosts: dict[str, _HostState] = {}

    def _state(self, host_key: str) -> _HostState:
        with self._lock:
            state = self._hosts.get(host_key)
            if state is None:
                state = self._hosts[host_key] = _HostState()
            return state

    @contextmanager
    def turn(self, host_key: str, delay_s: float) -> Iterator[None]:
        """Hold ``host_key``'s turn: wait out the delay, then run the request.

        The gap is measured from the end of the previous request, not its
        start, so a slow host is given room in proportion to its slowness.
        """
        state = self._state(host_key)
        with state.lock:
            if state.last_end is not None:
                wait = state.last_end + delay_s - self.clock()
                if wait > 0:
                    self._sleep(wait)
            try:
                yield
            finally:
                state.last_end = self.clock()
