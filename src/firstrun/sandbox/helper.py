"""The in-sandbox helper: the supervisor of every command, on the linux, docker and gvisor backends.

Guarantee: before it answers "ready", the helper has confined itself, and so
everything it will start: Landlock where required (or it refuses to start),
rlimits, seccomp where handed a filter. No command can signal, trace or read
it, and under a memory cap the kernel kills a command, not the helper. A
command starts with stdin on /dev/null, its own session, fds 0-2 only and
exactly the harness's environment; a timeout or ``kill_all`` leaves none of it.
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

from firstrun.sandbox.supervisor import (
    HEARTBEAT_S,
    PR_SET_NO_NEW_PRIVS,
    LinePipe,
    Supervisor,
    libc,
    load_seccomp,
    prctl,
)

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

# The OOM killer's first choice, host-wide and within the session cgroup.
# Commands start with it while the helper keeps its own: tmpfs pages belong to no process,
# so otherwise the helper, the largest process, would be the victim when a memory cap is
# hit.
_COMMAND_OOM_SCORE = b"1000"

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_PR_CAPBSET_DROP = 24

libc.syscall.restype = ctypes.c_long


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
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
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
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
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
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                 ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                 ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise LandlockError(
                        f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                         ctypes.c_uint32(0)) != 0:
            raise LandlockError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi


def _set_limits(limits: dict) -> None:
    # RLIMIT_DATA rather than RLIMIT_AS: V8 and Go reserve huge PROT_NONE
    # ranges up front, which RLIMIT_AS counts and RLIMIT_DATA does not.
    # RLIMIT_NPROC counts every process of the uid host-wide, so it is left
    # out (pids None) where a session cgroup caps the session's processes
    # and the uid may be a real user's (docker).
    caps = [(resource.RLIMIT_DATA, limits["memory_bytes"]),
            (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_CORE, 0)]
    if limits.get("pids") is not None:
        caps.append((resource.RLIMIT_NPROC, limits["pids"]))
    for res, value in caps:
        resource.setrlimit(res, (value, value))


# Docker and gvisor: the helper is the container's root holding only CAP_SETUID, CAP_SETGID,
# CAP_SETPCAP and CAP_KILL (to kill what commands leave, under their uid); each command
# drops the bounding set and every id to the session's uid here, so it shares no uid with
# the helper and cannot signal it, trace it or open anything under /proc/1.
def _become(uid: int, gid: int, cwd: str):
    """In a command's child, before exec: no capability can ever come back, then every id,
    then the working directory.

    The bounding set goes first, while CAP_SETPCAP is still held; the id
    change then clears the permitted and effective sets. A failure raises,
    which Popen reports in the parent: a command never runs as root. The
    directory is entered as the session's uid, since root without
    CAP_DAC_OVERRIDE may not enter the lent workspace; a directory that is
    not there is the command's failure (exit 127, as exec would give),
    said on its stderr, which is already the pipe.
    """
    def preexec() -> None:
        cap = 0
        while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
            cap += 1
        if ctypes.get_errno() != errno.EINVAL or cap == 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        try:
            os.chdir(cwd)
        except OSError as exc:
            os.write(2, f"{exc}\n".encode())
            os._exit(126 if exc.errno == errno.EACCES else 127)
    return preexec


class _Dialer:
    """A fresh connection to one of the proxy's listeners, by kind: ``c`` the proxy for
    clients that ask for it, ``t`` redirected flows, ``d`` DNS.

    On linux the harness connects and hands each connection in over the dial
    socket (SCM_RIGHTS), so no socket path exists inside; on docker the
    helper dials the sidecar's ports, which the namespace firewall opens to
    the helper's uid alone; under gVisor, whose network has no way out, it
    connects to the proxy's own Unix sockets, bound in by path (an address
    that is a string).
    """

    def __init__(self, dial: socket.socket | None, addresses: dict[str, list | str] | None) -> None:
        self._dial = dial
        self._addresses = addresses or {}
        self._lock = threading.Lock()

    def open(self, kind: str) -> socket.socket | None:
        if self._dial is None:
            address = self._addresses[kind]
            if isinstance(address, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(address)
                except OSError:
                    sock.close()
                    raise
                return sock
            host, port = address
            return socket.create_connection((host, port), timeout=10)
        with self._lock:
            self._dial.send(kind.encode())
            _, fds, _, _ = socket.recv_fds(self._dial, 1, 1)
        return socket.socket(fileno=fds[0]) if fds else None


def _listen(family: int, kind: int, address: tuple) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen(128)
    return sock


def _accepting(listener: socket.socket, serve) -> None:
    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()


# On linux this is the only way out of the network namespace: its connections are spliced to
# sockets the harness connects to the egress proxy and hands in one by one (SCM_RIGHTS), so
# the proxy's socket path never exists inside the sandbox.
class _Relay:
    """127.0.0.1:PORT inside, spliced to proxy connections: the way out for proxy-aware clients."""

    def __init__(self, port: int, dialer: _Dialer) -> None:
        self.dialer = dialer
        self.listener = _listen(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", port))

    def start(self) -> None:
        _accepting(self.listener, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        try:
            upstream = self.dialer.open("c")
        except OSError:
            upstream = None
        if upstream is None:
            conn.close()
            return
        with conn, upstream:
            _splice(conn, upstream)


_SO_ORIGINAL_DST = 80  # and IP6T_SO_ORIGINAL_DST, at the IPv6 level


def _original_destination(conn: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was going (the nat table's REDIRECT kept it)."""
    if conn.family == socket.AF_INET6:
        raw = conn.getsockopt(socket.IPPROTO_IPV6, _SO_ORIGINAL_DST, 28)
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), int.from_bytes(raw[2:4], "big")
    raw = conn.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    return socket.inet_ntoa(raw[4:8]), int.from_bytes(raw[2:4], "big")


def _udp_peer(local_port: int) -> tuple[str, int] | None:
    """The destination a connected UDP socket of this namespace on ``local_port`` has."""
    for path, family in (("/proc/net/udp", socket.AF_INET), ("/proc/net/udp6", socket.AF_INET6)):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, remote = line.split()[1:3]
            if int(local.rsplit(":", 1)[1], 16) != local_port:
                continue
            address, port = remote.rsplit(":", 1)
            if int(port, 16) == 0:
                return None
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            return socket.inet_ntop(family, raw), int(port, 16)
    return None


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


class _Capture:
    """Transparent capture's inside half: what the namespace's nat rules redirect lands here.

    - ``dns_port`` (UDP and TCP): every query to port 53, wherever it was
      sent, is passed whole to the proxy's DNS listener, which alone answers;
    - ``tcp_port``: every other outbound TCP connection; its original
      destination is read back (SO_ORIGINAL_DST) and sent ahead of its bytes
      to the proxy's transparent listener, which decides it by name;
    - ``udp_port``: every other datagram; it goes nowhere, and the proxy is
      told where it was going so the refusal is recorded (once per socket).

    Loopback traffic inside the sandbox is never redirected.
    """

    def __init__(self, config: dict, dialer: _Dialer) -> None:
        self.dialer = dialer
        self.sockets: list[tuple[socket.socket, object]] = []
        self._told: set[tuple[int, tuple[str, int] | None]] = set()
        families = [(socket.AF_INET, "127.0.0.1")]
        # IPv6 where this namespace has ::1 at all; the harness loads its
        # rules only then (without it, nothing leaves over IPv6 anyway).
        self.ipv6 = False
        if config.get("ipv6"):
            try:
                _listen(socket.AF_INET6, socket.SOCK_DGRAM, ("::1", 0)).close()
                families.append((socket.AF_INET6, "::1"))
                self.ipv6 = True
            except OSError:
                pass
        for family, loopback in families:
            self.sockets += [
                (_listen(family, socket.SOCK_DGRAM, (loopback, config["dns_port"])), self._dns_udp),
                (_listen(family, socket.SOCK_STREAM, (loopback, config["dns_port"])),
                 self._dns_tcp),
                (_listen(family, socket.SOCK_STREAM, (loopback, config["tcp_port"])), self._flow),
                (_listen(family, socket.SOCK_DGRAM, (loopback, config["udp_port"])),
                 self._datagram),
            ]

    def load(self, steps: dict) -> None:
        """Run the rule and route steps of a sandbox whose network stack only it can reach
        (gVisor's sentry: ``capture.gvisor_steps``); the first that fails is raised."""
        env = {"PATH": "/usr/sbin:/usr/bin", "XTABLES_LOCKFILE": steps["lockfile"]}
        try:
            for step in steps["v4"] + (steps["v6"] if self.ipv6 else []):
                try:
                    done = subprocess.run(step["argv"], input=step.get("stdin"), text=True,
                                          capture_output=True, env=env, timeout=30, check=False)
                except subprocess.TimeoutExpired as exc:
                    raise OSError(f"{' '.join(step['argv'])} did not finish") from exc
                if done.returncode != 0:
                    raise OSError(f"{' '.join(step['argv'])} failed: "
                                  f"{done.stderr.strip()[-300:]}")
        finally:
            try:
                os.unlink(steps["lockfile"])
            except FileNotFoundError:
                pass

    def start(self) -> None:
        for sock, serve in self.sockets:
            if sock.type == socket.SOCK_STREAM:
                _accepting(sock, serve)
            else:
                threading.Thread(target=self._datagrams, args=(sock, serve), daemon=True).start()

    @staticmethod
    def _datagrams(sock: socket.socket, serve) -> None:
        while True:
            try:
                data, peer = sock.recvfrom(65536)
            except OSError:
                return
            threading.Thread(target=serve, args=(sock, data, peer), daemon=True).start()

    def _ask(self, upstream: socket.socket, query: bytes) -> bytes | None:
        upstream.sendall(len(query).to_bytes(2, "big") + query)
        head = _read_exact(upstream, 2)
        return _read_exact(upstream, int.from_bytes(head, "big")) if head else None

    def _dns_udp(self, sock: socket.socket, query: bytes, peer: tuple) -> None:
        try:
            upstream = self.dialer.open("d")
            if upstream is None:
                return
            with upstream:
                reply = self._ask(upstream, query)
            if reply is not None:
                sock.sendto(reply, peer)
        except OSError:
            pass

    def _dns_tcp(self, conn: socket.socket) -> None:
        try:
            upstream = self.dialer.open("d")
            if upstream is None:
                return
            with conn, upstream:
                while (head := _read_exact(conn, 2)) is not None:
                    query = _read_exact(conn, int.from_bytes(head, "big"))
                    reply = self._ask(upstream, query) if query is not None else None
                    if reply is None:
                        return
                    conn.sendall(len(reply).to_bytes(2, "big") + reply)
        except OSError:
            pass
        finally:
            conn.close()

    def _flow(self, conn: socket.socket) -> None:
        try:
            address, port = _original_destination(conn)
            upstream = self.dialer.open("t")
        except OSError:
            conn.close()
            return
        if upstream is None:
            conn.close()
            return
        with conn, upstream:
            try:
                upstream.sendall(f"tcp {address} {port}\n".encode())
            except OSError:
                return
            _splice(conn, upstream)

    def _datagram(self, sock: socket.socket, data: bytes, peer: tuple) -> None:
        destination = _udp_peer(peer[1])
        key = (peer[1], destination)
        if destination is None or key in self._told:
            return
        self._told.add(key)
        try:
            upstream = self.dialer.open("t")
            if upstream is not None:
                with upstream:
                    upstream.sendall(f"udp {destination[0]} {destination[1]}\n".encode())
        except OSError:
            pass


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


# The protocol, JSON lines. Helper -> harness: ``ready`` once, then per command ``out``
# chunks (base64), ``alive`` beats at least every ``heartbeat_s`` (silence means stopped or
# hung) and one ``exit``; ``killed`` for a ``kill_all``; ``error`` when a command could not
# be started as the session's uid (the harness ends the session). Harness -> helper:
# ``exec``, ``kill_all``, ``shutdown``; the channel is read while a command runs, so EOF (a
# harness gone) kills every process at once. A timeout kills every process created since the
# command started, not only its group.
class Helper(Supervisor):
    def __init__(self, channel: LinePipe, oom: tuple[int, bytes], *,
                 user: tuple[int, int] | None = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        super().__init__(channel, heartbeat_s=heartbeat_s)
        # This process's own oom_score_adj, opened before it became
        # non-dumpable (its /proc files then belong to root) and before
        # Landlock (which refuses the open), and the value to return to.
        self.oom_fd, self.oom_own = oom
        self.user = user

    def spawn(self, msg: dict) -> subprocess.Popen:
        # A child inherits the score at fork, so the helper wears it only
        # while it forks; raising needs no privilege, and returning to its
        # own value never goes below the minimum it inherited.
        os.pwrite(self.oom_fd, _COMMAND_OOM_SCORE, 0)
        try:
            return subprocess.Popen(
                msg["argv"], cwd=msg["cwd"] if self.user is None else None,
                env=dict(msg["env"]), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, close_fds=True, start_new_session=True,
                preexec_fn=None if self.user is None else _become(*self.user, msg["cwd"]),
            )
        finally:
            os.pwrite(self.oom_fd, self.oom_own, 0)


# Runs as ``python -I -S -c <program> <config json>``, the program being this module with
# the supervisor core shipped in it (on linux as byte code: ``bytecode.SHIPPED``): stdlib
# only, because inside the sandbox there is only the interpreter's own installation. The
# harness imports it too, to probe Landlock with the same code that applies it.
def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    fd_in, fd_out = config["channel_fds"]
    channel = LinePipe(fd_in, fd_out)
    report: dict = {"op": "ready", "ok": True, "pid": os.getpid()}
    # Python handles SIGINT; as a namespace's init the helper must handle no
    # signal at all, or a command could interrupt it: the kernel delivers to a
    # namespace's init only the signals it handles, so no command can stop or kill it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        for fd in {fd_in, fd_out}:
            os.set_inheritable(fd, False)
        oom_fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
        oom = (oom_fd, os.read(oom_fd, 16).strip())
        # Not dumpable: no command can open /proc/<helper>/fd, its memory or its environment.
        prctl(_PR_SET_DUMPABLE, 0)
        # A subreaper (or pid 1), so anything a command leaves behind (setsid, double fork)
        # is re-parented here and can be found and killed. On linux the helper is pid 1 of
        # the pid namespace (bwrap --as-pid-1: no init of bubblewrap's own runs inside,
        # whose memory a command of the same uid could otherwise write).
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _set_limits(config["limits"])
        ll = config["landlock"]
        if not ll["apply"]:
            report["landlock_abi"] = 0
            report["landlock_error"] = "omitted: the profile does not require it"
        else:
            try:
                # Landlock limits writes to the workspace, /tmp, the sandbox HOME and a few
                # devices; a required Landlock that cannot be applied refuses the start.
                report["landlock_abi"] = apply_landlock(ll["dirs"], ll["files"],
                                                        min_abi=ll["min_abi"])
            except LandlockError as exc:
                if ll["required"]:
                    raise
                report["landlock_abi"] = 0
                report["landlock_error"] = str(exc)
        relay = capture = None
        dial = None
        if config.get("dial_fd") is not None:
            dial = socket.socket(fileno=config["dial_fd"])
            os.set_inheritable(config["dial_fd"], False)
        endpoints = config.get("endpoints")
        if config.get("await_endpoints"):
            # Docker: where the sidecar listens is known only once it runs;
            # the harness says so first, on the channel, before anything else.
            message = channel.recv()
            if message is None or message.get("op") != "endpoints":
                raise OSError(f"expected the proxy's endpoints, got {message!r}")
            endpoints = message["endpoints"]
        dialer = _Dialer(dial, endpoints)
        if config["proxy_port"] is not None:
            relay = _Relay(config["proxy_port"], dialer)
        if config.get("capture") is not None:
            capture = _Capture(config["capture"], dialer)
            report["capture_ipv6"] = capture.ipv6
            if config["capture"].get("load") is not None:
                capture.load(config["capture"]["load"])
        # Last, once the capture rules' tools (netlink among them) have run,
        # and before the relay's threads start.
        # gvisor: runsc 20240729 answers every refusal of an OCI seccomp section with EPERM
        # (it drops errnoRet), so the harness hands over the linux backend's own filter as
        # BPF, and each refusal answers with the same errno as on linux.
        if config.get("seccomp_bpf") is not None:
            load_seccomp(base64.b64decode(config["seccomp_bpf"]))
    except (OSError, LandlockError) as exc:
        channel.send({"op": "ready", "ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "landlock": isinstance(exc, LandlockError)})
        return 1
    if relay is not None:
        relay.start()
    if capture is not None:
        capture.start()
    channel.send(report)
    user = config.get("user")
    Helper(channel, oom, user=(user["uid"], user["gid"]) if user else None,
           heartbeat_s=config.get("heartbeat_s", HEARTBEAT_S)).serve()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # Every process it started is dead and every message is written (os.write,
    # unbuffered): the interpreter's own teardown (its daemon threads, its
    # modules) would only hold the session's close up, by about 15 ms.
    os._exit(code)
