"""Launcher: join the session cgroup, stage bind sources, drop to the sandbox uid, exec bubblewrap.

Guarantee: bubblewrap starts inside the session cgroup, charged to its caps
from its first instruction, and never runs if joining fails. It never runs as
root: a root harness's launch drops every supplementary group and every uid
and gid to the sandbox's first, after binding the sources that uid cannot walk
to in a private mount namespace, invisible on the host.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

from firstrun.sandbox.linux.spec import Launch

_CLONE_NEWNS = 0x00020000
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.unshare.argtypes = [ctypes.c_int]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


# Runs in the harness's own child between fork and exec rather than as an interpreter of its
# own, which cost every session's start about 30 ms. Other harness threads (the proxy's) may
# hold locks at the fork, so the child imports nothing: everything it calls is bound here,
# beforehand.
def preexec(launch: Launch) -> Callable[[], None]:
    """The launch, as ``subprocess.Popen``'s ``preexec_fn`` for bubblewrap's argv."""
    procs = [p.encode() for p in launch.cgroup_procs]
    stage = [(source.encode(), staged.encode(), directory)
             for source, staged, directory in launch.stage]
    stage_dir = launch.stage_dir.encode() if launch.stage_dir is not None else None
    uid = launch.uid

    def run() -> None:
        try:
            pid = str(os.getpid()).encode()
            # The pid goes into every cgroup.procs file before anything else, so bubblewrap
            # and all under it are charged to the session's memory and pids caps.
            for path in procs:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)
            if uid is not None:
                _stage_and_drop(uid, stage_dir, stage)
        except OSError as exc:
            # Written on the session's stderr file; raising makes subprocess report the
            # failure, and bubblewrap never runs.
            os.write(2, f"firstrun launcher: {exc}\n".encode())
            raise

    return run


def _stage_and_drop(uid: int, stage_dir: bytes | None,
                    stage: list[tuple[bytes, bytes, bool]]) -> None:
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Private first, so nothing below propagates back to the host.
    _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    # Bind sources the sandbox uid could not walk to (``/root`` is 0700) under a fresh tmpfs
    # at the stage directory; the private mount namespace keeps the host's stage directory
    # empty.
    if stage_dir is not None:
        _check(_libc.mount(b"tmpfs", stage_dir, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755"),
               "mount stage tmpfs")
    for source, staged, directory in stage:
        if directory:
            os.mkdir(staged, 0o755)
        else:
            os.close(os.open(staged, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _check(_libc.mount(source, staged, None, _MS_BIND | _MS_REC, None),
               f"bind {source.decode(errors='replace')}")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise OSError("could not drop root")
