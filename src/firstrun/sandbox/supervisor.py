"""The supervisor core inside every sandbox: the helper's (linux, gVisor, docker) and the guest agent's.

Guarantee: a ``Supervisor`` runs one command at a time and answers it with its
output (base64 ``out``) and one ``exit``; a timeout kills every process created
since the command began. While a command runs it beats (``alive``) every
``heartbeat_s``, and a ``shutdown`` or EOF abandons the command at once.
``kill_all`` and ``shutdown`` kill every process but the supervisor and the
namespace's init, and say how many (``killed``) or that they are done.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import select
import selectors
import signal
import subprocess
import threading
import time

# After a command exits, how long its pipes may stay quiet before the
# supervisor stops listening, and how long a background writer may keep
# them busy.
IDLE_S = 0.05
DRAIN_S = 1.0
# The longest the supervisor stays silent while a command runs.
HEARTBEAT_S = 1.0

PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_BPF_INSN_BYTES = 8
_PF_KTHREAD = 0x00200000

libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program: bytes) -> None:
    """Confine this thread and its future children to the BPF ``program``.

    Must run before any other thread exists: a filter loaded by prctl applies
    to the calling thread only. no_new_privs first, which loading a filter
    without CAP_SYS_ADMIN requires.
    """
    if not program or len(program) % _BPF_INSN_BYTES:
        raise OSError(errno.EINVAL, f"a seccomp program of {len(program)} bytes")
    code = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // _BPF_INSN_BYTES, ctypes.addressof(code))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"PR_SET_SECCOMP: {os.strerror(ctypes.get_errno())}")


class Stop(Exception):
    """The harness asked for shutdown, or the channel closed, while a command ran."""


class LinePipe:
    """JSON lines over two descriptors (one socket, or stdin and stdout on docker).

    Written from the main thread only. ``pending`` reads what arrived while
    a command ran and raises ``Stop`` at EOF or on a ``shutdown``, so a
    harness that goes away or closes the session is obeyed at once; any
    other message waits its turn.
    """

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.fd_in = fd_in
        self.fd_out = fd_out
        self.buf = b""
        self.queue: list[dict] = []

    # Blocking whatever the descriptors' flags say: gVisor gives the guest
    # the host's socket, which can answer a read or write with EAGAIN.
    def send(self, msg: dict) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        while data:
            try:
                data = data[os.write(self.fd_out, data):]
            except BlockingIOError:
                select.select([], [self.fd_out], [])

    def _read(self) -> bytes:
        while True:
            try:
                return os.read(self.fd_in, 65536)
            except BlockingIOError:
                select.select([self.fd_in], [], [])

    def _split(self) -> None:
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self.queue.append(json.loads(line))

    def pending(self) -> None:
        try:
            chunk = os.read(self.fd_in, 65536)
        except BlockingIOError:
            return  # readable, said the selector, but nothing was there after all
        if not chunk:
            raise Stop()
        self.buf += chunk
        self._split()
        if any(msg.get("op") == "shutdown" for msg in self.queue):
            raise Stop()

    def recv(self) -> dict | None:
        while not self.queue:
            chunk = self._read()
            if not chunk:
                return None
            self.buf += chunk
            self._split()
        return self.queue.pop(0)


def _proc_identity(pid: int, *, own_kernel: bool) -> tuple[int, int, str] | None:
    """(pid, start time, state) from /proc, or None if it is gone.

    ``own_kernel``: this is a whole kernel's /proc (a VM's guest), where
    kernel threads (PF_KTHREAD, kthreadd and its children) show, which are
    not ours to kill; a pid namespace's shows none, and its pid 2 is a command.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields follow the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if own_kernel and (int(fields[6]) & _PF_KTHREAD or fields[1] == b"2" or pid == 2):
        return None
    return pid, int(fields[19]), fields[0].decode()


def processes(*, own_kernel: bool) -> list[tuple[int, int, str]]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            ident = _proc_identity(int(name), own_kernel=own_kernel)
            if ident is not None:
                found.append(ident)
    return found


def reap_orphans(keep: int | None) -> None:
    """Reap every exited child except ``keep`` (the command subprocess waits on itself)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        os.waitpid(info.si_pid, 0)


def kill_since(existing: set[tuple[int, int]], keep: int | None, *, own_kernel: bool) -> int:
    """SIGKILL every live process not in ``existing`` until none remain; how many were killed.

    Orphans come back to the supervisor (subreaper or pid 1), so each round
    also reaps; a process forked between listing and killing is caught the
    next round.
    """
    me = os.getpid()
    killed: set[tuple[int, int]] = set()
    while True:
        victims = [
            (pid, start) for pid, start, state in processes(own_kernel=own_kernel)
            if pid not in (1, me) and (pid, start) not in existing and state not in ("Z", "X")
        ]
        if not victims:
            return len(killed)
        for pid, start in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add((pid, start))
            except ProcessLookupError:
                pass
        reap_orphans(keep)
        time.sleep(0.001)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _exit_fd(proc: subprocess.Popen) -> int:
    """A descriptor that becomes readable once ``proc`` has exited.

    A pidfd where the kernel has them; gVisor's has none (ENOSYS), and there
    a thread that waits for this one child writes to a pipe instead.
    """
    try:
        return os.pidfd_open(proc.pid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
    read_end, write_end = os.pipe2(os.O_CLOEXEC)

    def wait() -> None:
        try:
            proc.wait()
        finally:
            os.close(write_end)

    threading.Thread(target=wait, daemon=True).start()
    return read_end


# Stdlib only and no other firstrun import: this runs where there is only an interpreter
# (``bytecode.SHIPPED``: each program that imports it carries it).
class Supervisor:
    """Serves the harness's requests on ``channel``; a subclass says how a command starts."""

    # Whether this supervisor sees a whole kernel's processes (see ``_proc_identity``).
    own_kernel = False

    def __init__(self, channel: LinePipe, *, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.channel = channel
        self.heartbeat_s = heartbeat_s

    def spawn(self, msg: dict) -> subprocess.Popen:
        """Start ``msg``'s command, its pipes on stdout and stderr, confined as the session's.

        A ``SubprocessError`` is a command that could not be confined (its
        child failed before exec); an ``OSError``, one that could not start.
        """
        raise NotImplementedError

    def settle(self) -> None:
        """What must be done once every process is gone, before ``closed`` is said."""

    def serve(self) -> None:
        try:
            while True:
                msg = self.channel.recv()
                if msg is None or msg["op"] == "shutdown":
                    break
                if msg["op"] == "exec":
                    self.run(msg)
                elif msg["op"] == "kill_all":
                    killed = kill_since(set(), None, own_kernel=self.own_kernel)
                    reap_orphans(None)
                    self.channel.send({"op": "killed", "id": msg["id"], "count": killed})
        except Stop:
            pass
        self.shutdown()

    def shutdown(self) -> None:
        kill_since(set(), None, own_kernel=self.own_kernel)
        reap_orphans(None)
        self.settle()
        try:
            self.channel.send({"op": "closed"})
        except OSError:
            pass  # the harness is gone; everything is killed all the same

    def run(self, msg: dict) -> None:
        cmd_id = msg["id"]
        existing = {(pid, start) for pid, start, _ in processes(own_kernel=self.own_kernel)}
        started = time.monotonic()
        try:
            proc = self.spawn(msg)
        except subprocess.SubprocessError as exc:
            # Running it anyway would run it unconfined, perhaps privileged.
            self.channel.send({"op": "error", "id": cmd_id,
                               "error": f"cannot drop to the session's uid: {exc}"})
            return
        except OSError as exc:
            # Not a sandbox failure: the command could not be started (bad cwd, no such file).
            self.channel.send({"op": "out", "id": cmd_id, "stream": "stderr",
                               "data": base64.b64encode(f"{exc}\n".encode()).decode()})
            self.channel.send({"op": "exit", "id": cmd_id, "code": 126 if exc.errno == errno.EACCES
                               else 127, "timed_out": False,
                               "duration_s": time.monotonic() - started})
            return
        timeout = msg["timeout"]
        deadline = started + timeout if timeout is not None else None
        try:
            timed_out = self._pump(cmd_id, proc, deadline)
        except Stop:
            kill_since(existing, proc.pid, own_kernel=self.own_kernel)
            proc.wait()
            raise
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            kill_since(existing, proc.pid, own_kernel=self.own_kernel)
        code = proc.wait()
        reap_orphans(None)
        self.channel.send({"op": "exit", "id": cmd_id, "code": _exit_code(code),
                           "timed_out": timed_out, "duration_s": time.monotonic() - started})

    def _pump(self, cmd_id: int, proc: subprocess.Popen, deadline: float | None) -> bool:
        """Stream output until the command exits and its pipes drain; True on timeout.

        A background process may keep the pipes open after the command
        exits; once the command is gone, output is drained until the pipes
        are idle for a moment, and for at most ``DRAIN_S``, then the
        supervisor stops listening. Both bounds are checked on every round,
        not only when the pipes go quiet: a command that keeps a pipe full
        (one enlarged with F_SETPIPE_SZ never empties between two reads)
        would otherwise never time out, and a chatty server left running
        would hold the exec forever. The channel is watched too: at its EOF
        or a ``shutdown`` the command is abandoned (``Stop``), and the
        session ends without waiting for it.
        """
        sel = selectors.DefaultSelector()
        streams = {proc.stdout: "stdout", proc.stderr: "stderr"}
        for pipe in streams:
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ)
        pidfd = _exit_fd(proc)
        sel.register(pidfd, selectors.EVENT_READ)
        sel.register(self.channel.fd_in, selectors.EVENT_READ)
        exited = False
        drain_end = quiet_end = None
        beat = time.monotonic() + self.heartbeat_s
        try:
            while streams:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return not exited
                if drain_end is not None and now >= drain_end:
                    return False
                if quiet_end is not None and now >= quiet_end:
                    return False
                if now >= beat:
                    self.channel.send({"op": "alive", "id": cmd_id})
                    beat = now + self.heartbeat_s
                ends = [beat] + [t for t in (deadline, quiet_end) if t is not None]
                for key, _ in sel.select(max(0.0, min(ends) - now)):
                    if key.fileobj == self.channel.fd_in:
                        self.channel.pending()
                        continue
                    if exited:
                        quiet_end = time.monotonic() + IDLE_S
                    if key.fileobj == pidfd:
                        exited = True
                        drain_end = time.monotonic() + DRAIN_S
                        quiet_end = time.monotonic() + IDLE_S
                        sel.unregister(pidfd)
                        continue
                    data = os.read(key.fileobj.fileno(), 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        del streams[key.fileobj]
                        continue
                    self.channel.send({"op": "out", "id": cmd_id, "stream": streams[key.fileobj],
                                       "data": base64.b64encode(data).decode()})
            return False
        finally:
            sel.close()
            os.close(pidfd)
            proc.stdout.close()
            proc.stderr.close()
