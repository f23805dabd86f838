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

The host sends this program over the channel at boot (``init.c``),
followed by one JSON line of configuration: this module with the supervisor
core (``supervisor``) shipped in it, stdlib only, because the guest has only
Debian's Python. The supervisor, and so the protocol, is the linux helper's:
JSON lines, output base64 in ``out`` messages, one ``exit`` per command.
"""

import base64
import ctypes
import fcntl
import os
import resource
import socket
import struct
import subprocess

from firstrun.sandbox.supervisor import (
    PR_SET_NO_NEW_PRIVS,
    LinePipe,
    Supervisor,
    libc,
    load_seccomp,
    prctl,
)

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_RB_POWER_OFF = 0x4321FEDC
_SIOCSIFADDR, _SIOCSIFNETMASK, _SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8916, 0x891C, 0x8913, 0x8914
_IFF_UP = 0x1
_PR_SET_DUMPABLE = 4


def _mount(source, target, fstype, flags, data=""):
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                   ctypes.c_ulong(flags), data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target}: {os.strerror(err)}")


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


class GuestAgent(Supervisor):
    # pid 1 of a whole kernel: its threads show in /proc, and are not ours to kill.
    own_kernel = True

    def __init__(self, channel, config):
        super().__init__(channel)
        self.config = config
        self.filter = base64.b64decode(config["seccomp"]) if config["seccomp"] else None

    def _confine(self):
        """In the child, after the uid change: no new privileges, seccomp, rlimits."""
        limits = self.config["limits"]
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["pids"], limits["pids"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            if self.filter is not None:
                load_seccomp(self.filter)
            else:
                prctl(PR_SET_NO_NEW_PRIVS, 1)
        except OSError:
            os._exit(125)

    def spawn(self, msg):
        return subprocess.Popen(
            msg["argv"], cwd=msg["cwd"], env=msg["env"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
            start_new_session=True, user=self.config["uid"], group=self.config["gid"],
            extra_groups=[], preexec_fn=self._confine)  # noqa: PLW1509 (no threads here)

    def settle(self):
        # The workspace is a 9p share: what commands wrote reaches the host now.
        os.sync()


def main(fd):
    channel = LinePipe(fd, fd)
    config = channel.recv()
    try:
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")
        setup(config)
    except OSError as exc:
        channel.send({"ok": False, "error": str(exc)})
    else:
        channel.send({"ok": True})
        GuestAgent(channel, config).serve()
    libc.reboot(_RB_POWER_OFF)


if __name__ == "firstrun_agent":
    main(CHANNEL_FD)  # noqa: F821 (given by init.c's bootstrap)
