"""Signals during a session: unwind once, then let teardown finish.

Guarantee: the first SIGINT, SIGTERM or SIGHUP raises ``Signalled`` in the
main thread, which unwinds every ``with`` block (closing the session, stopping
the proxy, removing its private directories); any further one is ignored
until the block exits, because a second Ctrl-C that aborted the teardown is
how a session gets left running. Under ``nohup`` SIGHUP stays ignored.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# The signals that end a session in order.
# SIGHUP is a closed terminal or a dropped ssh connection: by default it would
# end the process with nothing unwound.
UNWINDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Signalled(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived. A BaseException, like KeyboardInterrupt, so
    no ``except Exception`` on the way up can swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def signals_unwind() -> Iterator[None]:
    def handler(signum: int, _frame: FrameType | None) -> None:
        for s in UNWINDING:
            signal.signal(s, signal.SIG_IGN)
        raise Signalled(signum)

    previous = {s: signal.signal(s, handler) for s in UNWINDING
                if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
