"""A gVisor session's launch, as a pure function of the profile and the host facts.

Guarantee: ``prepare`` is pure (no I/O, no clock), so the whole launch (runsc
argv, ``config.json``, root skeleton, environment) is golden-tested. A session
gets its own kernel, loopback and the proxy's sockets as its only network, a
read-only root with tmpfs /tmp, /dev/shm and HOME, the workspace as its one
writable host directory, the helper as init with only the capabilities it
needs, linux's seccomp filter if required, and capped memory, CPU and pids.
"""

from __future__ import annotations

import base64
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from firstrun.policy.process import SANDBOX_CA_BUNDLE
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.capture import CapturePorts, GvisorTools, gvisor_steps
from firstrun.sandbox.linux.spec import (
    PROXY_PORT,
    SANDBOX_TMP,
    HostView,
    command_environment,
    helper_config,
    readonly_roots,
)

# Where the proxy's sockets appear inside; the directory holds nothing else.
EGRESS_DIR = "/run/firstrun-egress"
# The capabilities of the helper, as on docker: change to the session's uid
# and kill what it leaves behind. Commands drop them all before they exec.
HELPER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL")
# Under capture, the rules' tools need these too; commands never hold them.
CAPTURE_CAPS = ("CAP_NET_ADMIN", "CAP_NET_RAW")
CAPTURE_PORTS = CapturePorts()
# The container's cgroup, beneath each controller's root.
CGROUP_PARENT = "/firstrun-gvisor"
# A CPU period of 100 ms; the quota is the cores a session may use in it.
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True, kw_only=True)
class GvisorFacts:
    """What ``start`` found on this host and set up for one session, so ``prepare`` is pure.

    ``uid``: the session's uid inside, which is also the owner of whatever
    the session writes to the workspace on the host (the gofer writes as
    the uid it is asked to, there being no user namespace between).
    ``sockets``: the proxy's listeners by the helper's kind (``c`` for
    proxy-aware clients, ``t`` and ``d`` for captured flows and DNS), each
    a host socket path. ``capture``: the tools the helper loads the rules
    with, when the session captures; None when it does not. ``seccomp_bpf``:
    the linux backend's filter as BPF (``linux.seccomp.compile_filter``),
    when the profile requires the seccomp layer; None when it does not.
    """

    runsc: str
    platform: str
    state_root: str
    bundle: str
    container_id: str
    uid: int
    host: HostView
    sockets: Mapping[str, str]
    host_env: Mapping[str, str]
    path_dirs: frozenset[str]
    cpus: float
    helper_source: str
    capture: GvisorTools | None = None
    seccomp_bpf: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class GvisorPlan:
    """One session's launch, whole. ``skeleton``: the root's mount points (``dir`` or
    ``file``) and symlinks (``link``, with a target), to create beneath ``rootfs``."""

    argv: tuple[str, ...]
    rootfs: str
    config: Mapping[str, object]
    skeleton: tuple[tuple[str, str, str], ...]
    exposed: tuple[str, ...]
    env: Mapping[str, str]

    def to_data(self) -> dict[str, object]:
        return {"argv": list(self.argv), "rootfs": self.rootfs, "config": self.config,
                "skeleton": [list(entry) for entry in self.skeleton],
                "exposed": list(self.exposed), "env": dict(self.env)}


def _bind(source: str, destination: str, *, writable: bool = False) -> dict[str, object]:
    return {"destination": destination, "type": "bind", "source": source,
            "options": ["rbind", "rw" if writable else "ro", "nosuid", "nodev"]}


def _tmpfs(destination: str, *, size: int, mode: str, uid: int = 0) -> dict[str, object]:
    return {"destination": destination, "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", f"mode={mode}", f"size={size}",
                        f"uid={uid}", f"gid={uid}"]}


def prepare(profile: SandboxProfile, proxy: ProxyEndpoint | None, facts: GvisorFacts) -> GvisorPlan:
    """The launch of one gVisor session, as a pure function of the profile and the facts."""
    fs = profile.fs
    limits = profile.limits
    host = facts.host
    symlinks = dict(host.symlinks)
    readonly, exposed = readonly_roots(profile, host)

    skeleton: list[tuple[str, str, str]] = []
    mounts: list[dict[str, object]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        _tmpfs("/dev/shm", size=limits.memory_bytes, mode="1777"),
        _tmpfs(SANDBOX_TMP, size=limits.memory_bytes, mode="1777"),
    ]
    skeleton += [("/proc", "dir", ""), ("/dev", "dir", ""), ("/dev/shm", "dir", ""),
                 (SANDBOX_TMP, "dir", "")]
    # An empty skeleton whose mount points, and the merged-/usr symlinks, the launch
    # creates; the system directories and toolchain roots are bound read-only over it with
    # their secrets masked.
    # Parents before children, so a nested bind lands on top of its parent's.
    for path in sorted(readonly, key=lambda p: (p.count("/"), p)):
        if path in symlinks:
            skeleton.append((path, "link", symlinks[path]))
        else:
            kind = "dir" if path in host.directories else "file"
            skeleton.append((path, kind, ""))
            mounts.append(_bind(path, path))
    if proxy is not None and proxy.trust_bundle is not None:
        # After /etc, so it lands on top of the system bundle bound with it.
        mounts.append(_bind(proxy.trust_bundle, SANDBOX_CA_BUNDLE))
    for path in sorted(fs.hidden, key=lambda p: (p.count("/"), p)):
        if path in host.directories:
            mounts.append(_tmpfs(path, size=1 << 20, mode="0755"))
        else:
            mounts.append(_bind("/dev/null", path))
    mounts.append(_tmpfs(fs.sandbox_home, size=limits.memory_bytes, mode="0700", uid=facts.uid))
    skeleton.append((fs.sandbox_home, "dir", ""))
    mounts.append(_bind(fs.workspace, fs.sandbox_workspace, writable=True))
    skeleton.append((fs.sandbox_workspace, "dir", ""))
    # On top of the workspace: read-only, and neither removable nor renamable (EBUSY).
    for name, _kind in fs.protected:
        mounts.append(_bind(posixpath.join(fs.workspace, name),
                            posixpath.join(fs.sandbox_workspace, name)))
    endpoints: dict[str, str] = {}
    # The proxy's Unix sockets, bound in one by one, are the only way out:
    # ``--host-uds=open`` lets a connect() reach exactly the sockets bound in.
    if proxy is not None:
        skeleton.append((EGRESS_DIR, "dir", ""))
        for kind, path in sorted(facts.sockets.items()):
            inside = posixpath.join(EGRESS_DIR, f"{kind}.sock")
            mounts.append(_bind(path, inside, writable=True))
            endpoints[kind] = inside

    config = helper_config(profile, control_fd=0, dial_fd=None)
    config.update({
        "channel_fds": [0, 1],
        "proxy_port": PROXY_PORT if proxy is not None else None,
        "user": {"uid": facts.uid, "gid": facts.uid},
        # The sentry has no Landlock (ENOSYS); its guarantee is the read-only root here.
        "landlock": {**config["landlock"], "apply": False, "required": False},  # type: ignore[dict-item]
    })
    if endpoints:
        config["endpoints"] = endpoints
    # The very BPF bubblewrap loads, loaded into the sentry by the helper before any
    # command; not the bundle's ``linux.seccomp``, because runsc 20240729 answers all of its
    # refusals with EPERM, and clone3 must answer ENOSYS.
    if facts.seccomp_bpf is not None:
        config["seccomp_bpf"] = base64.b64encode(facts.seccomp_bpf).decode("ascii")
    caps = list(HELPER_CAPS)
    # Under transparent capture the helper first loads linux's nat rules and a default route
    # through lo into the sentry's netstack (``--net-raw`` lets it: xtables speaks through a
    # raw socket), so every flow and DNS query reaches the proxy whatever the program
    # honours.
    if facts.capture is not None:
        config["capture"] = {**CAPTURE_PORTS.to_config(ipv6=True),
                             "load": gvisor_steps(CAPTURE_PORTS, facts.capture)}
        caps += CAPTURE_CAPS
    oci: dict[str, object] = {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": [host.interpreter, "-I", "-S", "-c", facts.helper_source,
                     json.dumps(config, sort_keys=True, separators=(",", ":"))],
            "env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps,
                             "inheritable": [], "ambient": []},
            "noNewPrivileges": True,
        },
        "root": {"path": facts.bundle + "/rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "cgroupsPath": f"{CGROUP_PARENT}/{facts.container_id}",
            # No pids limit here: runsc's pids cgroup counts the sentry's host threads
            # (about thirty per guest process) and a cap there crashes it, so processes are
            # capped by RLIMIT_NPROC inside.
            "resources": {
                "memory": {"limit": limits.memory_bytes},
                "cpu": {"quota": int(facts.cpus * _CPU_PERIOD_US), "period": _CPU_PERIOD_US},
            },
        },
    }
    argv = (facts.runsc, "--root", facts.state_root, f"--platform={facts.platform}",
            "--network=none", *(("--host-uds=open",) if endpoints else ()),
            *(("--net-raw",) if facts.capture is not None else ()), "--overlay2=none",
            # Files through the gofer: with directfs, runsc 20240729 answers open(O_TRUNC)
            # of a read-only bind's file with EROFS and truncates the host's file all the
            # same.
            "--directfs=false",
            "run", "--bundle", facts.bundle, facts.container_id)
    env = command_environment(profile, proxy, host_env=facts.host_env, prefix=host.prefix,
                              path_dirs=facts.path_dirs)
    return GvisorPlan(argv=argv, rootfs=facts.bundle + "/rootfs", config=oci,
                      skeleton=tuple(skeleton), exposed=exposed, env=env)
