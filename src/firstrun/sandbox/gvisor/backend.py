"""The gvisor backend: one gVisor sandbox per session, on a kernel of its own, attested before use.

Guarantee: ``GvisorBackend.start`` returns a session only after the probe
inside proved the boundary (a kernel not the host's, loopback and the proxy
the only network, writes only to the workspace and tmpfs, the helper out of
reach, linux's seccomp filter loaded) and the host saw runsc's own filter and
no_new_privs on the sentry; otherwise it tears everything down and raises.
Commands never run as root; ``close`` ends every process the session started.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.fixes import apt_fix
from firstrun.policy.filesystem import SYSTEM_READONLY
from firstrun.policy.profile import LayerName, Provides, SandboxProfile, unprovided
from firstrun.sandbox import attest as attestation
from firstrun.sandbox import attest_probe, bytecode, capture, helper
from firstrun.sandbox.base import (
    Capability,
    Check,
    Enforcement,
    LayerStatus,
    ProxyEndpoint,
    SessionInfo,
    StartPhases,
)
from firstrun.sandbox.channel import JsonLines, kill_and_wait
from firstrun.sandbox.gvisor import probe
from firstrun.sandbox.gvisor.spec import (
    CGROUP_PARENT,
    PROXY_PORT,
    SANDBOX_TMP,
    GvisorFacts,
    GvisorPlan,
    prepare,
)
from firstrun.sandbox.linux import seccomp
from firstrun.sandbox.linux.spec import HostView
from firstrun.sandbox.ownership import alive, pick_uid, process_identity, recover
from firstrun.sandbox.protect import describe as describe_protection
from firstrun.sandbox.supervised import READY_TIMEOUT_S, LaunchedSession, take_workspace

HELPER_SOURCE = bytecode.source(helper)
# One directory per session: its runsc state, its bundle and who owns it.
SESSIONS_DIR = "/run/firstrun/gvisor"
_OWNER_FILE = "owner"
# A session directory still being made, not yet with its owner file.
_STAGING = ".staging-"
# Per-session uids for a root-owned workspace, as the linux backend's.
_UID_RANGE = (1_500_000_000, 1_600_000_000)
_RUNSC_TIMEOUT_S = 30.0
_CGROUP_ROOT = "/sys/fs/cgroup"

PROVIDES: Provides = {
    LayerName.NAMESPACES: "gVisor sandbox (its own kernel, the sentry)",
    LayerName.LANDLOCK: "read-only root + tmpfs",
    LayerName.SECCOMP: f"seccomp-bpf in the sentry ({len(seccomp.RULES)} rules, "
                       "the linux backend's filter)",
    LayerName.NETWORK: "no network (--network=none) + the proxy's sockets bound in, "
                       "+ nat capture in the sentry's netstack",
    LayerName.LIMITS: "container cgroup + rlimits",
    LayerName.UNPRIVILEGED: "non-root uid, no capabilities",
}


# Every OSError met while launching or talking to the sandbox becomes a SandboxError; a
# non-zero exit in an ExecResult is a command that failed, never a sandbox that failed.
def _sandbox_error(what: str, exc: BaseException) -> SandboxError:
    return SandboxError(f"{what}: {exc}", who="gvisor")


def _runsc(runsc: str, state_root: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([runsc, "--root", state_root, *args], capture_output=True, text=True,
                          timeout=_RUNSC_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)


def _remove_container(runsc: str, session_dir: str, container_id: str) -> None:
    """Kill the container if it runs, delete its state, then its cgroups."""
    state_root = os.path.join(session_dir, "state")
    if os.path.isdir(state_root):
        try:
            listed = _runsc(runsc, state_root, "list", "-quiet").stdout.split()
            for name in listed:
                _runsc(runsc, state_root, "kill", name, "KILL")
                _runsc(runsc, state_root, "delete", "--force", name)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise _sandbox_error(f"cannot remove gVisor container {container_id}", exc) from exc
    _remove_cgroups(container_id)


def _remove_cgroups(container_id: str) -> None:
    try:
        controllers = os.listdir(_CGROUP_ROOT)
    except OSError:
        return
    for controller in controllers:
        path = os.path.join(_CGROUP_ROOT, controller, CGROUP_PARENT.lstrip("/"), container_id)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            # Still populated means still running: runsc delete is what ends it.
            continue


# A harness that dies leaves the helper reading EOF on its channel, so the sandbox ends by
# itself; whatever a SIGKILL left anyway (a state directory, a stopped container, an empty
# cgroup, a lent workspace) the next start on this host reaps, by the dead harness's
# identity.
def reap(runsc: str) -> tuple[str, ...]:
    """Remove every session a dead harness left: its container, state, cgroups and directory.

    A workspace it had lent is given back by ``ownership.recover``, after this.
    """
    try:
        names = os.listdir(SESSIONS_DIR)
    except FileNotFoundError:
        return ()
    reaped = []
    for name in names:
        session_dir = os.path.join(SESSIONS_DIR, name)
        try:
            owner = Path(session_dir, _OWNER_FILE).read_text(encoding="utf-8").strip()
        except OSError:
            owner = ""
        if owner and alive(owner):
            continue
        if not owner and name.startswith(_STAGING):
            continue  # another harness's claim in flight (see _claim_session_dir)
        _remove_container(runsc, session_dir, name)
        shutil.rmtree(session_dir, ignore_errors=True)
        reaped.append(name)
    return tuple(reaped)


def _claim_session_dir(container_id: str) -> str:
    """The session's directory, its owner file already in it when it appears under its name.

    Made under a staging name and renamed: a concurrent harness's ``reap``
    must never see a session's directory without its owner and take it for
    a dead harness's (two gvisor runs of one sweep start at once).
    """
    identity = process_identity(os.getpid())
    if identity is None:
        raise SandboxError("cannot read this process's own /proc entry", who="gvisor")
    os.makedirs(SESSIONS_DIR, mode=0o700, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=_STAGING, dir=SESSIONS_DIR)
    try:
        Path(staging, _OWNER_FILE).write_text(identity + "\n", encoding="utf-8")
        session_dir = os.path.join(SESSIONS_DIR, container_id)
        os.rename(staging, session_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return session_dir


def _make_skeleton(plan: GvisorPlan) -> None:
    """The root's mount points and symlinks, in a directory of the session's own.

    runsc creates a missing mount point inside ``root.path`` on the host
    even when the root is read-only, so the root is never a shared tree.
    """
    for path, kind, target in plan.skeleton:
        where = os.path.join(plan.rootfs, path.lstrip("/"))
        os.makedirs(os.path.dirname(where), exist_ok=True)
        if kind == "link":
            os.symlink(target, where)
        elif kind == "dir":
            os.makedirs(where, exist_ok=True)
        else:
            with open(where, "x"):
                pass


def sentry_pid(runsc: str, state_root: str, container_id: str) -> int:
    """The sentry's host pid: the process that is the sandbox's kernel."""
    # runsc saves the container's pid only once its start returns, which may
    # be after the helper inside already said it is ready.
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            done = _runsc(runsc, state_root, "state", container_id)
            pid = json.loads(done.stdout or "{}").get("pid")
        except (OSError, ValueError, AttributeError, subprocess.TimeoutExpired) as exc:
            raise _sandbox_error("cannot find the sandbox's sentry", exc) from exc
        if isinstance(pid, int) and pid > 0:
            return pid
        if time.monotonic() > deadline:
            raise SandboxError(f"runsc never said which process is the sentry: "
                               f"{(done.stdout + done.stderr).strip()[-300:]}", who="gvisor")
        time.sleep(0.02)


def _seccomp_bpf(profile: SandboxProfile) -> bytes | None:
    """The linux backend's filter as BPF, when the profile requires the layer.

    A filter that cannot be built refuses the session, unless the profile
    downgrades the layer explicitly (then the session is recorded so).
    """
    if LayerName.SECCOMP not in profile.required:
        return None
    try:
        return seccomp.filter_program()
    except SandboxError as exc:
        if LayerName.SECCOMP in profile.downgrades:
            return None
        raise SandboxUnavailable(f"seccomp: {exc}", who="gvisor",
                                 fix=apt_fix("libseccomp2")) from exc


def _sentry_seccomp_check(pid: int) -> Check:
    """From the host: the sentry runs under runsc's seccomp filter with no_new_privs."""
    name = "sentry_seccomp_loaded"
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    except OSError as exc:
        return Check(name=name, passed=False, detail=f"cannot read the sentry: {exc}")
    seccomp, nnp = status.get("Seccomp", "?").strip(), status.get("NoNewPrivs", "?").strip()
    return Check(name=name, passed=seccomp == "2" and nnp == "1",
                 detail=f"the sentry (host pid {pid}, uid {status.get('Uid', '?').split()[0]}): "
                        f"Seccomp {seccomp}, NoNewPrivs {nnp}")


class GvisorSession(LaunchedSession):
    """A running gVisor sandbox and the helper that is its init.

    The process is runsc; the sentry and gofer die with it (their
    parent-death signal).
    """

    who = "gvisor"

    def __init__(self, *, process: subprocess.Popen[bytes], control: socket.socket,
                 env: dict[str, str], profile: SandboxProfile, info: SessionInfo,
                 stderr_file: IO[bytes], cleanup: ExitStack) -> None:
        super().__init__(process=process, channel=JsonLines(control, peer="the gVisor helper"),
                         env=env, profile=profile, info=info, output=stderr_file,
                         cleanup=cleanup)
        # The sentry's host pid, once the sandbox is up: gone when the session is.
        self.pid: int | None = None


class GvisorBackend:
    """runsc: gVisor's user-space kernel, no network but the proxy's sockets, a read-only root."""

    name = "gvisor"

    def probe(self) -> tuple[Capability, ...]:
        return probe.probe()

    def start(self, profile: SandboxProfile, *, proxy: ProxyEndpoint | None) -> GvisorSession:
        phases = StartPhases()
        capturing = proxy is not None and proxy.captures
        missing = probe.unusable(capturing=capturing)
        if missing is not None:
            raise SandboxUnavailable(f"{missing.name}: {missing.detail}", who="gvisor",
                                     fix=missing.fix)
        lacking = unprovided(profile, PROVIDES)
        if lacking:
            raise SandboxUnavailable(f"the gvisor backend cannot enforce {', '.join(lacking)}",
                                     who="gvisor", fix="use a backend that provides it "
                                     "(firstrun doctor), or --allow-downgrade it, recorded")
        fs = profile.fs
        if not os.path.isdir(fs.workspace):
            raise SandboxError(f"workspace {fs.workspace} is not a directory", who="gvisor")
        runsc = probe.find_runsc()
        assert isinstance(runsc, probe.Runsc)  # unusable() above said it is usable
        tools = capture.find_gvisor_tools() if capturing else None
        assert not isinstance(tools, str)  # unusable() above found them
        phases.mark("probed")
        reap(runsc.path)
        # After the reap: a dead harness's sandbox is gone before its workspace
        # changes owner again.
        recover(who="gvisor")
        phases.mark("reaped")
        seccomp_bpf = _seccomp_bpf(profile)
        interpreter = os.path.realpath(sys.executable)
        prefix = os.path.realpath(sys.base_prefix)
        paths = (*fs.readonly, *fs.lent, *fs.hidden, prefix)
        host = HostView(
            symlinks=tuple((p, os.readlink(p)) for p in fs.readonly
                           if p in SYSTEM_READONLY and os.path.islink(p)),
            directories=frozenset(p for p in paths if os.path.isdir(p) and not os.path.islink(p)),
            interpreter=interpreter, prefix=prefix)
        st = os.lstat(fs.workspace)
        owner = (st.st_uid, st.st_gid)
        container_id = f"firstrun-{uuid.uuid4().hex[:12]}"
        with ExitStack() as acquired:
            session_dir = _claim_session_dir(container_id)
            acquired.callback(shutil.rmtree, session_dir, ignore_errors=True)
            # The helper (the container's init) runs each command as the workspace owner's
            # uid or, for a root-owned workspace, as a per-session uid lent the workspace
            # and given back at close.
            lent = pick_uid(_UID_RANGE, who="gvisor") if owner[0] == 0 else None
            uid = lent if lent is not None else owner[0]
            take_workspace(acquired, fs, lent=lent, owner=owner, who="gvisor")
            # Before the workspace is given back: nothing of the sandbox is left to write it.
            # On close the helper kills what commands left, runsc takes the sandbox down
            # with its init, and ``runsc delete`` removes the container's state and cgroups.
            acquired.callback(_remove_container, runsc.path, session_dir, container_id)
            bundle = os.path.join(session_dir, "bundle")
            state_root = os.path.join(session_dir, "state")
            host_path = os.environ.get("PATH", "")
            plan = prepare(profile, proxy, GvisorFacts(
                runsc=runsc.path, platform=runsc.platform,
                state_root=state_root, bundle=bundle,
                container_id=container_id, uid=uid, host=host,
                sockets=_sockets(proxy), host_env=os.environ,
                path_dirs=frozenset(e for e in host_path.split(":") if os.path.isdir(e)),
                cpus=float(os.cpu_count() or 1), helper_source=HELPER_SOURCE, capture=tools,
                seccomp_bpf=seccomp_bpf))
            try:
                os.mkdir(bundle, mode=0o700)
                _make_skeleton(plan)
                Path(bundle, "config.json").write_text(json.dumps(plan.config), encoding="utf-8")
            except OSError as exc:
                raise _sandbox_error("cannot write the sandbox's bundle", exc) from exc
            phases.mark("staged")
            control, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            acquired.callback(control.close)
            # Appended to: the sentry writes a regular file at its own offset,
            # over what runsc wrote, unless the file is opened to append.
            stderr_file = tempfile.TemporaryFile(mode="a+b")  # noqa: SIM115 (closed by the stack)
            acquired.callback(stderr_file.close)
            try:
                process = subprocess.Popen(plan.argv, stdin=child, stdout=child,
                                           stderr=stderr_file, env={}, close_fds=True)
            except OSError as exc:
                raise _sandbox_error("cannot launch runsc", exc) from exc
            finally:
                child.close()
            acquired.callback(kill_and_wait, process)
            phases.mark("launched")
            session = GvisorSession(
                process=process, control=control, env=dict(plan.env), profile=profile,
                info=SessionInfo(backend=self.name, enforcement=Enforcement.ENFORCED,
                                 policy_hash=profile.policy_hash()),
                stderr_file=stderr_file, cleanup=acquired.pop_all())
        try:
            session.await_ready()
            phases.mark("ready")
            # runsc answers where the sentry is while the probe runs inside:
            # neither waits for the other, and the host-side check needs both.
            with ThreadPoolExecutor(max_workers=1) as pool:
                sentry = pool.submit(sentry_pid, runsc.path, state_root, container_id)
                checks = attestation.attest(session, attestation.AttestPlan(
                    python=interpreter, workspace=fs.sandbox_workspace,
                    real_homes=fs.real_homes, exposed=plan.exposed,
                    proxy_port=PROXY_PORT if proxy is not None else None,
                    nonce=proxy.nonce if proxy is not None else None, landlock=False,
                    network="captured" if capturing else "loopback_only", supervisor="sentry",
                    seccomp=seccomp_bpf is not None,
                    protected=fs.protected, foreign_kernel=attest_probe.host_kernel()))
                session.pid = sentry.result()
            checks += (_sentry_seccomp_check(session.pid),)
            # No filter (the profile leaves seccomp out, or downgrades it and it could not be
            # built): the session is recorded as downgraded.
            downgrades = () if seccomp_bpf is not None else (LayerName.SECCOMP.value,)
            session.info = SessionInfo(
                backend=self.name,
                enforcement=Enforcement.DOWNGRADED if downgrades else Enforcement.ENFORCED,
                policy_hash=profile.policy_hash(),
                layers=_layers(profile, runsc=runsc, uid=uid, lent=lent is not None,
                               proxy=proxy is not None, capturing=capturing,
                               seccomp_applied=seccomp_bpf is not None),
                attestation=checks, exposed=plan.exposed, downgrades=downgrades)
            attestation.require_passed(checks)
            phases.mark("attested")
            session.start_phases = phases
        except BaseException:
            session.close()
            raise
        return session


def _sockets(proxy: ProxyEndpoint | None) -> dict[str, str]:
    """The proxy's listeners by the helper's kinds, capture's too when the proxy offers them."""
    if proxy is None:
        return {}
    if proxy.transparent_path is not None and proxy.dns_path is not None:
        return {"c": proxy.socket_path, "t": proxy.transparent_path, "d": proxy.dns_path}
    return {"c": proxy.socket_path}


def _layers(profile: SandboxProfile, *, runsc: probe.Runsc, uid: int, lent: bool,
            proxy: bool, capturing: bool, seccomp_applied: bool) -> tuple[LayerStatus, ...]:
    fs = profile.fs
    limits = profile.limits
    writable = ", ".join([fs.sandbox_workspace, SANDBOX_TMP, fs.sandbox_home, "/dev/shm"])
    details = {
        LayerName.NAMESPACES: f"runsc {runsc.release.isoformat()} on the {runsc.platform} "
                              "platform: commands' system calls are answered by gVisor's "
                              "sentry, not the host kernel; pid, mount, ipc, uts and net "
                              "namespaces" + describe_protection(fs),
        LayerName.LANDLOCK: f"in place of Landlock (the sentry has none): the root is "
                            f"read-only; writable only {writable}",
        LayerName.SECCOMP: (f"the linux backend's {len(seccomp.RULES)} rules (ptrace, "
                            "process_vm_*, namespaces, mounts, io_uring, bpf, keyrings, "
                            "TIOCSTI, ...), compiled to the same BPF and loaded into the "
                            "sentry by the helper before any command, each refusal with "
                            "linux's errno (seccomp_loaded)" if seccomp_applied else
                            "omitted: the profile leaves it out, or downgrades it; gVisor's "
                            "own syscall surface answers")
                           + "; beneath, the sentry and gofer run under runsc's own host "
                             "filter (sentry_seccomp_loaded)",
        LayerName.NETWORK: ("every flow and DNS query captured by nat rules in the sentry's "
                            "netstack and relayed to the egress proxy's sockets"
                            if capturing else
                            f"only 127.0.0.1:{PROXY_PORT}, relayed to the egress proxy's socket")
                           if proxy else "no egress at all (no proxy)",
        LayerName.LIMITS: f"memory {limits.memory_bytes} bytes and the host's CPUs, by the "
                          f"container's cgroup (beneath {CGROUP_PARENT}); inside, rlimits per "
                          f"process: nproc {limits.pids}, data {limits.memory_bytes} bytes, "
                          f"open files {limits.open_files}; output {limits.output_bytes} bytes "
                          "per stream",
        LayerName.UNPRIVILEGED: (f"per-session uid {uid}, lent the workspace" if lent
                                 else f"the workspace owner's uid {uid}")
                                + "; no capabilities, no supplementary groups",
    }
    return tuple(LayerStatus(name=layer, applied=seccomp_applied or layer is not LayerName.SECCOMP,
                             mechanism=PROVIDES[layer], detail=details[layer])
                 for layer in LayerName)
