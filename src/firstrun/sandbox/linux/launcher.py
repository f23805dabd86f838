"""Launcher: join the session cgroup, stage bind sources, drop to the sandbox uid, exec bubblewrap.

Guarantee: bubblewrap starts inside the session cgroup, so it and
everything under it are charged to the session's memory and pids caps from
their first instruction: this process writes its own pid into each
``cgroup_procs`` file before anything else, and exits without running
bubblewrap if any write fails. That holds on both paths; the rest is for a
root harness only.

Bubblewrap never runs as root. When the harness is root, this
process (started as root, replaced by bubblewrap via exec) first enters a
private mount namespace, binds each source the sandbox uid could not walk to
(``/root`` is 0700) under a fresh tmpfs at the stage directory, then drops
every supplementary group and sets real, effective and saved uid and gid to
the sandbox's before it execs bubblewrap. The staging is invisible on the
host: the stage directory stays empty there.

Runs as ``python -I -S -c <this source> <config json>``: stdlib only.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

_CLONE_NEWNS = 0x00020000
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    for procs in cfg["cgroup_procs"]:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    if "uid" in cfg:
        _stage_and_drop(cfg)
    os.execve(cfg["argv"][0], cfg["argv"], {})
    return 1


def _stage_and_drop(cfg: dict) -> None:
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Private first, so nothing below propagates back to the host.
    _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    stage = cfg["stage_dir"].encode()
    _check(_libc.mount(b"tmpfs", stage, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755"),
           "mount stage tmpfs")
    for source, staged, directory in cfg["stage"]:
        if directory:
            os.mkdir(staged, 0o755)
        else:
            os.close(os.open(staged, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _check(_libc.mount(source.encode(), staged.encode(), None, _MS_BIND | _MS_REC, None),
               f"bind {source}")
    os.setgroups([])
    os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    if os.getuid() == 0 or os.geteuid() == 0:
        raise OSError("could not drop root")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
