"""What this machine can enforce for the linux backend, each with its exact fix.

Guarantee: every capability the linux backend depends on is reported, with
``available`` decided by trying it (reading the kernel's own answer, running
bubblewrap), never by guessing from a distribution name, and with the exact
command that fixes it when it is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from firstrun.errors import SandboxError
from firstrun.fixes import apt_fix
from firstrun.sandbox.base import Capability
from firstrun.sandbox.helper import landlock_abi

# The modules themselves, not the package: the package's __init__ imports the
# backend, which imports this module.
from firstrun.sandbox.linux.cgroup import CgroupParent, assess, locate_self
from firstrun.sandbox.linux.seccomp import compile_filter

MIN_BWRAP = (0, 8, 0)

_APPARMOR_FIX = (
    "allow bubblewrap to create user namespaces under AppArmor: write /etc/apparmor.d/bwrap "
    "containing 'abi <abi/4.0>, include <tunables/global> profile bwrap /usr/bin/bwrap "
    "flags=(unconfined) { userns, }' and run 'apparmor_parser -r /etc/apparmor.d/bwrap' "
    "(or, system-wide: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)"
)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bwrap_version(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(g) for g in match.groups()) if match else None


def _userns() -> Capability:
    max_ns = _read("/proc/sys/user/max_user_namespaces")
    if max_ns is not None and max_ns == "0":
        return Capability(name="user_namespaces", available=False,
                          detail="user.max_user_namespaces is 0",
                          fix="sysctl -w user.max_user_namespaces=15000")
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return Capability(name="user_namespaces", available=False,
                          detail="kernel.unprivileged_userns_clone is 0",
                          fix="sysctl -w kernel.unprivileged_userns_clone=1")
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return Capability(name="user_namespaces", available=False,
                          detail="AppArmor restricts unprivileged user namespaces "
                                 "(kernel.apparmor_restrict_unprivileged_userns=1)",
                          fix=_APPARMOR_FIX)
    return Capability(name="user_namespaces", available=True,
                      detail=f"unprivileged user namespaces allowed (max {max_ns})")


def _bwrap() -> Capability:
    path = bwrap_path()
    if path is None:
        return Capability(name="bubblewrap", available=False, detail="bwrap not on PATH",
                          fix=apt_fix("bubblewrap"))
    version = bwrap_version(path)
    shown = ".".join(map(str, version)) if version else "unknown"
    if version is None or version < MIN_BWRAP:
        return Capability(name="bubblewrap", available=False,
                          detail=f"{path} version {shown}; need >= 0.8.0 (--disable-userns, --size)",
                          fix=f"{apt_fix('bubblewrap')} (Debian 12 ships 0.8.0)")
    return Capability(name="bubblewrap", available=True, detail=f"{path} {shown}")


def _landlock() -> Capability:
    abi = landlock_abi()
    if abi == 0:
        lsm = _read("/sys/kernel/security/lsm") or "unknown"
        return Capability(name="landlock", available=False,
                          detail=f"Landlock unavailable (active LSMs: {lsm})",
                          fix="boot a kernel >= 5.13 built with CONFIG_SECURITY_LANDLOCK=y and add "
                              "'landlock' to the lsm= kernel parameter "
                              f"(e.g. lsm=landlock,{lsm})")
    return Capability(name="landlock", available=True, detail=f"Landlock ABI {abi}")


def _seccomp() -> Capability:
    status = _read("/proc/self/status") or ""
    if "Seccomp:" not in status:
        return Capability(name="seccomp", available=False,
                          detail="kernel built without CONFIG_SECCOMP_FILTER",
                          fix="boot a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y")
    try:
        os.close(compile_filter())
    except SandboxError as exc:
        return Capability(name="seccomp", available=False, detail=f"libseccomp unusable: {exc}",
                          fix=apt_fix("libseccomp2"))
    return Capability(name="seccomp", available=True, detail="seccomp-bpf via libseccomp")


def _uid_switch() -> Capability:
    if os.geteuid() == 0:
        return Capability(name="uid_switch", available=True,
                          detail="harness is root: commands run as a per-session unprivileged uid")
    return Capability(name="uid_switch", available=True,
                      detail=f"harness is uid {os.geteuid()}: commands run as that uid, "
                             "with no privileges to drop")


def _session_limits() -> Capability:
    """Whether memory and pids can be capped per session; rlimits are the floor either way.

    Always ``available`` (rlimits always apply, so the limits layer never
    refuses a run); the detail says which mechanism a session would get.
    Judged without changing anything: doctor only observes.
    """
    found = locate_self()
    if isinstance(found, CgroupParent):
        found = assess(found)
    if isinstance(found, CgroupParent):
        return Capability(name="session_limits", available=True,
                          detail=f"{found.version.value} memory+pids: session-wide caps in "
                                 f"children of {', '.join(found.directories)}")
    return Capability(name="session_limits", available=True,
                      detail=f"rlimit only, per process (no writable cgroup: {found.reason}); "
                             f"for session-wide caps: {found.fix}")


def _capture() -> Capability:
    """Transparent capture loads its nat rules from outside: these tools must be here."""
    tools = ("nsenter", "ip", "iptables-restore", "ip6tables-restore")
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [t for t in tools if shutil.which(t, path=path) is None]
    if missing:
        return Capability(name="capture", available=False,
                          detail=f"transparent capture needs {', '.join(missing)}",
                          fix=apt_fix("iptables", "iproute2", "util-linux"))
    return Capability(name="capture", available=True,
                      detail="transparent capture: nat rules loaded with iptables-restore")


def probe() -> tuple[Capability, ...]:
    return (_userns(), _bwrap(), _landlock(), _seccomp(), _uid_switch(), _session_limits(),
            _capture())
