"""A Ctrl-C's worst interleaving, forced: the command dies first, the sweep learns late.

A Ctrl-C reaches the processes it signals and the sweep's own handler in any
order. ``kill_then_stop`` plays the order that used to give false verdicts:
it kills the run's command (named by ``exec -a TOKEN``) and waits for it to
be gone, then waits for ``held`` (set where a test holds the run's answer)
before it sets ``stop``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from firstrun.results.store import ResultsStore

# Bounds every wait here; only a hang guard, never a judgement.
_TRIES = 1200
_POLL_S = 0.1


def processes_named(token: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


def kill_then_stop(token: str, held: threading.Event, stop: threading.Event) -> threading.Thread:
    """Started: kill TOKEN's processes, wait for them to be gone and for ``held``, set ``stop``."""

    def interrupt() -> None:
        pids: list[int] = []
        for _ in range(_TRIES):
            if (pids := processes_named(token)):
                break
            time.sleep(_POLL_S)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for _ in range(_TRIES):
            if not processes_named(token):
                break
            time.sleep(_POLL_S)
        held.wait(_TRIES * _POLL_S)
        stop.set()

    thread = threading.Thread(target=interrupt, name="interrupt")
    thread.start()
    return thread


class StopOnceStored(ResultsStore):
    """Sets ``stop`` the moment the first record is stored: a stop after a run finished.

    Not at the run's ``RunFinished`` event: a record taken in after the stop
    is not kept, since the stop may have reached the run before its verdict.
    """

    def __init__(self, out_dir: Path, stop: threading.Event, *,
                 meta: dict[str, Any] | None = None) -> None:
        super().__init__(out_dir, meta=meta or {})
        self._stop = stop

    def add(self, run: dict) -> None:
        super().add(run)
        self._stop.set()
