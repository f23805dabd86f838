"""The bubblewrap launch of a linux session, as a pure function of the profile.

Guarantee: ``build_launch_spec`` and ``prepare`` are pure (no I/O, no clock),
so the launch plan is golden-tested. The sandbox gets its own namespaces (the
host's network only in an audit profile without ``network``), a fresh /proc,
a minimal /dev, size-capped tmpfs /tmp, /dev/shm and HOME, the system and
toolchain directories read-only with secrets masked, and exactly one host
directory read-write: the workspace; no host socket directory is bound.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from firstrun.policy.filesystem import SYSTEM_READONLY, is_under
from firstrun.policy.process import SANDBOX_CA_BUNDLE, build_environment
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.bytecode import BOOTSTRAP

SANDBOX_TMP = "/tmp"
PROXY_PORT = 3128
# Landlock write rules for devices: files a command may write or truncate.
WRITABLE_DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random",
                         "/dev/urandom", "/dev/ptmx")
# Pseudo-terminals stay usable (script, expect, test runners); TIOCSTI on
# them is refused by seccomp.
WRITABLE_DEVICE_DIRS = ("/dev/shm", "/dev/pts")


@dataclass(frozen=True, kw_only=True)
class HostView:
    """What the pure builder needs to know about the host, gathered by the backend.

    ``symlinks`` maps read-only entries that are symlinks (merged /usr:
    ``/bin -> usr/bin``) to their targets; ``directories`` says which
    read-only and hidden paths are directories (a hidden directory is masked
    by a tmpfs, a hidden file by /dev/null); ``interpreter`` is the helper's Python and ``prefix`` its
    installation, bound read-only if no read-only root covers it.
    """

    symlinks: tuple[tuple[str, str], ...] = ()
    directories: frozenset[str] = frozenset()
    interpreter: str
    prefix: str


@dataclass(frozen=True, kw_only=True)
class StagedBind:
    source: str
    staged: str
    directory: bool


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    argv: tuple[str, ...]
    stage: tuple[StagedBind, ...] = ()
    exposed: tuple[str, ...] = ()


def helper_config(
    profile: SandboxProfile,
    *,
    control_fd: int,
    dial_fd: int | None,
    landlock_min_abi: int = 1,
    capture: dict[str, object] | None = None,
) -> dict[str, object]:
    """The helper's configuration: nothing secret, since commands can read its cmdline.

    ``capture`` is ``CapturePorts.to_config``'s, when the session captures
    transparently; the helper's dialer then serves flows and DNS too.
    """
    fs = profile.fs
    extra = {"capture": capture} if capture is not None else {}
    return {
        "channel_fds": [control_fd, control_fd],
        "dial_fd": dial_fd,
        "proxy_port": PROXY_PORT if dial_fd is not None else None,
        "limits": {
            "pids": profile.limits.pids,
            "memory_bytes": profile.limits.memory_bytes,
            "open_files": profile.limits.open_files,
        },
        "landlock": {
            # Not required: not even attempted, so the audit can measure its absence.
            "apply": LayerName.LANDLOCK in profile.required,
            "required": LayerName.LANDLOCK in profile.required
            and LayerName.LANDLOCK not in profile.downgrades,
            "min_abi": landlock_min_abi,
            "dirs": [fs.sandbox_workspace, SANDBOX_TMP, fs.sandbox_home, *WRITABLE_DEVICE_DIRS],
            "files": list(WRITABLE_DEVICE_FILES),
        },
        **extra,
    }


def build_launch_spec(
    profile: SandboxProfile,
    *,
    host: HostView,
    helper_code: str,
    config: dict[str, object],
    seccomp_fd: int | None,
    stage_dir: str | None,
    bwrap: str = "bwrap",
    trust_bundle: str | None = None,
    info_fd: int | None = None,
) -> LaunchSpec:
    """The complete bwrap argv for one session; ``stage_dir`` set when dropping root.

    ``helper_code``: the helper's code as ``bytecode.encoded`` gives it, run by
    the harness's own interpreter (``host.interpreter``, bound in).

    ``trust_bundle``: the host file shown at ``SANDBOX_CA_BUNDLE`` (TLS inspection).
    ``info_fd``: where bubblewrap writes its child's pid as soon as it made
    the child's namespaces, so the harness can open the network namespace
    and load capture's tables while the rest of the setup runs.
    """
    fs = profile.fs
    symlinks = dict(host.symlinks)
    stage: list[StagedBind] = []

    # When the harness is root, bubblewrap runs as an unprivileged uid that may not walk to
    # every source (``/root`` is 0700): such a source is staged, bound by the root launcher
    # at ``<stage>/<n>`` in a private mount namespace before it drops privileges, and the
    # argv names the staged path.
    def source(path: str, directory: bool) -> str:
        if stage_dir is None or path in SYSTEM_READONLY:
            return path
        staged = posixpath.join(stage_dir, str(len(stage)))
        stage.append(StagedBind(source=path, staged=staged, directory=directory))
        return staged

    readonly, exposed = readonly_roots(profile, host)

    # A profile whose ``required`` set leaves out ``network`` shares the host's network
    # namespace (an audit configuration, never a run's: see ``firstrun.policy.profile``);
    # every other namespace is unshared regardless, and nested user namespaces are
    # forbidden.
    unshare_net = ["--unshare-net"] if LayerName.NETWORK in profile.required else []
    argv = [
        bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", *unshare_net,
        "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--as-pid-1",
        "--new-session",
        *(["--info-fd", str(info_fd)] if info_fd is not None else []),
        "--hostname", "sandbox",
        "--proc", "/proc",
        "--dev", "/dev",
        # bubblewrap's /dev is a tmpfs without a size: capped here, /dev/shm
        # would let a command put half the host's RAM in files.
        "--size", str(profile.limits.memory_bytes), "--tmpfs", "/dev/shm",
        "--size", str(profile.limits.memory_bytes), "--tmpfs", SANDBOX_TMP,
    ]
    # No bind covers /run, /var/run or the host's /tmp (a workspace may live under /tmp, but
    # only it is bound), so host sockets (docker, containerd, ssh-agent, D-Bus) do not exist
    # inside: a read-only bind would not stop connect() on a socket.
    # Parents before children, so a nested bind lands on top of its parent's.
    for path in sorted(readonly, key=lambda p: (p.count("/"), p)):
        if path in symlinks:
            argv += ["--symlink", symlinks[path], path]
        else:
            argv += ["--ro-bind", source(path, path in host.directories), path]
    if trust_bundle is not None:
        # With TLS inspection the run's trust bundle (certificates only, never a key) covers
        # the system bundle, so clients that ignore the trust variables trust the run's CA
        # too.
        # After /etc, so it lands on top of the system bundle bound with it.
        argv += ["--ro-bind", source(trust_bundle, False), SANDBOX_CA_BUNDLE]
    for path in sorted(fs.hidden, key=lambda p: (p.count("/"), p)):
        if path in host.directories:
            argv += ["--tmpfs", path]
        else:
            argv += ["--ro-bind", "/dev/null", path]
    argv += ["--size", str(profile.limits.memory_bytes), "--tmpfs", fs.sandbox_home]
    argv += ["--bind", source(fs.workspace, True), fs.sandbox_workspace]
    # On top of the workspace, each a mount point: read-only, and neither
    # removable nor renamable from inside (EBUSY), so it cannot be swapped.
    for name, kind in fs.protected:
        argv += ["--ro-bind", source(posixpath.join(fs.workspace, name), kind == "dir"),
                 posixpath.join(fs.sandbox_workspace, name)]
    argv += ["--chdir", fs.sandbox_workspace]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += [
        "--", host.interpreter, "-I", "-S", "-c", BOOTSTRAP, helper_code,
        json.dumps(config, sort_keys=True, separators=(",", ":")),
    ]
    return LaunchSpec(argv=tuple(argv), stage=tuple(stage), exposed=exposed)


@dataclass(frozen=True, kw_only=True)
class Launch:
    """What the launched process does before it execs bubblewrap.

    ``uid`` is the sandbox uid a root harness drops to (None: no drop, no
    stage); ``stage`` lists (source, staged path, is a directory) binds
    under ``stage_dir``.
    """

    cgroup_procs: tuple[str, ...] = ()
    uid: int | None = None
    stage_dir: str | None = None
    stage: tuple[tuple[str, str, bool], ...] = ()

    @property
    def needed(self) -> bool:
        return self.uid is not None or bool(self.cgroup_procs)

    def to_data(self) -> dict[str, object]:
        return {"cgroup_procs": list(self.cgroup_procs), "uid": self.uid,
                "stage_dir": self.stage_dir, "stage": [list(s) for s in self.stage]}


@dataclass(frozen=True, kw_only=True)
class LinuxFacts:
    """What ``start`` found on this host and set up for one session, so ``prepare`` is pure.

    ``uid``: the per-session uid a root harness runs bubblewrap as (None:
    the invoking user's own). ``cgroup_procs``: the session cgroup's
    ``cgroup.procs`` files the launcher joins. ``path_dirs``: the entries of
    the host's PATH that are directories. ``info_fd``: see ``build_launch_spec``.
    """

    bwrap: str
    host: HostView
    uid: int | None
    stage_dir: str | None
    control_fd: int
    dial_fd: int | None
    seccomp_fd: int | None
    cgroup_procs: tuple[str, ...]
    host_env: Mapping[str, str]
    path_dirs: frozenset[str]
    landlock_min_abi: int
    capture: dict[str, object] | None
    helper_code: str
    info_fd: int | None = None


@dataclass(frozen=True, kw_only=True)
class LinuxPlan:
    """A session's launch, whole: what the harness runs (``launch`` first, when
    ``launch.needed``), the fds it passes, every command's environment."""

    spec: LaunchSpec
    launch: Launch
    pass_fds: tuple[int, ...]
    env: Mapping[str, str]

    @property
    def argv(self) -> tuple[str, ...]:
        return self.spec.argv

    def to_data(self) -> dict[str, object]:
        return {"argv": list(self.argv), "launch": self.launch.to_data(),
                "pass_fds": list(self.pass_fds), "env": dict(self.env),
                "stage": [[b.source, b.staged, b.directory] for b in self.spec.stage],
                "exposed": list(self.spec.exposed)}


def readonly_roots(profile: SandboxProfile, host: HostView) -> tuple[list[str], tuple[str, ...]]:
    """The trees bound read-only (the profile's, lent ones included, plus the helper's Python
    installation when none covers it), and those beyond the system directories (``exposed``)."""
    readonly = list(profile.fs.readonly) + [p for p in profile.fs.lent
                                            if p not in profile.fs.readonly]
    if not any(is_under(host.prefix, r) for r in readonly):
        readonly.append(host.prefix)
    return readonly, tuple(p for p in readonly if p not in SYSTEM_READONLY)


def command_environment(profile: SandboxProfile, proxy: ProxyEndpoint | None, *,
                        host_env: Mapping[str, str], prefix: str,
                        path_dirs: frozenset[str]) -> dict[str, str]:
    """Every command's environment where the proxy relay is 127.0.0.1:``PROXY_PORT`` inside
    (linux, and gvisor, which runs the same helper)."""
    fs = profile.fs
    return build_environment(
        host_env,
        path=inside_path(host_env.get("PATH", ""), (*fs.readonly, prefix), path_dirs),
        home=fs.sandbox_home,
        tmpdir=SANDBOX_TMP,
        proxy_url=f"http://127.0.0.1:{PROXY_PORT}" if proxy is not None else None,
        inspected=proxy is not None and proxy.trust_bundle is not None,
        placeholders=dict(proxy.placeholders) if proxy is not None else None,
        toolchains=fs.toolchain_env,
    )


def inside_path(host_path: str, visible: Sequence[str], dirs: frozenset[str]) -> list[str]:
    """The host PATH, kept to the directories (``dirs``) that exist inside the sandbox."""
    kept: list[str] = []
    for entry in host_path.split(":"):
        if entry.startswith("/") and any(is_under(entry, r) for r in visible) \
                and entry in dirs and entry not in kept:
            kept.append(entry)
    return kept


def prepare(profile: SandboxProfile, proxy: ProxyEndpoint | None, facts: LinuxFacts) -> LinuxPlan:
    """The launch of one linux session, as a pure function of the profile and the facts.

    A root harness, or one with a session cgroup, launches bubblewrap through
    ``launch`` (see ``launcher``), which joins the cgroup, stages the sources
    the uid cannot walk to and drops to that uid before the exec.
    """
    config = helper_config(profile, control_fd=facts.control_fd, dial_fd=facts.dial_fd,
                           landlock_min_abi=facts.landlock_min_abi, capture=facts.capture)
    spec = build_launch_spec(profile, host=facts.host, helper_code=facts.helper_code,
                             config=config, seccomp_fd=facts.seccomp_fd,
                             stage_dir=facts.stage_dir, bwrap=facts.bwrap,
                             trust_bundle=proxy.trust_bundle if proxy is not None else None,
                             info_fd=facts.info_fd)
    launch = Launch(cgroup_procs=facts.cgroup_procs, uid=facts.uid,
                    stage_dir=facts.stage_dir if facts.uid is not None else None,
                    stage=tuple((b.source, b.staged, b.directory) for b in spec.stage)
                    if facts.uid is not None else ())
    pass_fds = tuple(fd for fd in (facts.control_fd, facts.dial_fd, facts.seccomp_fd,
                                   facts.info_fd) if fd is not None)
    env = command_environment(profile, proxy, host_env=facts.host_env, prefix=facts.host.prefix,
                              path_dirs=facts.path_dirs)
    return LinuxPlan(spec=spec, launch=launch, pass_fds=pass_fds, env=env)
