"""One run carried out in a process of its own, that ends like Ctrl-C when whoever asked is gone.

Guarantee: ``python -m firstrun.run.node_run ALIVE DONE JOB`` detaches (a
double fork: it is nobody's child, so no process-tree kill of its starter
reaches it), imports what a run needs while it waits, then reads a
directory's path from the pipe JOB, carries out the run ``DIR/job.pickle``
describes with ``run_task`` and writes ``DIR/answer.pickle`` (the record, or
the exception) atomically; then it closes DONE, a pipe's write end its
starter reads to its end. ALIVE is a pipe's read end whose writer is the
starter: its end (the starter closed it, or died), SIGINT or SIGTERM sets
the run's stop, and the run ends at its next call boundary with its session
closed and its workspace removed, exactly as an interrupted local run; before
a job it just exits. With its starter gone it removes DIR too, since nobody
is left to read it.

A Ray node runs each run this way (``run.ray_engine``), because Ray kills a
task's worker and its children outright when the driver goes away; the run,
detached, outlives that kill just long enough to close its sandbox. The
worker starts the next one when a run ends, so the next run on it does not
wait for the imports.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from firstrun.results.store import write_atomic

JOB = "job.pickle"
ANSWER = "answer.pickle"


def carry_out(job: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
    """The run's record (``record``), or what it raised (``error``)."""
    from firstrun.run.runner import run_task

    answer: dict[str, Any] = {}

    def run() -> None:
        try:
            answer["record"] = run_task(job["task"], attempt=job["attempt"],
                                        agent=job["agent"].build(), config=job["config"],
                                        stop=stop, max_spend=job["max_spend"])
        except BaseException as exc:  # noqa: BLE001 (sent back whole)
            answer["error"] = exc

    # A thread that outlives the session: bubblewrap dies with the thread that forked it.
    worker = threading.Thread(target=run, name="firstrun-node-run")
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    return answer


def _warm() -> None:
    # What a run imports on its way, loaded before it is asked for.
    import firstrun.docs.reader  # noqa: F401
    import firstrun.proxy.intercept  # noqa: F401
    import firstrun.proxy.server  # noqa: F401
    import firstrun.run.runner  # noqa: F401
    from firstrun.sandbox.select import REGISTRY

    for entry in REGISTRY:
        try:
            entry.load()
        except ImportError:
            pass  # a backend this machine cannot load is one no run here uses


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    return data


def main(argv: list[str]) -> int:
    alive, done, job = int(argv[1]), int(argv[2]), int(argv[3])
    if os.fork() != 0:
        os._exit(0)  # the starter's child ends at once; the run is its grandchild
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    starter_gone = threading.Event()
    running = threading.Event()

    def watch() -> None:
        while os.read(alive, 1):
            pass
        starter_gone.set()
        stop.set()
        if not running.is_set():
            os._exit(0)  # no job yet, and nobody left to give one

    threading.Thread(target=watch, daemon=True, name="firstrun-node-watch").start()
    _warm()
    path = _read_all(job).decode()
    if not path:
        return 0
    running.set()
    where = Path(path)
    answer = carry_out(pickle.loads((where / JOB).read_bytes()), stop)
    try:
        data = pickle.dumps(answer)
    except Exception as exc:  # noqa: BLE001 (an unpicklable exception still says what it was)
        error = answer.get("error")
        data = pickle.dumps({"error": RuntimeError(f"{type(error).__name__}: {error} ({exc})")})
    write_atomic(where / ANSWER, data)
    if starter_gone.is_set():
        shutil.rmtree(where, ignore_errors=True)
    os.close(done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
