"""The private directory of a session's proxy sockets, removed even when its harness was killed.

Guarantee: ``socket_directory`` makes a new 0700 ``firstrun-proxy-*``
directory in the temporary directory, its ``owner`` file naming its process,
and removes it however the block exits. Each new one first removes the
directories of this uid whose owner no longer runs, and no other.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from firstrun.errors import SandboxError
from firstrun.sandbox.ownership import alive, process_identity

PREFIX = "firstrun-proxy-"
OWNER = "owner"


# A harness killed outright (SIGKILL, the OOM killer) cannot remove its own. Only a real
# directory (never a symlink) of this uid's whose owner file names a process that is gone is
# removed; one whose owner cannot be read is left as it is.
def reap_socket_directories(parent: str | None = None) -> tuple[str, ...]:
    """Remove the socket directories in ``parent`` (the temporary directory) of dead owners."""
    parent = parent if parent is not None else tempfile.gettempdir()
    try:
        names = os.listdir(parent)
    except OSError:
        return ()
    reaped = []
    for name in names:
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            with open(os.path.join(path, OWNER), encoding="ascii") as f:
                owner = f.read().strip()
        except (OSError, UnicodeDecodeError):
            # Not ours, or its maker has not written its owner yet.
            continue
        if alive(owner):
            continue
        shutil.rmtree(path, ignore_errors=True)
        reaped.append(path)
    return tuple(reaped)


@contextmanager
def socket_directory(parent: str | None = None) -> Iterator[str]:
    """A new socket directory in ``parent`` (the temporary directory), this process's own."""
    identity = process_identity(os.getpid())
    if identity is None:
        raise SandboxError("cannot read this process's own /proc entry", who="proxy")
    reap_socket_directories(parent)
    with tempfile.TemporaryDirectory(prefix=PREFIX, dir=parent) as path:
        # Written aside and renamed into place: another harness's reaper must never read a
        # half-written owner (an empty one names no live process) and remove a live directory.
        staged = os.path.join(path, f".{OWNER}")
        with open(staged, "x", encoding="ascii") as f:
            f.write(identity + "\n")
        os.rename(staged, os.path.join(path, OWNER))
        yield path
