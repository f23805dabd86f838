"""Holding a workspace's protected entries: placeholders for the absent ones, and their removal.

Guarantee: ``place`` makes every entry of ``FilesystemPolicy.protected`` exist
before a backend binds it read-only (an absent one as an empty placeholder), so
a command can neither write nor create it. ``remove`` takes away exactly this
harness's placeholders while still empty; an entry the owner made is never
touched, and nothing here acts outside the workspace.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from firstrun.errors import SandboxError
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.sandbox.ownership import alive, process_identity

# Each placeholder carries this xattr naming its harness (PID:STARTTIME); ``place`` first
# removes the empty placeholders of a harness that is gone (one killed by SIGKILL never
# removed its own).
MARKER = "user.firstrun.placeholder"
# Every path is reached through the workspace's directory descriptor without following a
# symlink.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Placeholder:
    name: str
    device: int
    inode: int


def describe(fs: FilesystemPolicy) -> str:
    """The clause a session's layer detail carries: what is held, and what the user lifted."""
    held = f"; workspace entries held read-only: {', '.join(n for n, _ in fs.protected)}" \
        if fs.protected else ""
    return held + (f"; lifted by the user: {', '.join(fs.lifted)}" if fs.lifted else "")


def entry_kind(workspace: str, name: str) -> str | None:
    """What ``workspace/name`` is, for ``workspace_protection``: file, dir, symlink, other or None."""
    try:
        st = os.lstat(os.path.join(workspace, name))
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def _marker(name: str, top: int) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=top)
    except OSError:
        return None
    try:
        return os.getxattr(fd, MARKER).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _empty(name: str, st: os.stat_result, top: int) -> bool:
    if stat.S_ISREG(st.st_mode):
        return st.st_size == 0
    if not stat.S_ISDIR(st.st_mode):
        return False
    fd = os.open(name, _DIR_FLAGS, dir_fd=top)
    try:
        return not os.listdir(fd)
    finally:
        os.close(fd)


def _take_away(name: str, st: os.stat_result, top: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        os.rmdir(name, dir_fd=top)
    else:
        os.unlink(name, dir_fd=top)


def _sweep_abandoned(name: str, top: int) -> None:
    """Remove ``name`` if it is an empty placeholder whose harness is gone."""
    marker = _marker(name, top)
    if marker is None or alive(marker):
        return
    st = os.stat(name, dir_fd=top, follow_symlinks=False)
    if _empty(name, st, top):
        _take_away(name, st, top)


def place(fs: FilesystemPolicy, *, who: str) -> tuple[Placeholder, ...]:
    """Make every protected entry exist; return the placeholders made, for ``remove``."""
    if not fs.protected:
        return ()
    identity = process_identity(os.getpid()) or str(os.getpid())
    top = os.open(fs.workspace, _DIR_FLAGS)
    made: list[Placeholder] = []
    try:
        owner = os.fstat(top)
        for name, kind in fs.protected:
            try:
                _sweep_abandoned(name, top)
                st = os.stat(name, dir_fd=top, follow_symlinks=False)
            except FileNotFoundError:
                made.append(_make(name, kind, top, owner, identity))
                continue
            if stat.S_ISLNK(st.st_mode):
                # Made after the policy was decided: binding it would bind its target.
                raise SandboxError(f"the workspace's {name} became a symlink before the start; "
                                   "it cannot be held read-only", who=who)
    except BaseException:
        remove(fs.workspace, tuple(made))
        raise
    finally:
        os.close(top)
    return tuple(made)


# A bind needs something to land on: an empty placeholder of the entry's kind, owned by the
# workspace's owner.
def _make(name: str, kind: str, top: int, owner: os.stat_result, identity: str) -> Placeholder:
    if kind == "dir":
        os.mkdir(name, 0o755, dir_fd=top)
        fd = os.open(name, _DIR_FLAGS, dir_fd=top)
    else:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=top)
    try:
        if os.geteuid() == 0:
            os.fchown(fd, owner.st_uid, owner.st_gid)
        try:
            os.setxattr(fd, MARKER, identity.encode("ascii"))
        except OSError as exc:
            # A filesystem without user xattrs still gets its placeholder; only
            # the sweep after a SIGKILLed harness cannot recognise it there.
            if exc.errno not in (errno.ENOTSUP, errno.EPERM):
                raise
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return Placeholder(name=name, device=st.st_dev, inode=st.st_ino)


def remove(workspace: str, placeholders: tuple[Placeholder, ...]) -> None:
    """Take away each placeholder that is still the one made and still empty."""
    if not placeholders:
        return
    try:
        top = os.open(workspace, _DIR_FLAGS)
    except OSError:
        return
    try:
        for placeholder in placeholders:
            try:
                st = os.stat(placeholder.name, dir_fd=top, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == (placeholder.device, placeholder.inode) and _empty(
                        placeholder.name, st, top):
                    _take_away(placeholder.name, st, top)
            except OSError:
                continue
    finally:
        os.close(top)
