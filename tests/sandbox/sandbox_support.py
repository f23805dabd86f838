"""Support for sandbox tests: sessions, canaries and host-side process evidence."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.base import Session


def has_ipv6_loopback() -> bool:
    """Whether this host has ::1 (a kernel booted with ipv6.disable=1 has none)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


class TcpCanary:
    """A listener on the host's loopback that counts every connection it accepts."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def accepted(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


class UnixCanary:
    """A Unix socket listener (a path, or abstract when the name starts with NUL)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(16)
        self.sock.setblocking(False)

    def accepted(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()
        if not self.address.startswith("\0"):
            os.unlink(self.address)


def host_processes_with(token: str) -> list[tuple[int, int]]:
    """(pid, start time) of every host process whose command line contains ``token``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if token.encode() in cmdline:
            start = int(stat[stat.rindex(b")") + 2 :].split()[19])
            found.append((int(name), start))
    return found


def wait_for_processes_with(token: str, count: int, *, deadline_s: float = 30.0) -> list[tuple[int, int]]:
    """Poll until ``count`` host processes carry ``token``, or give up at the deadline.

    A background process started by a command is not exec'd the moment the
    command returns; asserting at once would race it. The deadline only
    bounds a broken run, it is not a timing assertion.
    """
    import time

    stop = time.monotonic() + deadline_s
    found = host_processes_with(token)
    while len(found) < count and time.monotonic() < stop:
        time.sleep(0.05)
        found = host_processes_with(token)
    return found


def alive(pid: int, start: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19]) == start and fields[0] not in (b"Z", b"X")


def start_session(kind: str, profile: SandboxProfile) -> Iterator[Session]:
    """One session of ``kind`` (linux, docker, gvisor or microvm) over ``profile``, without a proxy;
    skipped where that backend cannot run here. Use as ``for session in start_session(...)``."""
    import shutil

    import pytest

    from firstrun.images.build import PYTHON, image_present
    if kind == "docker":
        if os.geteuid() != 0 or shutil.which("docker") is None or not image_present(PYTHON.tag):
            pytest.skip("needs root, a running dockerd and the default image")
        from firstrun.sandbox.docker.backend import DockerBackend
        backend: object = DockerBackend(image=PYTHON.tag)
    elif kind == "gvisor":
        from firstrun.sandbox.gvisor.backend import GvisorBackend
        missing = [c for c in GvisorBackend().probe() if not c.available]
        if missing:
            pytest.skip(f"gvisor: {missing[0].detail}")
        backend = GvisorBackend()
    elif kind == "microvm":
        from firstrun.sandbox.microvm.backend import MicrovmBackend
        from firstrun.sandbox.microvm.image import find_image
        from firstrun.sandbox.microvm.probe import kvm
        if find_image() is None:
            pytest.skip("the micro-VM image is not built (scripts/test builds it)")
        backend = MicrovmBackend(accel="kvm" if kvm().available else "tcg")
    else:
        from firstrun.sandbox.linux.backend import LinuxBackend
        backend = LinuxBackend()
    with backend.start(profile, proxy=None) as session:  # type: ignore[attr-defined]
        yield session
