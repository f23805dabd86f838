"""Signals during a session: unwind once, then let teardown finish.

Guarantee: the first SIGINT or SIGTERM raises ``Signalled`` in the main
thread, which unwinds every ``with`` block (closing the session, stopping the
proxy); any further SIGINT/SIGTERM is ignored until the block exits, because
a second Ctrl-C that aborted the teardown is how a session gets left running.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Signalled(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so
    no ``except Exception`` on the way up can swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def signals_unwind() -> Iterator[None]:
    def handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Signalled(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
