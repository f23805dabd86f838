"""Lending a workspace to a per-session uid, and giving it back.

Guarantee: when the harness is root, a session's commands run as a uid that
no account and no live process holds, so nothing the sandbox does can act
as anyone else on the host. The workspace is handed to that uid for the
session and handed back afterwards without ever following a symlink or
leaving the workspace's filesystem, and on the way back only entries the
lent uid owns change owner, so a file the agent planted elsewhere (a
hard link to a host file, a mount) is never touched.
"""

from __future__ import annotations

import os
import pwd
import random

from firstrun.errors import SandboxError


def uid_in_use(uid: int) -> bool:
    """Whether any live process runs as ``uid`` (a lent uid must be unused)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                return True
        except OSError:
            continue
    return False


def pick_uid(uid_range: tuple[int, int], *, who: str) -> int:
    """A random uid in ``uid_range`` that no account names and no process runs as."""
    rng = random.SystemRandom()
    for _ in range(64):
        uid = rng.randrange(*uid_range)
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        if not uid_in_use(uid):
            return uid
    raise SandboxError("no free sandbox uid", who=who)


def chown_tree(top: str, uid: int, gid: int, *, only_owner: int | None) -> None:
    """lchown every entry under ``top`` without following symlinks or leaving its filesystem.

    ``only_owner`` restricts the change to entries owned by that uid (used
    when giving the workspace back, so nothing foreign is touched).
    """
    top_dev = os.lstat(top).st_dev

    def change(name: str, dir_fd: int | None) -> None:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if st.st_dev != top_dev or (only_owner is not None and st.st_uid != only_owner):
            return
        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)

    change(top, None)
    for _, dirs, files, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in dirs + files:
            change(name, dir_fd)
