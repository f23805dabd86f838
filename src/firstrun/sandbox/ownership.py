"""Lending a workspace to a per-session uid, and giving it back.

Guarantee: when the harness is root, a session's commands run as a uid no
account and no live process holds. ``lend`` hands over only what belongs to
the workspace alone, and ``give_back`` returns every entry the lent uid owns
to the owner, with no setuid or setgid bit the sandbox set. A lend is leased
on disk before any owner changes, and ``recover`` gives back what a harness
killed by SIGKILL left lent, once its harness is gone.
"""

from __future__ import annotations

import json
import os
import posixpath
import pwd
import random
import re
import signal
import stat
import time
from collections.abc import Callable, Iterator

from firstrun.errors import SandboxError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")
# Root's alone. A lease names the workspace, the lent uid, the owner, the harness
# (PID:STARTTIME) and the stage directory; ``give_back`` removes it once everything is back.
# ``recover`` (which every lending backend calls before it starts a session) takes each
# lease whose harness is gone, kills every process still running as its uid, gives the
# workspace back, removes the stage directory, and drops the lease.
LEASE_DIR = "/run/firstrun/leases"


def process_identity(pid: int) -> str | None:
    """``PID:STARTTIME`` (clock ticks since boot), so a reused pid is not mistaken for ours."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return None
    fields = stat_line[stat_line.rindex(b")") + 2:].split()
    return f"{pid}:{int(fields[19])}"


def alive(identity: str) -> bool:
    """Whether the process ``process_identity`` named is still the one running."""
    pid, _, _ = identity.partition(":")
    return pid.isdigit() and process_identity(int(pid)) == identity


def _live_pids_of(uid: int) -> list[int]:
    """Host pids running as ``uid``, zombies excluded (they run nothing, and
    bubblewrap's namespace init may wait as one until the host's init reaps it)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                stat_line = f.read()
        except OSError:
            continue
        if stat_line[stat_line.rindex(b")") + 2:].split()[0] not in (b"Z", b"X"):
            pids.append(int(name))
    return pids


def kill_uid(uid: int) -> None:
    """SIGKILL every host process running as ``uid`` (unique to one session) until none."""
    while pids := _live_pids_of(uid):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _lease_path(uid: int) -> str:
    return os.path.join(LEASE_DIR, f"{uid}.json")


def _write_lease(top: str, uid: int, owner: tuple[int, int], stage_dir: str | None) -> None:
    os.makedirs(LEASE_DIR, mode=0o700, exist_ok=True)
    lease = {"workspace": top, "uid": uid, "owner": list(owner), "stage_dir": stage_dir,
             "harness": process_identity(os.getpid())}
    path = _lease_path(uid)
    partial = f"{path}.{os.getpid()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(lease, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def _drop_lease(uid: int) -> None:
    try:
        os.unlink(_lease_path(uid))
    except FileNotFoundError:
        pass


def recover(*, who: str) -> tuple[str, ...]:
    """Give back every workspace a dead harness left lent; the workspaces recovered.

    A lease that cannot be read is left for a person to look at, never
    guessed at: recovery changes owners only where a lease says so.
    """
    try:
        names = sorted(os.listdir(LEASE_DIR))
    except FileNotFoundError:
        return ()
    recovered = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(LEASE_DIR, name), encoding="utf-8") as f:
                lease = json.load(f)
            top, uid, owner = lease["workspace"], int(lease["uid"]), tuple(lease["owner"])
            harness, stage_dir = lease["harness"], lease.get("stage_dir")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(harness, str) and alive(harness):
            continue
        kill_uid(uid)
        try:
            if stage_dir and os.path.isdir(stage_dir):
                os.rmdir(stage_dir)
            if os.path.isdir(top):
                give_back(top, uid, (int(owner[0]), int(owner[1])))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SandboxError(f"cannot give back {top}, which a harness that died left lent to "
                               f"uid {uid}: {exc}", who=who) from exc
        _drop_lease(uid)
        recovered.append(top)
    return tuple(recovered)


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


def mount_points_beneath(top: str) -> frozenset[str]:
    """Every mount point strictly beneath ``top`` in this process's mount table."""
    prefix = top.rstrip("/") + "/"
    found = set()
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            # Field 5 is the mount point, with space, tab, newline and
            # backslash written as octal escapes.
            raw = _OCTAL_ESCAPE.sub(lambda m: bytes([int(m[1], 8)]), line.split()[4])
            point = os.fsdecode(raw)
            if point.startswith(prefix):
                found.add(point)
    return frozenset(found)


# Neither walk recurses on the Python stack nor holds more than one directory open, so no
# depth the sandbox can build stops one half way.
def _walk(top: str, descend: Callable[[str, os.stat_result], bool]
          ) -> Iterator[tuple[int, str, str, os.stat_result]]:
    """``(dir_fd, name, path, lstat)`` for every entry beneath ``top``, parents before children.

    Never follows a symlink; enters a directory only where ``descend(path,
    lstat)`` says so. The place in each directory is kept on a list and the
    walk goes back up through ``..``, checking it lands where it came from,
    so depth costs neither stack nor file descriptors.
    """
    fd = os.open(top, _DIR_FLAGS)
    try:
        here = os.fstat(fd)
        stack = [((here.st_dev, here.st_ino), iter(os.listdir(fd)), top)]
        while stack:
            _, names, path = stack[-1]
            for name in names:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                child = posixpath.join(path, name)
                yield fd, name, child, st
                if stat.S_ISDIR(st.st_mode) and descend(child, st):
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    entered = os.fstat(sub)
                    if (entered.st_dev, entered.st_ino) != (st.st_dev, st.st_ino):
                        os.close(sub)
                        raise OSError(f"{child} changed while walking the workspace")
                    os.close(fd)
                    fd = sub
                    stack.append(((st.st_dev, st.st_ino), iter(os.listdir(fd)), child))
                    break
            else:
                stack.pop()
                if stack:
                    up = os.open("..", _DIR_FLAGS, dir_fd=fd)
                    arrived = os.fstat(up)
                    if (arrived.st_dev, arrived.st_ino) != stack[-1][0]:
                        os.close(up)
                        raise OSError(f"{stack[-1][2]} changed while walking the workspace")
                    os.close(fd)
                    fd = up
    finally:
        os.close(fd)


def _privileged(st: os.stat_result) -> bool:
    """A file whose setuid or setgid bit a change of owner would strip."""
    if stat.S_ISDIR(st.st_mode):
        return False
    return bool(st.st_mode & stat.S_ISUID) or \
        st.st_mode & (stat.S_ISGID | stat.S_IXGRP) == stat.S_ISGID | stat.S_IXGRP


def lend(top: str, uid: int, *, who: str, stage_dir: str | None = None) -> None:
    """Give ``uid`` the entries of the workspace ``top`` that belong to it alone.

    ``top`` is a resolved path; its owner's entries on its own mount change
    owner (not group), except files with a hard link outside ``top`` and
    setuid or setgid files, which stay as they are. All or nothing: an entry
    that cannot change owner (immutable, on a filesystem that refuses) gives
    back what was lent so far and raises a ``SandboxError`` naming it. The
    lease (with ``stage_dir``, the session's directory to remove should the
    harness die) is on disk before the first owner changes.
    """
    top = os.path.realpath(top)
    top_st = os.lstat(top)
    at = [top]
    try:
        _write_lease(top, uid, (top_st.st_uid, top_st.st_gid), stage_dir)
    except OSError as exc:
        raise SandboxError(f"cannot record the lease of the workspace in {LEASE_DIR}: "
                           f"{exc.strerror or exc}", who=who) from exc
    try:
        _lend(top, top_st, uid, at)
    except OSError as exc:
        undone = ""
        try:
            give_back(top, uid, (top_st.st_uid, top_st.st_gid))
        except OSError as back:
            undone = f"; giving back what was lent failed too: {back}"
        raise SandboxError(f"cannot lend the workspace to the sandbox uid: {at[0]}: "
                           f"{exc.strerror or exc}{undone}", who=who) from exc


# What belongs to the workspace alone: an entry its owner owns (another user's file stays
# theirs), on the workspace's own mount (never across a mount point, a bind mount of the
# same filesystem included), never through a symlink, never a file with a hard link outside
# the workspace (a git object or package-store file shared with a tree elsewhere: writing it
# would write there), never a setuid or setgid file (the change of owner would strip the
# bit). A lent entry keeps its group.
def _lend(top: str, top_st: os.stat_result, uid: int, at: list[str]) -> None:
    """``lend``'s walk; ``at[0]`` names the entry it is at, for the error."""
    owner = top_st.st_uid
    mounts = mount_points_beneath(top)

    def own_mount(path: str, st: os.stat_result) -> bool:
        return st.st_dev == top_st.st_dev and path not in mounts

    # A file's links are all inside when the walk meets every one of them.
    seen: dict[tuple[int, int], int] = {}
    for _, _, _, st in _walk(top, own_mount):
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            seen[key] = seen.get(key, 0) + 1

    def lendable(path: str, st: os.stat_result) -> bool:
        if st.st_uid != owner or not own_mount(path, st) or _privileged(st):
            return False
        return stat.S_ISDIR(st.st_mode) or st.st_nlink <= seen.get((st.st_dev, st.st_ino), 1)

    os.chown(top, uid, -1, follow_symlinks=False)
    for dir_fd, name, path, st in _walk(top, own_mount):
        at[0] = path
        if lendable(path, st):
            os.chown(name, uid, -1, dir_fd=dir_fd, follow_symlinks=False)


def _chmod_entry(name: str, dir_fd: int | None, st: os.stat_result, mode: int) -> None:
    """chmod the very inode ``st`` describes, never what a symlink swapped in for it names.

    A container that outlived its removal could still swap the entry for a
    symlink to a host file between the walk's lstat and the chmod; the entry
    is pinned by an O_PATH descriptor and changed through it instead.
    """
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        pinned = os.fstat(fd)
        if stat.S_ISLNK(pinned.st_mode) or \
                (pinned.st_dev, pinned.st_ino) != (st.st_dev, st.st_ino):
            raise OSError(f"{name} changed while giving the workspace back")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def give_back(top: str, lent: int, owner: tuple[int, int]) -> None:
    """Return every entry beneath ``top`` (and ``top``) that ``lent`` owns to ``owner``.

    ``lent`` is the uid and, by the same number, the group the session ran
    as; an entry in that group goes to the owner's group, and loses a setgid
    bit the sandbox set on it.
    """
    def back(name: str, st: os.stat_result, dir_fd: int | None) -> None:
        if st.st_uid != lent:
            return
        os.chown(name, owner[0], owner[1] if st.st_gid == lent else -1,
                 dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return
        strip = stat.S_ISUID | (stat.S_ISGID if st.st_gid == lent else 0)
        if st.st_mode & strip:
            _chmod_entry(name, dir_fd, st, stat.S_IMODE(st.st_mode) & ~strip)

    back(top, os.lstat(top), None)
    for dir_fd, name, _, st in _walk(top, lambda path, st: True):
        back(name, st, dir_fd)
    _drop_lease(lent)
