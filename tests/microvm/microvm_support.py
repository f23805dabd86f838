"""Host-side evidence and session helpers for micro-VM tests.

Imported by name, never through ``conftest``: every test directory has a
conftest, and a bare ``import conftest`` gets whichever was imported last.
"""

from __future__ import annotations

import os
import tempfile
import time

from firstrun.sandbox.microvm import probe

# KVM wherever it can run Debian's kernel; elsewhere the same VM under TCG,
# chosen here explicitly and recorded by the session, never by the backend.
ACCEL = "kvm" if probe.kvm().available else "tcg"


def make_workspace() -> str:
    return tempfile.mkdtemp(prefix="firstrun-test-microvm-ws-")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")


def wait_gone(pid: int, within_s: float = 30.0) -> bool:
    """True once ``pid`` is gone; False if it still runs after ``within_s`` (a bound, not a timing claim)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def qemu_pids() -> set[int]:
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/comm", encoding="utf-8") as f:
                    if f.read().strip() == "qemu-system-x86":
                        found.add(int(name))
            except OSError:
                continue
    return found
