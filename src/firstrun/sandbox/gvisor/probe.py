"""What the gvisor backend needs on this host, each found or not, with the exact fix.

Guarantee: ``probe`` never starts a sandbox and never blocks for long: it
reads ``runsc --version`` and the platforms the build has, each under a
short timeout, and says why the backend cannot run (no runsc, a build too
old to run everyday tools, a non-root harness) before any session tries.
The platform is chosen here, once per process: systrap where the build has
it, then kvm where KVM works (the micro-VM's probe decides), then ptrace.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import date

from firstrun.fixes import apt_fix
from firstrun.sandbox import capture
from firstrun.sandbox.base import Capability

_TIMEOUT_S = 10.0
# The oldest build firstrun has run its conformance suite on. Older ones
# break everyday tools: Debian 12's 20221219 answers statx(AT_NO_AUTOMOUNT)
# with EINVAL, so coreutils' ls and stat fail on every path, and a task that
# failed because ls did would read as a gap in the docs.
MIN_RELEASE = date(2024, 7, 29)
# gVisor ships its fixes in new releases, not in backports.
STALE_AFTER_DAYS = 365
_FIX_INSTALL = ("install a runsc of 2024-07-29 or later: Debian 13's package "
                "(scripts/install --with-test-deps fetches it on Debian 12), or gVisor's own "
                "releases (https://gvisor.dev/docs/user_guide/install/)")


@dataclass(frozen=True, kw_only=True)
class Runsc:
    """One runsc build: where it is, the day it was cut, and the platform sessions use."""

    path: str
    release: date
    platform: str


def runsc_path() -> str | None:
    return shutil.which("runsc")


def _release(text: str) -> date | None:
    # "runsc version 0.0~20240729.0" (Debian) or "runsc version release-20240729.0".
    found = re.search(r"(20\d{2})(\d{2})(\d{2})", text)
    if found is None:
        return None
    try:
        return date(*(int(g) for g in found.groups()))
    except ValueError:
        return None


def _platforms(path: str) -> tuple[str, ...]:
    try:
        out = subprocess.run([path, "help", "platforms"], capture_output=True, text=True,
                             timeout=_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip().isalpha())


def choose_platform(available: tuple[str, ...], *, kvm_works: bool) -> str | None:
    """systrap, else kvm where KVM works, else ptrace; None when the build has none of them.

    A kvm platform on a host whose /dev/kvm cannot run it (a PVM host)
    hangs rather than failing, so it is taken only when KVM is known to work.
    """
    if "systrap" in available:
        return "systrap"
    if "kvm" in available and kvm_works:
        return "kvm"
    if "ptrace" in available:
        return "ptrace"
    return None


@functools.cache
def find_runsc() -> Runsc | str:
    """The runsc sessions use, or why there is none usable (one line, for a Capability)."""
    path = runsc_path()
    if path is None:
        return "runsc is not installed"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} --version did not answer: {exc}"
    release = _release(out)
    if release is None:
        return f"cannot read the release of {path} from {out.strip()[:80]!r}"
    if release < MIN_RELEASE:
        return (f"{path} is release {release.isoformat()}, older than {MIN_RELEASE.isoformat()}: "
                "it breaks everyday tools (ls and stat fail on every path)")
    from firstrun.sandbox.microvm.probe import kvm

    platform = choose_platform(_platforms(path), kvm_works=kvm().available)
    if platform is None:
        return f"{path} offers none of the platforms systrap, kvm, ptrace"
    return Runsc(path=path, release=release, platform=platform)


def kernel() -> Capability:
    """Whether sessions here get a kernel of their own (gVisor's sentry), for ``isolation``."""
    missing = next((c for c in probe() if not c.available), None)
    if missing is not None:
        return missing
    return Capability(name="runsc", available=True, detail="gVisor's user-space kernel")


def probe() -> tuple[Capability, ...]:
    found = find_runsc()
    missing = unusable(capturing=True)
    if isinstance(found, str):
        assert missing is not None
        return (missing,)
    age = (date.today() - found.release).days
    stale = f"; older than a year ({age} days): gVisor's fixes ship in new releases" \
        if age > STALE_AFTER_DAYS else ""
    runsc = Capability(name="runsc", available=True,
                       detail=f"{found.path}, release {found.release.isoformat()}, platform "
                              f"{found.platform}{stale}")
    return (runsc,) if missing is None else (runsc, missing)


def unusable(*, capturing: bool) -> Capability | None:
    """The first thing a session here would lack (``capturing``: transparent capture's
    tools too); None: nothing. What a start checks, the sweep having probed in full."""
    found = find_runsc()
    if isinstance(found, str):
        return Capability(name="runsc", available=False, detail=found, fix=_FIX_INSTALL)
    tools = capture.find_gvisor_tools() if capturing else None
    if isinstance(tools, str):
        return Capability(name="capture", available=False, detail=tools,
                          fix=apt_fix("iptables", "iproute2"))
    if os.geteuid() != 0:
        # Rootless runsc applies no cgroup, so the memory and CPU caps a
        # profile asks for would be silently ignored.
        return Capability(
            name="root", available=False,
            detail="the gvisor backend runs runsc as root: rootless runsc ignores the session's "
                   "memory and CPU limits",
            fix="run firstrun as root (sudo), or use --backend linux")
    return None
