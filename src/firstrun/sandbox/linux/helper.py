"""The in-sandbox helper: bubblewrap's only child, and the parent of every command.

Guarantee: before it answers "ready", the helper has confined itself, and so
everything it will ever start: Landlock limits writes to the workspace, /tmp,
the sandbox HOME and a few devices (or the helper refuses to start when
Landlock was required and cannot be applied); rlimits cap processes, memory,
core dumps and open files; it is not dumpable, so a command running under
the same uid cannot open ``/proc/<helper>/fd`` or its memory; and it is a
child subreaper, so anything a command leaves behind (setsid, double fork)
is re-parented to it and can be found and killed. Commands start with the
highest OOM score (1000) while the helper keeps its own (it wears 1000 only
for the instant it forks one), so when a session cgroup's memory cap is hit
the kernel kills a command, not the supervisor (tmpfs pages belong to no
process, so otherwise the helper, the largest process, would be the
victim). A command starts with stdin on /dev/null, its own session and process group, only fds 0-2 open and
exactly the environment the harness built. On timeout, the command's whole
tree is killed: every process created since it started, not only its group.

The only way out of the network namespace is the relay: a listener on
127.0.0.1:PORT whose connections are spliced to sockets the harness connects
to its egress proxy and hands over one by one (SCM_RIGHTS). The proxy's
socket path never exists inside the sandbox.

Protocol on the control socket (fd passed by number): JSON lines.
Helper -> harness: ``ready`` once, then per command ``out`` chunks (base64)
and one ``exit``. Harness -> helper: ``exec`` and ``shutdown``.

Runs as ``python -I -S -c <this source> <config json>``: stdlib only, no
imports from firstrun, because inside the sandbox there is only the
interpreter's own installation. The harness imports it too, to probe
Landlock with the same code that applies it.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

# Landlock syscall numbers are the same on every architecture.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

# Write-side filesystem rights, with the ABI that introduced each. Reading
# stays governed by the mount namespace: what is not bound does not exist.
_ACCESS_FS_WRITE = (
    (1, 1 << 1),   # WRITE_FILE
    (1, 1 << 4),   # REMOVE_DIR
    (1, 1 << 5),   # REMOVE_FILE
    (1, 1 << 6),   # MAKE_CHAR
    (1, 1 << 7),   # MAKE_DIR
    (1, 1 << 8),   # MAKE_REG
    (1, 1 << 9),   # MAKE_SOCK
    (1, 1 << 10),  # MAKE_FIFO
    (1, 1 << 11),  # MAKE_BLOCK
    (1, 1 << 12),  # MAKE_SYM
    (2, 1 << 13),  # REFER
    (3, 1 << 14),  # TRUNCATE
    (5, 1 << 15),  # IOCTL_DEV
)
# Rights that make sense on a single file rule (the rest are directory rights).
_ACCESS_FS_FILE = (1 << 1) | (1 << 14) | (1 << 15)
# ABI 6: no abstract unix sockets or signals across the domain boundary.
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1

# After a command exits, how long its pipes may stay quiet before the helper
# stops listening, and how long a background writer may keep them busy.
_IDLE_S = 0.05
_DRAIN_S = 1.0

# The OOM killer's first choice, host-wide and within the session cgroup.
_COMMAND_OOM_SCORE = b"1000"

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class LandlockError(Exception):
    """Landlock could not be applied; ``args[0]`` says which step failed."""


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return abi if abi > 0 else 0


def apply_landlock(writable_dirs: list[str], writable_files: list[str], *, min_abi: int) -> int:
    """Restrict this thread and its future children to writing beneath the given paths.

    Returns the ABI used. Must run before any other thread exists, since
    Landlock applies to the calling thread only.
    """
    abi = landlock_abi()
    if abi < max(1, min_abi):
        raise LandlockError(f"kernel Landlock ABI is {abi}, need at least {max(1, min_abi)}")
    handled = 0
    for since, right in _ACCESS_FS_WRITE:
        if abi >= since:
            handled |= right
    attr = _RulesetAttr(handled_access_fs=handled, handled_access_net=0,
                        scoped=(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                            ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise LandlockError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for path, access in [(p, handled) for p in writable_dirs] + [
            (p, handled & _ACCESS_FS_FILE) for p in writable_files
        ]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                rule = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
                if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                 ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                 ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise LandlockError(
                        f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}")
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                         ctypes.c_uint32(0)) != 0:
            raise LandlockError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi


def _set_limits(limits: dict) -> None:
    # RLIMIT_DATA rather than RLIMIT_AS: V8 and Go reserve huge PROT_NONE
    # ranges up front, which RLIMIT_AS counts and RLIMIT_DATA does not.
    for res, value in (
        (resource.RLIMIT_NPROC, limits["pids"]),
        (resource.RLIMIT_DATA, limits["memory_bytes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(res, (value, value))


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


class _Channel:
    """JSON lines over the control socket; writes may come from the main thread only."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, msg: dict) -> None:
        self.sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")

    def recv(self) -> dict | None:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


class _Relay:
    """127.0.0.1:PORT inside, spliced to proxy connections the harness hands over."""

    def __init__(self, port: int, dialer: socket.socket) -> None:
        self.dialer = dialer
        self.lock = threading.Lock()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(128)

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def _dial(self) -> socket.socket | None:
        with self.lock:
            self.dialer.send(b"c")
            _, fds, _, _ = socket.recv_fds(self.dialer, 1, 1)
        return socket.socket(fileno=fds[0]) if fds else None

    def _accept(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            upstream = self._dial()
        except OSError:
            upstream = None
        if upstream is None:
            conn.close()
            return
        with conn, upstream:
            _splice(conn, upstream)


def _splice(a: socket.socket, b: socket.socket) -> None:
    peers = {a: b, b: a}
    open_ = {a, b}
    sel = selectors.DefaultSelector()
    for s in open_:
        sel.register(s, selectors.EVENT_READ)
    try:
        while open_:
            for key, _ in sel.select():
                src = key.fileobj
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                dst = peers[src]
                if data:
                    try:
                        dst.sendall(data)
                    except OSError:
                        return
                    continue
                sel.unregister(src)
                open_.discard(src)
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    return
    finally:
        sel.close()


def _proc_identity(pid: int) -> tuple[int, int, str] | None:
    """(pid, start time, state) from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields follow the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return pid, int(fields[19]), fields[0].decode()


def _processes() -> list[tuple[int, int, str]]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            ident = _proc_identity(int(name))
            if ident is not None:
                found.append(ident)
    return found


def _reap_orphans(keep: int | None) -> None:
    """Reap every exited child except ``keep`` (the command subprocess waits on itself)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        os.waitpid(info.si_pid, 0)


def _kill_since(existing: set[tuple[int, int]], keep: int | None) -> None:
    """SIGKILL every live process not in ``existing`` until none remain.

    Orphans come back to the helper (subreaper), so each round also reaps;
    a process forked between listing and killing is caught the next round.
    """
    me = os.getpid()
    while True:
        victims = [
            pid for pid, start, state in _processes()
            if pid not in (1, me) and (pid, start) not in existing and state not in ("Z", "X")
        ]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_orphans(keep)
        time.sleep(0.001)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Helper:
    def __init__(self, channel: _Channel, oom: tuple[int, bytes]) -> None:
        self.channel = channel
        # This process's own oom_score_adj, opened before it became
        # non-dumpable (its /proc files then belong to root) and before
        # Landlock (which refuses the open), and the value to return to.
        self.oom_fd, self.oom_own = oom

    def serve(self) -> None:
        while True:
            msg = self.channel.recv()
            if msg is None or msg["op"] == "shutdown":
                self.shutdown()
                return
            if msg["op"] == "exec":
                self.run(msg)

    def shutdown(self) -> None:
        _kill_since(set(), None)
        _reap_orphans(None)
        self.channel.send({"op": "closed"})

    def run(self, msg: dict) -> None:
        cmd_id = msg["id"]
        env = dict(msg["env"])
        existing = {(pid, start) for pid, start, _ in _processes()}
        started = time.monotonic()
        # A child inherits the score at fork, so the helper wears it only
        # while it forks; raising needs no privilege, and returning to its
        # own value never goes below the minimum it inherited.
        os.pwrite(self.oom_fd, _COMMAND_OOM_SCORE, 0)
        try:
            proc = subprocess.Popen(
                msg["argv"], cwd=msg["cwd"], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            # Not a sandbox failure: the command could not be started (bad cwd, no such file).
            self.channel.send({"op": "out", "id": cmd_id, "stream": "stderr",
                               "data": base64.b64encode(f"{exc}\n".encode()).decode()})
            self.channel.send({"op": "exit", "id": cmd_id, "code": 126 if exc.errno == errno.EACCES
                               else 127, "timed_out": False,
                               "duration_s": time.monotonic() - started})
            return
        finally:
            os.pwrite(self.oom_fd, self.oom_own, 0)
        timeout = msg["timeout"]
        deadline = started + timeout if timeout is not None else None
        timed_out = self._pump(cmd_id, proc, deadline)
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _kill_since(existing, proc.pid)
        code = proc.wait()
        _reap_orphans(None)
        self.channel.send({"op": "exit", "id": cmd_id, "code": _exit_code(code),
                           "timed_out": timed_out, "duration_s": time.monotonic() - started})

    def _pump(self, cmd_id: int, proc: subprocess.Popen, deadline: float | None) -> bool:
        """Stream output until the command exits and its pipes drain; True on timeout.

        A background process may keep the pipes open after the command
        exits; once the command is gone, output is drained until the pipes
        are idle for a moment, and for at most ``_DRAIN_S``, then the helper
        stops listening. Both bounds are checked on every round, not only
        when the pipes go quiet: a command that keeps a pipe full (one
        enlarged with F_SETPIPE_SZ never empties between two reads) would
        otherwise never time out, and a chatty server left running would
        hold the exec forever.
        """
        sel = selectors.DefaultSelector()
        streams = {proc.stdout: "stdout", proc.stderr: "stderr"}
        for pipe in streams:
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ)
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
        exited = False
        drain_end = None
        try:
            while streams:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return not exited
                if drain_end is not None and now >= drain_end:
                    return False
                wait = None if deadline is None else deadline - now
                if exited:
                    wait = _IDLE_S if wait is None else min(wait, _IDLE_S)
                events = sel.select(wait)
                if not events:
                    return not exited
                for key, _ in events:
                    if key.fileobj == pidfd:
                        exited = True
                        drain_end = time.monotonic() + _DRAIN_S
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


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    control = socket.socket(fileno=config["control_fd"])
    channel = _Channel(control)
    report: dict = {"op": "ready", "ok": True, "pid": os.getpid()}
    try:
        os.set_inheritable(config["control_fd"], False)
        oom_fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
        oom = (oom_fd, os.read(oom_fd, 16).strip())
        _prctl(_PR_SET_DUMPABLE, 0)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _set_limits(config["limits"])
        ll = config["landlock"]
        if not ll["apply"]:
            report["landlock_abi"] = 0
            report["landlock_error"] = "omitted: the profile does not require it"
        else:
            try:
                report["landlock_abi"] = apply_landlock(ll["dirs"], ll["files"],
                                                        min_abi=ll["min_abi"])
            except LandlockError as exc:
                if ll["required"]:
                    raise
                report["landlock_abi"] = 0
                report["landlock_error"] = str(exc)
        relay = None
        if config["proxy_port"] is not None:
            dialer = socket.socket(fileno=config["dial_fd"])
            os.set_inheritable(config["dial_fd"], False)
            relay = _Relay(config["proxy_port"], dialer)
    except (OSError, LandlockError) as exc:
        channel.send({"op": "ready", "ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "landlock": isinstance(exc, LandlockError)})
        return 1
    if relay is not None:
        relay.start()
    channel.send(report)
    Helper(channel, oom).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
