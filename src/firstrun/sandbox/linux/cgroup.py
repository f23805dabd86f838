"""Session cgroups: one per linux session, capping memory and pids for everything in it.

Guarantee: a ``SessionCgroup`` is a fresh child of the harness's *own* cgroup,
its caps written before any process joins: memory (anonymous, shared and tmpfs
pages; swap too where accounted, per ``swap_capped``) and pids.
``kill_and_remove`` leaves no process and no directory behind;
``reap_leftovers`` removes only cgroups whose harness is gone. Where no cgroup
can be used, a ``NoCgroup`` says why.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import secrets
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from firstrun.errors import SandboxError

PREFIX = "firstrun-"
# firstrun-<owner pid>-<owner start time in clock ticks>-<random>
# Directories are labelled with the owning harness's pid and start time, so a leftover from
# a SIGKILLed harness can be told from a live owner's, which is never touched.
_NAME = re.compile(r"^firstrun-(\d+)-(\d+)-[0-9a-f]+$")
# Bounds a broken kernel only: members die within milliseconds of SIGKILL.
_KILL_DEADLINE_S = 30.0
_CONTROLLERS = ("memory", "pids")


class CgroupVersion(StrEnum):
    V1 = "cgroup-v1"
    V2 = "cgroup-v2"


@dataclass(frozen=True, kw_only=True)
class CgroupMount:
    """One cgroup filesystem mount, from /proc/self/mountinfo."""

    root: str
    mount_point: str
    version: CgroupVersion
    controllers: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class CgroupParent:
    """The harness's own cgroup directories, under which session cgroups are made.

    ``memory`` and ``pids`` are the same directory on v2.
    """

    version: CgroupVersion
    memory: str
    pids: str

    @property
    def directories(self) -> tuple[str, ...]:
        return (self.memory,) if self.memory == self.pids else (self.memory, self.pids)


@dataclass(frozen=True, kw_only=True)
class NoCgroup:
    """Why no session cgroup can be made on this machine, and what would fix it."""

    reason: str
    fix: str


_V2_FIX = ("run the harness in a delegated cgroup v2 subtree whose own cgroup holds no process "
           "(e.g. systemd-run --user --scope -p Delegate=yes, with the harness in a leaf child), "
           "or run it as root")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


# Discovery (this, ``parse_mountinfo``, ``locate``) is pure; everything else works on
# directories passed in, so it runs as well against a temporary tree that mimics
# /sys/fs/cgroup as against the kernel's.
def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller name to cgroup path, from /proc/<pid>/cgroup; v2's entry is under ``""``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if parts[0] == "0" and controllers == "":
            paths[""] = path
            continue
        for name in controllers.split(","):
            if name:
                paths[name] = path
    return paths


def parse_mountinfo(text: str) -> tuple[CgroupMount, ...]:
    """Every cgroup and cgroup2 mount listed in /proc/<pid>/mountinfo."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        tail = right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2]
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            mounts.append(CgroupMount(root=root, mount_point=point, version=CgroupVersion.V2))
        elif fstype == "cgroup":
            mounts.append(CgroupMount(root=root, mount_point=point, version=CgroupVersion.V1,
                                      controllers=frozenset(options.split(","))))
    return tuple(mounts)


def _inside(mount: CgroupMount, path: str) -> str | None:
    """The directory of cgroup ``path`` under ``mount``, if the mount shows it."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    relative = path[len(root):].strip("/")
    return posixpath.join(mount.mount_point, relative) if relative else mount.mount_point


def locate(proc_cgroup: str, mountinfo: str) -> CgroupParent | NoCgroup:
    """Where this process's own memory and pids cgroups are, from its two /proc files.

    Pure. v1 wins when both controllers are bound to v1 hierarchies (a
    controller bound there is absent from v2); v2 is chosen when neither is.
    Whether v2's controllers can be used is for ``prepare`` to find out.
    """
    paths = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    v1: dict[str, str] = {}
    for name in _CONTROLLERS:
        if name not in paths:
            continue
        for mount in mounts:
            if mount.version is CgroupVersion.V1 and name in mount.controllers:
                found = _inside(mount, paths[name])
                if found is not None:
                    v1[name] = found
                    break
    if len(v1) == 2:
        return CgroupParent(version=CgroupVersion.V1, memory=v1["memory"], pids=v1["pids"])
    if v1:
        return NoCgroup(reason="the memory and pids controllers are split between cgroup v1 "
                               "and v2", fix="mount both controllers in the same cgroup version")
    if "" in paths:
        for mount in mounts:
            if mount.version is CgroupVersion.V2:
                found = _inside(mount, paths[""])
                if found is not None:
                    return CgroupParent(version=CgroupVersion.V2, memory=found, pids=found)
    return NoCgroup(reason="no memory and pids cgroup of this process is mounted",
                    fix="mount cgroup2 at /sys/fs/cgroup (or the v1 memory and pids hierarchies)")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    # One write(2) per value: cgroup files take a whole value per write.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


# Two layouts. cgroup v1 (alone or hybrid): the memory and pids hierarchies each get a
# child. cgroup v2: one child, which needs memory and pids in the harness cgroup's
# cgroup.subtree_control; they are enabled only when the no-internal-process rule allows it
# (the harness's cgroup holds no process, as in a delegated subtree whose supervisor sits in
# a leaf). Otherwise the caller records that only rlimits apply.
def _v2_state(parent: CgroupParent) -> tuple[list[str], NoCgroup | None]:
    """The controllers still to enable for the parent's children, or why they cannot be."""
    try:
        available = set(_read(os.path.join(parent.memory, "cgroup.controllers")).split())
        enabled = set(_read(os.path.join(parent.memory, "cgroup.subtree_control")).split())
    except OSError as exc:
        return [], NoCgroup(reason=f"cannot read {parent.memory}: {exc.strerror}", fix=_V2_FIX)
    missing = [c for c in _CONTROLLERS if c not in available]
    if missing:
        return [], NoCgroup(reason=f"controllers {', '.join(missing)} are not delegated to "
                                   f"{parent.memory}", fix=_V2_FIX)
    return [c for c in _CONTROLLERS if c not in enabled], None


def assess(parent: CgroupParent) -> CgroupParent | NoCgroup:
    """Whether session cgroups can be made under ``parent``, judged without changing anything.

    What ``doctor`` shows: the permissions and the kernel's own state
    (delegated controllers, processes in the parent) that ``prepare`` and
    ``create`` would run into.
    """
    for directory in parent.directories:
        if not os.access(directory, os.W_OK):
            return NoCgroup(reason=f"{directory} is not writable by uid {os.geteuid()}",
                            fix="run the harness as root" if parent.version is CgroupVersion.V1
                            else _V2_FIX)
    if parent.version is CgroupVersion.V1:
        return parent
    wanted, refusal = _v2_state(parent)
    if refusal is not None:
        return refusal
    if wanted and _members(parent.memory):
        return NoCgroup(reason=f"{', '.join(wanted)} not enabled for the children of "
                               f"{parent.memory}, which holds processes (no-internal-process "
                               "rule)", fix=_V2_FIX)
    return parent


def prepare(parent: CgroupParent) -> CgroupParent | NoCgroup:
    """``parent``, once it can hold session cgroups with memory and pids limits.

    On v2 this enables the two controllers for the parent's children when
    they are not yet enabled, which the kernel refuses while the parent
    holds processes (the no-internal-process rule); that refusal, or a
    parent this user may not write, is a ``NoCgroup``. v1 needs nothing here:
    ``create`` finds out whether the directories are writable.
    """
    if parent.version is CgroupVersion.V1:
        return parent
    wanted, refusal = _v2_state(parent)
    if refusal is not None:
        return refusal
    if wanted:
        try:
            _write(os.path.join(parent.memory, "cgroup.subtree_control"),
                   " ".join(f"+{c}" for c in wanted))
        except OSError as exc:
            why = ("it holds processes (no-internal-process rule)" if exc.errno == errno.EBUSY
                   else exc.strerror)
            return NoCgroup(reason=f"cannot enable {', '.join(wanted)} for the children of "
                                   f"{parent.memory}: {why}", fix=_V2_FIX)
    return parent


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def session_name(pid: int, started: int) -> str:
    return f"{PREFIX}{pid}-{started}-{secrets.token_hex(6)}"


def owner_alive(name: str) -> bool:
    """Whether the harness named in a session cgroup's name still runs (same pid, same start)."""
    match = _NAME.match(name)
    if match is None:
        return True
    return start_time(int(match.group(1))) == int(match.group(2))


def _members(directory: str) -> set[int]:
    try:
        return {int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split()}
    except FileNotFoundError:
        return set()


def _kill_members(directories: Sequence[str]) -> None:
    """SIGKILL every process in ``directories`` until none remains.

    On v2, ``cgroup.kill`` kills atomically, forks in flight included; on v1
    (or a kernel before 5.14) each round kills everything listed, and a
    process forked since is listed the next round. It converges: a task with
    SIGKILL pending cannot fork, and pids.max bounds each round.
    """
    for directory in directories:
        kill_file = os.path.join(directory, "cgroup.kill")
        if os.path.exists(kill_file):
            try:
                _write(kill_file, "1")
            except FileNotFoundError:
                pass
    stop = time.monotonic() + _KILL_DEADLINE_S
    while True:
        members = set().union(*(_members(d) for d in directories))
        if not members:
            return
        if time.monotonic() > stop:
            raise SandboxError(f"processes {sorted(members)} survived SIGKILL in "
                               f"{', '.join(directories)}", who="linux")
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


def _rmdir_all(directories: Sequence[str]) -> None:
    """Remove each directory; a just-killed task may keep one busy for a moment."""
    stop = time.monotonic() + _KILL_DEADLINE_S
    for directory in directories:
        while True:
            try:
                os.rmdir(directory)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > stop:
                    raise SandboxError(f"cannot remove cgroup {directory}: {exc.strerror}",
                                       who="linux") from exc
                time.sleep(0.005)


class SessionCgroup:
    """The cgroup (one directory on v2, one per hierarchy on v1) of one session."""

    def __init__(self, *, version: CgroupVersion, name: str, memory: str, pids: str,
                 memory_bytes: int, pids_max: int, swap_capped: bool) -> None:
        self.version = version
        self.name = name
        self.memory = memory
        self.pids = pids
        self.memory_bytes = memory_bytes
        self.pids_max = pids_max
        self.swap_capped = swap_capped
        self._removed = False

    @property
    def directories(self) -> tuple[str, ...]:
        return (self.memory,) if self.memory == self.pids else (self.memory, self.pids)

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The files a process writes its own pid into to join the session."""
        return tuple(os.path.join(d, "cgroup.procs") for d in self.directories)

    @property
    def mechanism(self) -> str:
        return f"{self.version.value} memory+pids"

    def members(self) -> set[int]:
        return set().union(*(_members(d) for d in self.directories))

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is in every directory of this session cgroup."""
        return all(pid in _members(d) for d in self.directories)

    def _stat(self, directory: str, file: str, key: str) -> int:
        for line in _read(os.path.join(directory, file)).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
        return 0

    def memory_peak(self) -> int | None:
        """The most memory the session was ever charged for, if the kernel keeps it."""
        name = "memory.max_usage_in_bytes" if self.version is CgroupVersion.V1 else "memory.peak"
        try:
            return int(_read(os.path.join(self.memory, name)))
        except FileNotFoundError:
            return None

    def oom_kills(self) -> int:
        """How many processes the memory cap's OOM killer ended."""
        if self.version is CgroupVersion.V1:
            return self._stat(self.memory, "memory.oom_control", "oom_kill")
        return self._stat(self.memory, "memory.events", "oom_kill")

    def pids_current(self) -> int:
        return int(_read(os.path.join(self.pids, "pids.current")))

    def forks_refused(self) -> int:
        """How many forks pids.max refused."""
        return self._stat(self.pids, "pids.events", "max")

    def kill_and_remove(self) -> None:
        """Kill every process in the session cgroup, then remove its directories. Idempotent."""
        if self._removed:
            return
        _kill_members(self.directories)
        _rmdir_all(self.directories)
        self._removed = True


def create(parent: CgroupParent, *, memory_bytes: int, pids: int) -> SessionCgroup:
    """A new, empty session cgroup under ``parent`` with both limits in place.

    Its name carries this process's pid and start time, so a later harness
    can tell whether the owner is gone. Raises ``OSError`` (and removes what
    it made) when a directory or a limit cannot be written: the caller
    decides whether that is fatal.
    """
    me = os.getpid()
    started = start_time(me)
    if started is None:
        raise OSError(errno.ESRCH, "cannot read this process's start time")
    name = session_name(me, started)
    memory_dir = os.path.join(parent.memory, name)
    pids_dir = os.path.join(parent.pids, name)
    made: list[str] = []
    try:
        for directory in dict.fromkeys((memory_dir, pids_dir)):
            os.mkdir(directory, 0o755)
            made.append(directory)
        swap_capped = _write_limits(parent.version, memory_dir, pids_dir, memory_bytes, pids)
    except OSError:
        for directory in reversed(made):
            os.rmdir(directory)
        raise
    return SessionCgroup(version=parent.version, name=name, memory=memory_dir, pids=pids_dir,
                         memory_bytes=memory_bytes, pids_max=pids, swap_capped=swap_capped)


# tmpfs pages (/tmp, /dev/shm, HOME) count against memory.max because the kernel charges
# them to the memory cgroup of the process that touches them.
def _write_limits(version: CgroupVersion, memory_dir: str, pids_dir: str,
                  memory_bytes: int, pids: int) -> bool:
    """Write both caps; True when swap is capped too (or there is no swap accounting to cap)."""
    _write(os.path.join(pids_dir, "pids.max"), str(pids))
    if version is CgroupVersion.V1:
        # memsw must never be below the memory limit, so the memory limit goes first.
        _write(os.path.join(memory_dir, "memory.limit_in_bytes"), str(memory_bytes))
        memsw = os.path.join(memory_dir, "memory.memsw.limit_in_bytes")
        if not os.path.exists(memsw):
            return _no_swap()
        _write(memsw, str(memory_bytes))
        return True
    _write(os.path.join(memory_dir, "memory.max"), str(memory_bytes))
    swap = os.path.join(memory_dir, "memory.swap.max")
    if not os.path.exists(swap):
        return _no_swap()
    _write(swap, "0")
    return True


def _no_swap() -> bool:
    """Without swap accounting, swap is only a hole when the machine has swap."""
    try:
        return len(_read("/proc/swaps").splitlines()) <= 1
    except OSError:
        return False


def reap_leftovers(parent: CgroupParent) -> tuple[str, ...]:
    """Remove the session cgroups under ``parent`` whose harness is gone; return their names.

    A cgroup whose owner still runs is left alone, empty or not: it may be a
    session being set up right now by another harness.
    """
    reaped: list[str] = []
    names: set[str] = set()
    for directory in parent.directories:
        try:
            names.update(n for n in os.listdir(directory) if _NAME.match(n))
        except OSError:
            continue
    for name in sorted(names):
        if owner_alive(name):
            continue
        dirs = [os.path.join(d, name) for d in parent.directories
                if os.path.isdir(os.path.join(d, name))]
        try:
            _kill_members(dirs)
            _rmdir_all(dirs)
        except SandboxError:
            continue
        reaped.append(name)
    return tuple(reaped)


def locate_self(proc: str = "/proc/self") -> CgroupParent | NoCgroup:
    """This process's own memory and pids cgroups, read from ``proc``; changes nothing."""
    try:
        return locate(_read(os.path.join(proc, "cgroup")), _read(os.path.join(proc, "mountinfo")))
    except OSError as exc:
        return NoCgroup(reason=f"cannot read {proc}/cgroup: {exc.strerror}", fix="mount /proc")


def discover(proc: str = "/proc/self") -> CgroupParent | NoCgroup:
    """This process's cgroup parent made ready for sessions, leftovers of dead harnesses reaped."""
    found = locate_self(proc)
    if isinstance(found, NoCgroup):
        return found
    prepared = prepare(found)
    if isinstance(prepared, CgroupParent):
        reap_leftovers(prepared)
    return prepared
