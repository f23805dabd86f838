"""The guest agent: pid 1 of the micro-VM, and the parent of every command.

Guarantee: before it answers "ready", the agent has built the guest's whole
view: the root stays read-only (9p, mounted read-only by init); writable are
only the workspace (9p), a tmpfs /tmp and a tmpfs HOME; the real homes'
paths are empty tmpfs; the network has one interface with one on-link
address and no route beyond it, and no resolver. Every command runs as the
session's unprivileged uid, in its own session, with no_new_privs, the
linux backend's seccomp filter and rlimits; on timeout, the command's
process group and everything started since it began is killed (as pid 1,
every orphan comes back here, so nothing escapes the sweep). ``kill_all``
kills everything but the agent and says how many it killed. ``shutdown``
kills everything but the agent, flushes the workspace and powers off. The
agent is root and not dumpable, and commands run under another uid, so no
command can signal it, trace it or open anything under ``/proc/1``; its
channel's device node is root's alone. While a command runs the agent beats
(``alive``) every second and watches its channel: a ``shutdown`` or EOF then
abandons the command at once.

The host sends this source over the channel at boot (``init.c``), followed
by one JSON line of configuration; stdlib only, because the guest has only
Debian's Python. The protocol is the linux helper's: JSON lines, output
base64 in ``out`` messages, one ``exit`` per command.
"""

import base64
import ctypes
import errno
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import time

_LIBC = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RB_POWER_OFF = 0x4321FEDC
_SIOCSIFADDR, _SIOCSIFNETMASK, _SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8916, 0x891C, 0x8913, 0x8914
_IFF_UP = 0x1
_IDLE_S = 0.05
_DRAIN_S = 1.0
_HEARTBEAT_S = 1.0
_PR_SET_DUMPABLE = 4


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _mount(source, target, fstype, flags, data=""):
    if _LIBC.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                   ctypes.c_ulong(flags), data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target}: {os.strerror(err)}")


class Stop(Exception):
    """A ``shutdown`` arrived, or the channel closed, while a command ran."""


class Channel:
    def __init__(self, fd):
        self.fd = fd
        self.buf = b""
        self.queue = []

    def send(self, msg):
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        while data:
            data = data[os.write(self.fd, data):]

    def _split(self):
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self.queue.append(json.loads(line))

    def pending(self):
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            raise Stop()
        self.buf += chunk
        self._split()
        if any(msg.get("op") == "shutdown" for msg in self.queue):
            raise Stop()

    def recv(self):
        while not self.queue:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
            self._split()
        return self.queue.pop(0)


def _ifreq(name, payload=b""):
    return struct.pack("16s", name.encode()) + payload.ljust(24, b"\0")


def _sockaddr_in(address):
    return struct.pack("=HH4s", socket.AF_INET, 0, socket.inet_aton(address))


def _interface_up(sock, name, address=None, netmask=None):
    if address is not None:
        fcntl.ioctl(sock, _SIOCSIFADDR, _ifreq(name, _sockaddr_in(address)))
        fcntl.ioctl(sock, _SIOCSIFNETMASK, _ifreq(name, _sockaddr_in(netmask)))
    flags = struct.unpack_from("H", fcntl.ioctl(sock, _SIOCGIFFLAGS, _ifreq(name)), 16)[0]
    fcntl.ioctl(sock, _SIOCSIFFLAGS, _ifreq(name, struct.pack("H", flags | _IFF_UP)))


def setup(config):
    """Mount the guest's writable places and bring the network up; raises on any failure."""
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _mount("sysfs", "/sys", "sysfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)
    uid, gid = config["uid"], config["gid"]
    size = f"size={config['tmpfs_bytes']}"
    _mount("tmpfs", "/run", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=0755,size=16m")
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,{size}")
    for home in config["real_homes"]:
        if os.path.isdir(home):
            _mount("tmpfs", home, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY,
                   "mode=0755,size=4k")
    sandbox_home = config["home"]
    parent = os.path.dirname(sandbox_home)
    _mount("tmpfs", parent, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0755,{size}")
    os.mkdir(sandbox_home, 0o700)
    os.chown(sandbox_home, uid, gid)
    _mount("workspace", config["workspace"], "9p", _MS_NOSUID | _MS_NODEV,
           "trans=virtio,version=9p2000.L,msize=262144,cache=mmap")
    # Each a read-only mount point over the share: unwritable, and neither
    # removable nor renamable by a command (EBUSY), so it cannot be swapped.
    for name in config.get("protected", ()):
        entry = os.path.join(config["workspace"], name)
        _mount(entry, entry, None, _MS_BIND)
        _mount("none", entry, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    # Nothing the commands write lands beside the CA bundle or in /run.
    if config["ca_bundle"]:
        os.makedirs("/run/firstrun", mode=0o755)
        with open("/run/firstrun/ca.crt", "wb") as f:
            f.write(base64.b64decode(config["ca_bundle"]))
        _mount("/run/firstrun/ca.crt", config["ca_path"], None, _MS_BIND)
        _mount("none", config["ca_path"], None,
               _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _mount("none", "/run", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _interface_up(sock, "lo")
        net = config["net"]
        if net is not None:
            _interface_up(sock, net["interface"], net["address"], net["netmask"])
    socket.sethostname("firstrun")


def _processes():
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        # Kernel threads (flags PF_KTHREAD, or parent kthreadd) are not ours to kill.
        if int(fields[6]) & 0x00200000 or fields[1] == b"2" or name == "2":
            continue
        found.append((int(name), int(fields[19]), fields[0].decode()))
    return found


def _reap(keep):
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        os.waitpid(info.si_pid, 0)


def _kill_since(existing, keep):
    """SIGKILL every live process not in ``existing`` until none remain (orphans come here);
    how many were killed."""
    killed = set()
    while True:
        victims = [(pid, start) for pid, start, state in _processes()
                   if pid != 1 and (pid, start) not in existing and state not in ("Z", "X")]
        if not victims:
            return len(killed)
        for pid, start in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add((pid, start))
            except ProcessLookupError:
                pass
        _reap(keep)
        time.sleep(0.001)


def _exit_code(returncode):
    return 128 - returncode if returncode < 0 else returncode


class Agent:
    def __init__(self, channel, config):
        self.channel = channel
        self.config = config
        self.filter = base64.b64decode(config["seccomp"]) if config["seccomp"] else None

    def _confine(self):
        """In the child, after the uid change: no new privileges, seccomp, rlimits."""
        limits = self.config["limits"]
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["pids"], limits["pids"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            os._exit(125)
        if self.filter is not None:
            buf = ctypes.create_string_buffer(self.filter, len(self.filter))
            prog = _SockFprog(len(self.filter) // 8, ctypes.addressof(buf))
            if _LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
                os._exit(125)

    def serve(self):
        try:
            while True:
                msg = self.channel.recv()
                if msg is None or msg["op"] == "shutdown":
                    break
                if msg["op"] == "exec":
                    self.run(msg)
                elif msg["op"] == "kill_all":
                    killed = _kill_since(set(), None)
                    _reap(None)
                    self.channel.send({"op": "killed", "id": msg["id"], "count": killed})
        except Stop:
            pass
        self.shutdown()

    def shutdown(self):
        _kill_since(set(), None)
        _reap(None)
        os.sync()
        try:
            self.channel.send({"op": "closed"})
        except OSError:
            pass

    def run(self, msg):
        cmd_id = msg["id"]
        existing = {(pid, start) for pid, start, _ in _processes()}
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                msg["argv"], cwd=msg["cwd"], env=msg["env"], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                start_new_session=True, user=self.config["uid"], group=self.config["gid"],
                extra_groups=[], preexec_fn=self._confine)  # noqa: PLW1509 (no threads here)
        except OSError as exc:
            self.channel.send({"op": "out", "id": cmd_id, "stream": "stderr",
                               "data": base64.b64encode(f"{exc}\n".encode()).decode()})
            self.channel.send({"op": "exit", "id": cmd_id,
                               "code": 126 if exc.errno == errno.EACCES else 127,
                               "timed_out": False, "duration_s": time.monotonic() - started})
            return
        timeout = msg["timeout"]
        try:
            timed_out = self._pump(cmd_id, proc, None if timeout is None else started + timeout)
        except Stop:
            _kill_since(existing, proc.pid)
            proc.wait()
            raise
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _kill_since(existing, proc.pid)
        code = proc.wait()
        _reap(None)
        self.channel.send({"op": "exit", "id": cmd_id, "code": _exit_code(code),
                           "timed_out": timed_out, "duration_s": time.monotonic() - started})

    def _pump(self, cmd_id, proc, deadline):
        """Stream output until the command exits and its pipes drain; True on timeout.

        As in the linux helper: once the command is gone, a background
        process holding its pipes is drained for at most ``_DRAIN_S``.
        """
        sel = selectors.DefaultSelector()
        streams = {proc.stdout: "stdout", proc.stderr: "stderr"}
        for pipe in streams:
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ)
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
        sel.register(self.channel.fd, selectors.EVENT_READ)
        exited = False
        drain_end = quiet_end = None
        beat = time.monotonic() + _HEARTBEAT_S
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
                    beat = now + _HEARTBEAT_S
                ends = [beat] + [t for t in (deadline, quiet_end) if t is not None]
                for key, _ in sel.select(max(0.0, min(ends) - now)):
                    if key.fileobj == self.channel.fd:
                        self.channel.pending()
                        continue
                    if exited:
                        quiet_end = time.monotonic() + _IDLE_S
                    if key.fileobj == pidfd:
                        exited = True
                        drain_end = time.monotonic() + _DRAIN_S
                        quiet_end = time.monotonic() + _IDLE_S
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


def main(fd):
    channel = Channel(fd)
    config = channel.recv()
    try:
        if _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")
        setup(config)
    except OSError as exc:
        channel.send({"ok": False, "error": str(exc)})
    else:
        channel.send({"ok": True})
        Agent(channel, config).serve()
    _LIBC.reboot(_RB_POWER_OFF)


if __name__ == "firstrun_agent":
    main(CHANNEL_FD)  # noqa: F821 (given by init.c's bootstrap)
