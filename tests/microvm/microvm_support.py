"""Host-side evidence for micro-VM tests."""

from __future__ import annotations

import os
import time


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
