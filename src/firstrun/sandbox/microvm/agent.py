"""The guest agent: pid 1 of the micro-VM, and the parent of every command.

Guarantee: before it answers "ready", the guest's root is read-only, only the
workspace, /tmp and HOME are writable, the real homes are empty, and the
network is at most one on-link address, with no route or resolver. Every
command runs as the session's unprivileged uid with no_new_privs, linux's
seccomp filter and rlimits, and cannot signal, trace or read the agent; a
timeout, ``kill_all`` or ``shutdown`` leaves no command process behind.
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


# The host sends this program over the channel at boot (``init.c``), then one JSON line of
# configuration: this module with the supervisor core shipped in it, stdlib only, because
# the guest has only Debian's Python. The supervisor, and so the protocol (JSON lines,
# output base64 in ``out`` messages, one ``exit`` per command, an ``alive`` beat while a
# command runs, a ``shutdown`` or EOF abandoning it at once), is the linux helper's.
# As pid 1, every orphan comes back here, so nothing escapes a kill sweep.
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
        # Root and not dumpable, while commands run under another uid: none can signal it,
        # trace it or open anything under /proc/1, and its channel's device node is root's
        # alone.
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
