"""Runs carried out in processes of their own, that end like Ctrl-C when whoever asked is gone.

Guarantee: ``python -m firstrun.run.node_run FD`` (FD a Unix socket's descriptor)
detaches, so no process-tree kill of its starter reaches it, and carries out
each run asked for over the socket in a forked child that writes its answer
atomically. When the run's starter is gone, or on SIGINT or SIGTERM, the run
ends at its next call boundary with its session closed and its workspace
removed, exactly as an interrupted local run. The server exits with the socket.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from firstrun.results.store import write_atomic

JOB = "job.pickle"
ANSWER = "answer.pickle"
# A directory's path, and the two pipe ends that come with it.
_MESSAGE_BYTES = 4096


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
    # What a run imports on its way, loaded once, before any run is asked for.
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


def _one_run(where: Path, alive: int, done: int) -> None:
    """In the forked child: the run, its answer, and DONE's end."""
    # The run is DIR/job.pickle, carried out with run_task; DIR/answer.pickle is
    # the record or the exception. DONE is the write end of a pipe the starter
    # reads to its end; ALIVE the read end of a pipe the starter writes. ALIVE's
    # end (the starter closed it, or died) sets the run's stop, and then DIR is
    # removed too, since nobody is left to read it.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    starter_gone = threading.Event()

    def watch() -> None:
        while os.read(alive, 1):
            pass
        starter_gone.set()
        stop.set()

    threading.Thread(target=watch, daemon=True, name="firstrun-node-watch").start()
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


def serve(sock: socket.socket) -> None:
    """Fork a child per message until the starter's end of ``sock`` is gone."""
    # Each message is a directory's path with two pipe ends (ALIVE, DONE) passed
    # along. Single-threaded, so a fork copies no lock another thread held; runs
    # in flight when it exits finish on their own. Forked from a parent that has
    # the modules already (_warm), a run starts as fast as inside the worker.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 2)
        except OSError:
            return
        if not data:
            return
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        alive, done = fds
        if os.fork() == 0:
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _one_run(Path(data.decode()), alive, done)
            finally:
                os._exit(0)
        os.close(alive)
        os.close(done)


# A Ray node runs each run this way (run.ray_engine), because Ray kills a task's
# worker and its children outright when the driver goes away; the run, detached
# by the double fork below (nobody's child), outlives that kill just long enough
# to close its sandbox.
def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    if os.fork() != 0:
        os._exit(0)  # the starter's child ends at once; the server is its grandchild
    _warm()
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
