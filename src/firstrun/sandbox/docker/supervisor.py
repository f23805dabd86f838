"""One command inside the run container, supervised: framed output, a timeout that kills the tree.

Guarantee: the harness runs every command as ``docker exec -i CONTAINER
python3 -I -S -c <this source>`` and writes the command as one JSON line on
its stdin (not as an argument: one argument may hold only 128 KiB, and the
whole command, environment included, would have to fit in it); the command
then gets every byte the kernel takes, as on the other backends. A command
that cannot start exits 127, saying why on its stderr. This supervisor becomes a child
subreaper, so every process the command starts, a ``setsid`` double fork
included, stays its descendant. When the timeout passes, or when its stdin
closes (the harness died, was interrupted, or killed the ``docker exec``
client, which alone would leave the command running in the container), it
SIGKILLs every descendant until none is left. The command's stdout and
stderr reach the harness only as JSON frames on the supervisor's stdout,
and the last frame is the exit status, so no output a command prints can
pass for the supervisor's own word. When the command exits in time,
descendants it left running (a server started by setup) are left alone,
as on every backend, and ``close`` removes the container with them.

Runs with ``-I -S``: stdlib only, nothing from the workspace on sys.path.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
# After the command exits, output still in flight is read for this long; a
# daemon that inherited the pipes keeps them open forever.
_DRAIN_S = 0.2


def _emit(msg: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree() -> None:
    me = os.getpid()
    while pids := _descendants(me):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Reap what died, so it leaves /proc and the loop can end.
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.01)


def read_config() -> dict:
    """The command's JSON, the first line on stdin; the rest of stdin only ever closes."""
    data = b""
    # JSON has no raw newline, so the line ends where a chunk does.
    while not data.endswith(b"\n"):
        chunk = os.read(0, 1 << 20)
        if not chunk:
            raise ValueError("stdin closed before the command was sent")
        data += chunk
    return json.loads(data)


def main(config: dict) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _emit({"op": "error", "error": f"PR_SET_CHILD_SUBREAPER: errno {ctypes.get_errno()}"})
        return 1
    started = time.monotonic()
    try:
        proc = subprocess.Popen(config["argv"], cwd=config["cwd"], env=config["env"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        error = f"cannot start {config['argv'][0]!r}: {exc}"
        _emit({"op": "out", "stream": "stderr",
               "data": base64.b64encode(f"{error}\n".encode()).decode()})
        _emit({"op": "exit", "code": 127, "timed_out": False, "duration_s": 0.0, "error": error})
        return 0
    deadline = started + float(config["timeout"])
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    sel.register(sys.stdin, selectors.EVENT_READ, "harness")
    timed_out = abandoned = False
    exited_at: float | None = None
    while len(sel.get_map()) > 1:
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > _DRAIN_S:
            break
        if exited_at is None and now >= deadline:
            timed_out = True
            break
        wait = _DRAIN_S if exited_at is not None else min(deadline - now, 0.5)
        for key, _ in sel.select(max(0.0, wait)):
            if key.data == "harness":
                if not os.read(sys.stdin.fileno(), 4096):
                    abandoned = True
                    break
                continue
            data = os.read(key.fileobj.fileno(), 65536)
            if not data:
                sel.unregister(key.fileobj)
                continue
            _emit({"op": "out", "stream": key.data, "data": base64.b64encode(data).decode()})
        if abandoned:
            break
    if timed_out or abandoned:
        _kill_tree()
    code = proc.wait()
    _emit({"op": "exit", "code": 128 - code if code < 0 else code, "timed_out": timed_out,
           "duration_s": time.monotonic() - started})
    return 0


if __name__ == "__main__":
    sys.exit(main(read_config()))
