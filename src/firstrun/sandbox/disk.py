"""A workspace on a filesystem of its own size: past the bound, writes fail with ENOSPC.

Guarantee: a ``SizedWorkspace`` is a fresh ext4 filesystem in a sparse image,
loop-mounted (nosuid, nodev) on the workspace, so nothing the sandbox writes
there puts more than the bound on the host's disk; the bound never depends on
the sampling behind ``reached``. A mount a SIGKILLed harness left behind is
unmounted and removed by ``recover``, which every new sized workspace runs
first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.policy.process import MIN_DISK_MB
from firstrun.sandbox.ownership import alive, process_identity

DISK_LEASE_DIR = "/run/firstrun/disks"
MIB = 1 << 20
# How often use is sampled. Only what ``reached`` can see depends on it:
# a bound filled and emptied again within one interval is not seen.
SAMPLE_INTERVAL_S = 0.2
_PREFIX = "firstrun-disk-"


@dataclass(frozen=True, kw_only=True)
class DiskBound:
    """What bounded a session's workspace on the host's disk, and how full it got."""

    bound_bytes: int | None  # None: nothing bounded it
    mechanism: str
    peak_bytes: int = 0
    reached: bool = False

    def to_data(self) -> dict[str, object]:
        return {"bound_bytes": self.bound_bytes, "mechanism": self.mechanism,
                "peak_bytes": self.peak_bytes, "reached": self.reached}


def unbounded(why: str) -> DiskBound:
    return DiskBound(bound_bytes=None, mechanism=f"none: {why}")


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"disk bound: {what}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [""]
        raise SandboxUnavailable(f"disk bound: {what}: {tail[0]}")


def _mounted(path: str) -> bool:
    try:
        return os.stat(path).st_dev != os.stat(os.path.dirname(path)).st_dev
    except OSError:
        return False


def _unmount(path: str) -> None:
    if not _mounted(path):
        return
    done = subprocess.run(["umount", path], capture_output=True, check=False)
    if done.returncode != 0:
        # Busy: a process the session left still holds it. Detached now, the
        # filesystem (and the loop device) go with that process's last file.
        subprocess.run(["umount", "--lazy", path], capture_output=True, check=False)


def _lease_path(top: str) -> str:
    return os.path.join(DISK_LEASE_DIR, os.path.basename(top) + ".json")


def recover() -> tuple[str, ...]:
    """Unmount and remove each sized workspace whose harness is gone; the directories removed."""
    try:
        names = sorted(os.listdir(DISK_LEASE_DIR))
    except FileNotFoundError:
        return ()
    removed = []
    for name in names:
        path = os.path.join(DISK_LEASE_DIR, name)
        try:
            with open(path, encoding="utf-8") as f:
                lease = json.load(f)
            top, harness = str(lease["dir"]), str(lease["harness"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(harness) or not os.path.basename(top).startswith(_PREFIX):
            continue
        _unmount(os.path.join(top, "workspace"))
        shutil.rmtree(top, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        removed.append(top)
    return tuple(removed)


# The other places a session may write (/tmp, HOME, /dev/shm) are tmpfs, held by the memory
# bound, not the host's disk.
class SizedWorkspace:
    """An empty workspace directory (``path``) that holds at most ``bound_bytes``."""

    def __init__(self, bound_bytes: int) -> None:
        if bound_bytes < MIN_DISK_MB * MIB:
            raise SandboxError(f"disk bound: {bound_bytes} bytes is below {MIN_DISK_MB} MiB")
        self.bound_bytes = bound_bytes
        self._top = ""
        self._fd = -1
        self._peak = 0
        self._least_free: int | None = None
        self._least_inodes: int | None = None
        self._done = threading.Event()
        self._sampler: threading.Thread | None = None

    @property
    def path(self) -> str:
        return os.path.join(self._top, "workspace")

    def __enter__(self) -> SizedWorkspace:
        if os.geteuid() != 0:
            raise SandboxUnavailable(
                f"disk bound: mounting a sized filesystem needs root; this harness is uid "
                f"{os.geteuid()}", fix="run as root, or ask for no bound (--max-disk 0)")
        recover()
        os.makedirs(DISK_LEASE_DIR, mode=0o700, exist_ok=True)
        self._top = tempfile.mkdtemp(prefix=_PREFIX)
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        self._sampler = threading.Thread(target=self._sample_loop, name="firstrun-disk",
                                         daemon=True)
        self._sampler.start()
        return self

    def _make(self) -> None:
        image = os.path.join(self._top, "image")
        identity = process_identity(os.getpid())
        # The lease is written before the mount is made: it names the directory and the
        # harness (PID:STARTTIME) in DISK_LEASE_DIR, root's alone, so ``recover`` can tell a
        # dead harness's mount from a live one's.
        with open(_lease_path(self._top), "w", encoding="utf-8") as f:
            json.dump({"dir": self._top, "harness": identity}, f)
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, self.bound_bytes)  # sparse: the host pays only for what is written
        finally:
            os.close(fd)
        # No journal (a session's workspace is thrown away or copied out, never
        # recovered), no blocks reserved for root, and an inode for every 8 KiB,
        # since package trees are many small files.
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-i", "8192", "-O", "^has_journal",
              "-E", "nodiscard,lazy_itable_init=1", "-L", "firstrun", image], "mkfs.ext4")
        os.mkdir(self.path, 0o700)
        # noinit_itable: no background zeroing, which would write the sparse image out.
        _run(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime,noinit_itable", image,
              self.path], "mount")
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.rmdir(os.path.join(self.path, "lost+found"))
        os.chmod(self.path, 0o700)
        self._sample()

    def _sample(self) -> None:
        if self._fd < 0:
            return
        st = os.fstatvfs(self._fd)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        free = st.f_bavail * st.f_frsize
        self._peak = max(self._peak, used)
        self._least_free = free if self._least_free is None else min(self._least_free, free)
        self._least_inodes = st.f_favail if self._least_inodes is None \
            else min(self._least_inodes, st.f_favail)

    def _sample_loop(self) -> None:
        while not self._done.wait(SAMPLE_INTERVAL_S):
            self._sample()

    @property
    def reached(self) -> bool:
        """Whether use came within a write's slack of the bound, or the inodes ran out.

        ext4 keeps a little back for its own allocations, so a write refused
        for space leaves some free: half a percent of the bound, at least 4 MiB.
        """
        self._sample()
        slack = max(4 * MIB, self.bound_bytes // 200)
        return (self._least_free is not None and self._least_free <= slack) \
            or self._least_inodes == 0

    def bound(self) -> DiskBound:
        reached = self.reached
        return DiskBound(bound_bytes=self.bound_bytes,
                         mechanism="ext4 in a sparse image, loop-mounted",
                         peak_bytes=self._peak, reached=reached)

    def copy_to(self, destination: str) -> None:
        """Copy the workspace, as it is, into ``destination`` (which must not exist)."""
        os.mkdir(destination, 0o700)
        # cp -a never follows a symlink in what it copies, and keeps FIFOs and
        # the like as what they are rather than reading through them.
        done = subprocess.run(["cp", "-a", "--", self.path + "/.", destination],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or [""]
            raise SandboxError(f"cannot keep the workspace at {destination}: {tail[0]}")

    def close(self) -> None:
        self._done.set()
        if self._sampler is not None:
            self._sampler.join()
            self._sampler = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if not self._top:
            return
        _unmount(self.path)
        shutil.rmtree(self._top, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_lease_path(self._top))
        self._top = ""

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_sized_workspace(bound_mb: int, *, asked: bool) -> SizedWorkspace | DiskBound:
    """A sized workspace, made and mounted (close it), or the ``DiskBound`` saying why none.

    0 asks for no bound. A harness that is not root cannot mount one: that
    is recorded when the bound is the default, and refused
    (``SandboxUnavailable``) when it was asked for. A root harness that
    fails to make one is refused either way, since the layer is there to be had.
    """
    if bound_mb == 0:
        return unbounded("no bound was asked for (0)")
    if os.geteuid() != 0 and not asked:
        return unbounded(f"mounting a filesystem needs root; this harness is uid {os.geteuid()}")
    return SizedWorkspace(bound_mb * MIB).__enter__()
