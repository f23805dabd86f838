"""The linux backend: one bubblewrap sandbox per session, attested before use.

Guarantee: ``LinuxBackend.start`` returns a session only after the helper
inside confirmed every required layer (or the profile explicitly downgraded
it, which is recorded) and the attestation probe proved the boundary from
inside; otherwise it tears everything down and raises ``SandboxError``.
Commands never run as the invoking root; ``close`` ends every process the
session started, daemons included.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from typing import IO

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.fixes import apt_fix
from firstrun.policy.filesystem import SYSTEM_READONLY
from firstrun.policy.process import Limits
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox import attest as attestation
from firstrun.sandbox import bytecode, capture, helper
from firstrun.sandbox.base import (
    Capability,
    Enforcement,
    LayerStatus,
    ProxyEndpoint,
    SessionInfo,
    StartPhases,
)
from firstrun.sandbox.channel import JsonLines, kill_and_wait
from firstrun.sandbox.linux import cgroup, launcher, probe, seccomp
from firstrun.sandbox.linux.spec import (
    PROXY_PORT,
    SANDBOX_TMP,
    WRITABLE_DEVICE_DIRS,
    HostView,
    LinuxFacts,
    prepare,
)
from firstrun.sandbox.ownership import kill_uid, pick_uid, recover
from firstrun.sandbox.protect import describe as describe_protection
from firstrun.sandbox.supervised import READY_TIMEOUT_S, LaunchedSession, tail_of, take_workspace

# Per-session uids for a root harness: far above any distribution's ranges
# and the usual subuid blocks, and unique per live session.
_UID_RANGE = (1_500_000_000, 1_600_000_000)
# The layers a profile may leave out of ``required`` (the audit's knob); the
# rest are bubblewrap itself, the uid and the limits, which are always applied.
# Seccomp, Landlock and the network namespace are applied exactly when the profile's
# ``required`` set names them. Only ``firstrun audit`` builds profiles that leave some out,
# to measure what each one stops; such a session records each omitted layer as not applied
# and downgraded, so it can never pass for an enforced one.
_OMITTABLE = frozenset({LayerName.SECCOMP, LayerName.LANDLOCK, LayerName.NETWORK})
_OMITTED = "omitted: not in the profile's required layers (an audit configuration)"
CAPTURE_PORTS = capture.CapturePorts()


# Every OSError met while launching or talking to the sandbox becomes a SandboxError, so
# callers see one error type for a sandbox that failed; a non-zero exit in an ExecResult is a
# command that failed, never a sandbox that failed.
def _sandbox_error(what: str, exc: OSError) -> SandboxError:
    return SandboxError(f"{what}: {exc}", who="linux")


def _serve_dial(sock: socket.socket, paths: dict[bytes, str]) -> None:
    """Hand the helper one fresh proxy connection per request; the only way out.

    The request's one byte says which of the proxy's listeners: ``c`` for a
    proxy-aware client, ``t`` for a redirected flow, ``d`` for DNS.
    """
    while True:
        try:
            kind = sock.recv(1)
        except OSError:
            return
        if not kind:
            return
        path = paths.get(kind)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if path is None:
                raise OSError(f"no listener of kind {kind!r}")
            upstream.connect(path)
        except OSError:
            upstream.close()
            try:
                sock.send(b"e")
            except OSError:
                return
            continue
        try:
            socket.send_fds(sock, [b"k"], [upstream.fileno()])
        except OSError:
            return
        finally:
            upstream.close()


# The sandbox uid must walk to the stage after the launcher drops root, so
# the stage cannot live under TMPDIR, which may be 0700 (pytest's is). Under
# /run it is beside other runtime state, and empty on the host either way:
# the launcher mounts the stage's tmpfs in its own mount namespace.
_STAGE_PARENTS = ("/run/firstrun", "/tmp")


def _stage_parent() -> str:
    for parent in _STAGE_PARENTS:
        try:
            os.makedirs(parent, mode=0o711, exist_ok=True)
        except OSError:
            continue
        if _walkable_by_anyone(parent):
            return parent
    raise SandboxUnavailable(
        "no directory the sandbox uid can reach to stage binds in "
        f"(tried {', '.join(_STAGE_PARENTS)})",
        who="linux", fix="make /run or /tmp world-searchable (mode o+x)")


def _walkable_by_anyone(path: str) -> bool:
    here = os.path.abspath(path)
    while True:
        if not os.stat(here).st_mode & 0o001:
            return False
        if here == "/":
            return True
        here = os.path.dirname(here)


def _child_pid(info_fd: int, deadline: float, stderr: IO[bytes]) -> int:
    """The pid of bubblewrap's child, as its ``--info-fd`` says once the namespaces exist."""
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([info_fd], [], [], remaining)[0]:
            raise SandboxError("bubblewrap did not say its child's pid in time", who="linux")
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        raise SandboxError(f"the sandbox did not start: {tail_of(stderr) or data!r}",
                           who="linux") from None


_NS_GET_USERNS = 0xB701


def _capture_early(info_fd: int, bwrap_pid: int, stderr: IO[bytes]) -> capture.LinuxCapture:
    """Open the sandbox's network namespace as soon as it exists, and start loading
    capture's tables into it while bubblewrap and the helper set up.

    The namespace is opened by the child's pid, then the pid is checked to
    still be bubblewrap's child, so the descriptor is the namespace the
    helper and every command run in (bubblewrap never makes another). A
    harness that is not root also enters the user namespace that owns it
    (``NS_GET_USERNS``), where it holds CAP_NET_ADMIN because it made it.
    """
    pid = _child_pid(info_fd, time.monotonic() + READY_TIMEOUT_S, stderr)
    try:
        net_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _sandbox_error("cannot open the sandbox's network namespace", exc) from exc
    try:
        if _children(bwrap_pid) != [pid]:
            raise SandboxError(f"the sandbox did not start: bubblewrap's child {pid} ended "
                               f"during its setup: {tail_of(stderr)}", who="linux")
        user_fd = None
        if os.geteuid() != 0:
            user_fd = fcntl.ioctl(net_fd, _NS_GET_USERNS)
            os.set_inheritable(user_fd, False)
        lane = capture.LinuxCapture(CAPTURE_PORTS, net_fd=net_fd, user_fd=user_fd)
    except BaseException:
        os.close(net_fd)
        raise
    lane.start()
    return lane


class _Routes:
    """Capture's routes, loaded (``LinuxCapture.finish``) in a thread beside the probe.

    A failure ends the sandbox at once, so the probe waiting for the routes
    does not wait out its deadline; ``wait`` raises it.
    """

    def __init__(self, lane: capture.LinuxCapture, *, ipv6: bool, session: LinuxSession,
                 phases: StartPhases) -> None:
        self._failed: list[BaseException] = []

        def load() -> None:
            try:
                lane.finish(ipv6=ipv6)
            except BaseException as exc:  # raised by wait, in the starting thread
                self._failed.append(exc)
                session.interrupt()
                return
            phases.mark("capture_loaded")

        self._thread = threading.Thread(target=load, name="firstrun-capture-routes",
                                        daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def wait(self) -> None:
        self.join()
        if self._failed:
            raise self._failed[0]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError as exc:
        raise SandboxError(f"cannot find the sandbox's process: {exc}", who="linux") from exc


class LinuxSession(LaunchedSession):
    """A running bubblewrap sandbox and the helper inside it."""

    who = "linux"

    def __init__(
        self,
        *,
        process: subprocess.Popen[bytes],
        control: socket.socket,
        env: dict[str, str],
        profile: SandboxProfile,
        info: SessionInfo,
        sandbox_uid: int | None,
        stderr_file: IO[bytes],
        session_cgroup: cgroup.SessionCgroup | None,
        cleanup: ExitStack,
    ) -> None:
        super().__init__(process=process, channel=JsonLines(control, peer="the sandbox helper"),
                         env=env, profile=profile, info=info, output=stderr_file,
                         cleanup=cleanup)
        # The session-wide memory and pids caps, or None when only rlimits
        # apply; public so a caller can read the kernel's own counters.
        # Memory and pids are capped for the session as a whole where the machine allows a
        # session cgroup (see ``cgroup``); the ``limits`` layer records which mechanism
        # enforced them.
        self.cgroup = session_cgroup
        self._sandbox_uid = sandbox_uid

    def _end(self) -> None:
        """Kill bubblewrap (its pid namespace's init dies with it, and so does every process
        in the namespace), everything in the session cgroup and, for a root harness, every
        process of the session's uid; then remove the cgroup."""
        # The helper kills everything it can see; bubblewrap's pid namespace takes the rest
        # (setsid or double-forked daemons) down with it; the cgroup catches anything that
        # escaped the namespace, and a root harness's per-session uid is swept last.
        super()._end()
        if self.cgroup is not None:
            self.cgroup.kill_and_remove()
        if self._sandbox_uid is not None:
            kill_uid(self._sandbox_uid)

    def _refused(self, ready: dict) -> SandboxError:
        if ready.get("landlock"):
            return SandboxUnavailable(
                f"Landlock is required and could not be applied: {ready.get('error')}",
                who="linux",
                fix="boot a kernel with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y, "
                    "'landlock' in lsm=), or downgrade explicitly and accept the recorded "
                    "downgrade",
            )
        return super()._refused(ready)


class LinuxBackend:
    """bubblewrap + Landlock + seccomp + an empty network namespace + a proxy relay.

    ``landlock_min_abi`` is the Landlock ABI the helper must find; raising it
    above the kernel's makes Landlock unavailable for real, which is how the
    fail-closed path is tested.
    """

    name = "linux"

    def __init__(self, *, landlock_min_abi: int = 1) -> None:
        self._landlock_min_abi = landlock_min_abi

    def probe(self) -> tuple[Capability, ...]:
        return probe.probe()

    def start(self, profile: SandboxProfile, *, proxy: ProxyEndpoint | None) -> LinuxSession:
        phases = StartPhases()
        bwrap = probe.bwrap_path()
        if bwrap is None:
            raise SandboxUnavailable("bubblewrap is not installed", who="linux",
                                     fix=apt_fix("bubblewrap"))
        if not os.path.isdir(profile.fs.workspace):
            raise SandboxError(f"workspace {profile.fs.workspace} is not a directory",
                               who="linux")
        if LayerName.NETWORK not in profile.required and proxy is not None:
            raise SandboxError("a profile without the network layer shares the host's network "
                               "and takes no proxy endpoint", who="linux")
        seccomp_fd: int | None = None
        downgrades = [layer.value for layer in sorted(_OMITTABLE - profile.required)]
        try:
            if LayerName.SECCOMP in profile.required:
                seccomp_fd = seccomp.compile_filter()
        except SandboxError as exc:
            if LayerName.SECCOMP not in profile.downgrades:
                raise SandboxUnavailable(f"seccomp: {exc}", who="linux",
                                         fix=apt_fix("libseccomp2")) from exc
            downgrades.append(LayerName.SECCOMP.value)
        phases.mark("seccomp_compiled")
        try:
            return self._launch(profile, proxy, bwrap, seccomp_fd, downgrades, phases)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def _launch(self, profile: SandboxProfile, proxy: ProxyEndpoint | None, bwrap: str,
                seccomp_fd: int | None, downgrades: list[str],
                phases: StartPhases) -> LinuxSession:
        fs = profile.fs
        root = os.geteuid() == 0
        interpreter = os.path.realpath(sys.executable)
        prefix = os.path.realpath(sys.base_prefix)
        paths = (*fs.readonly, *fs.lent, *fs.hidden, prefix)
        host = HostView(
            symlinks=tuple((p, os.readlink(p)) for p in fs.readonly
                           if p in SYSTEM_READONLY and os.path.islink(p)),
            directories=frozenset(p for p in paths if os.path.isdir(p) and not os.path.islink(p)),
            interpreter=interpreter,
            prefix=prefix,
        )
        st = os.lstat(fs.workspace)
        owner = (st.st_uid, st.st_gid)
        if root:
            recover(who="linux")
        capturing = proxy is not None and proxy.captures
        # Each resource is registered with its undo as it is acquired, so a
        # launch that fails anywhere unwinds exactly what it took, in reverse,
        # and a session that starts takes the same stack as its close.
        with ExitStack() as acquired:
            uid = pick_uid(_UID_RANGE, who="linux") if root else None
            stage_dir = None
            if root:
                stage_dir = tempfile.mkdtemp(prefix="firstrun-stage-", dir=_stage_parent())
                acquired.callback(os.rmdir, stage_dir)
            control_parent, control_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            acquired.callback(control_parent.close)
            dial_parent = dial_child = None
            if proxy is not None:
                dial_parent, dial_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                acquired.callback(dial_parent.close)
            stderr_file = tempfile.TemporaryFile()
            acquired.callback(stderr_file.close)
            take_workspace(acquired, fs, lent=uid, owner=owner, who="linux", stage_dir=stage_dir)
            if uid is not None:
                # Before the workspace is given back: every process of the uid is gone.
                acquired.callback(kill_uid, uid)
            session_cgroup, no_cgroup = _session_cgroup(profile)
            if session_cgroup is not None:
                acquired.callback(session_cgroup.kill_and_remove)
            info_r = info_w = None
            if capturing:
                info_r, info_w = os.pipe2(os.O_CLOEXEC)
                acquired.callback(os.close, info_r)
            host_path = os.environ.get("PATH", "")
            plan = prepare(profile, proxy, LinuxFacts(
                bwrap=bwrap, host=host, uid=uid, stage_dir=stage_dir,
                control_fd=control_child.fileno(),
                dial_fd=dial_child.fileno() if dial_child is not None else None,
                seccomp_fd=seccomp_fd,
                cgroup_procs=tuple(session_cgroup.procs_files) if session_cgroup else (),
                host_env=os.environ,
                path_dirs=frozenset(e for e in host_path.split(":") if os.path.isdir(e)),
                landlock_min_abi=self._landlock_min_abi,
                capture=CAPTURE_PORTS.to_config(ipv6=True) if capturing else None,
                helper_code=bytecode.encoded(helper),
                info_fd=info_w,
            ))
            phases.mark("staged")
            try:
                process = subprocess.Popen(
                    plan.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=stderr_file, env={}, pass_fds=plan.pass_fds, close_fds=True,
                    preexec_fn=launcher.preexec(plan.launch) if plan.launch.needed else None)
            except OSError as exc:
                raise _sandbox_error("cannot launch bubblewrap", exc) from exc
            except subprocess.SubprocessError as exc:
                raise SandboxError(f"cannot launch bubblewrap: {tail_of(stderr_file) or exc}",
                                   who="linux") from exc
            finally:
                control_child.close()
                if dial_child is not None:
                    dial_child.close()
                if info_w is not None:
                    os.close(info_w)
            acquired.callback(kill_and_wait, process)
            lane = None
            if info_r is not None:
                lane = _capture_early(info_r, process.pid, stderr_file)
                acquired.callback(lane.close)
            phases.mark("launched")
            session = LinuxSession(
                process=process, control=control_parent, env=dict(plan.env), profile=profile,
                info=SessionInfo(backend=self.name, enforcement=Enforcement.ENFORCED,
                                 policy_hash=profile.policy_hash()),
                sandbox_uid=uid, stderr_file=stderr_file, session_cgroup=session_cgroup,
                cleanup=acquired.pop_all(),
            )
        routes: _Routes | None = None
        try:
            ready = self._await_ready(session)
            phases.mark("ready")
            # Evidence, not intent: bubblewrap (exec'd by the launched
            # process) is a member, so the caps recorded below are the ones in force.
            if session_cgroup is not None and not session_cgroup.holds(process.pid):
                raise SandboxError(f"the sandbox is not in its cgroup {session_cgroup.name}",
                                   who="linux")
            if dial_parent is not None and proxy is not None:
                dial_paths = {b"c": proxy.socket_path}
                if proxy.transparent_path is not None and proxy.dns_path is not None:
                    dial_paths.update({b"t": proxy.transparent_path, b"d": proxy.dns_path})
                threading.Thread(target=_serve_dial, args=(dial_parent, dial_paths),
                                 daemon=True, name="firstrun-dial").start()
            if lane is not None:
                # From outside, before any command: the namespace's nat rules
                # (loading since the launch), then its routes, while the probe
                # starts; its network checks wait for the routes.
                routes = _Routes(lane, ipv6=bool(ready.get("capture_ipv6")), session=session,
                                 phases=phases)
            abi = int(ready.get("landlock_abi", 0))
            if abi == 0 and LayerName.LANDLOCK.value not in downgrades:
                downgrades.append(LayerName.LANDLOCK.value)
            layers = _layers(profile, uid=uid, landlock_abi=abi,
                             landlock_error=ready.get("landlock_error", ""),
                             seccomp_applied=seccomp_fd is not None, proxy=proxy,
                             session_cgroup=session_cgroup, no_cgroup=no_cgroup)
            try:
                checks = attestation.attest(session, attestation.AttestPlan(
                    python=interpreter, workspace=fs.sandbox_workspace, real_homes=fs.real_homes,
                    exposed=plan.spec.exposed, proxy_port=PROXY_PORT if proxy is not None else None,
                    nonce=proxy.nonce if proxy is not None else None, landlock=abi > 0,
                    seccomp=seccomp_fd is not None,
                    network=("captured" if capturing else "loopback_only")
                    if LayerName.NETWORK in profile.required else "shared",
                    supervisor="same_uid", self_mem_sealed=abi > 0, protected=fs.protected,
                    harness_python=True, capture_loading=routes is not None,
                ))
            except SandboxError:
                if routes is not None:
                    # Capture's failure ended the sandbox under the probe: it is the cause.
                    routes.wait()
                raise
            if routes is not None:
                routes.wait()
            session.info = SessionInfo(
                backend=self.name,
                enforcement=Enforcement.DOWNGRADED if downgrades else Enforcement.ENFORCED,
                policy_hash=profile.policy_hash(), layers=layers, attestation=checks,
                exposed=plan.spec.exposed, downgrades=tuple(downgrades),
            )
            attestation.require_passed(checks)
            phases.mark("attested")
            session.start_phases = phases
        except BaseException:
            if routes is not None:
                # Before the close takes the namespace descriptors it uses.
                routes.join()
            session.close()
            raise
        return session

    @staticmethod
    def _await_ready(session: LinuxSession, _control: socket.socket | None = None) -> dict:
        """The helper's ready line, read from the session's channel (``_control``'s socket)."""
        return session.await_ready()

def _session_cgroup(profile: SandboxProfile) -> tuple[cgroup.SessionCgroup | None, str]:
    """A session cgroup with the profile's caps, or None and why there is none.

    Not having one is not a refusal: rlimits still cap every process, and
    the limits layer then records that they are all that enforces.
    """
    parent = cgroup.discover()
    if isinstance(parent, cgroup.NoCgroup):
        return None, parent.reason
    try:
        return cgroup.create(parent, memory_bytes=profile.limits.memory_bytes,
                             pids=profile.limits.pids), ""
    except OSError as exc:
        return None, f"cannot create a cgroup under {parent.memory}: {exc.strerror}"


def _limits_layer(limits: Limits, session_cgroup: cgroup.SessionCgroup | None,
                  no_cgroup: str) -> LayerStatus:
    inner = (f"rlimits per process: data {limits.memory_bytes} bytes, nproc {limits.pids}, "
             f"open files {limits.open_files}, core 0; output {limits.output_bytes} bytes "
             "per stream")
    if session_cgroup is not None:
        swap = "swap included" if session_cgroup.swap_capped else "swap NOT capped"
        return LayerStatus(
            name=LayerName.LIMITS, applied=True, mechanism=session_cgroup.mechanism,
            detail=f"session-wide: memory {limits.memory_bytes} bytes (anonymous, shared and "
                   f"tmpfs pages; {swap}), pids {limits.pids}, in "
                   f"{', '.join(session_cgroup.directories)}; inside it, {inner}")
    return LayerStatus(
        name=LayerName.LIMITS, applied=True, mechanism="rlimit (no writable cgroup)",
        detail=f"no session-wide cap ({no_cgroup}): memory is capped per process by "
               "RLIMIT_DATA (MAP_SHARED and tmpfs pages not counted; /tmp, /dev/shm and HOME "
               f"are each sized {limits.memory_bytes} bytes), pids by RLIMIT_NPROC on the "
               f"{'session' if os.geteuid() == 0 else 'invoking user'}'s uid; {inner}")


def _layers(profile: SandboxProfile, *, uid: int | None, landlock_abi: int, landlock_error: str,
            seccomp_applied: bool, proxy: ProxyEndpoint | None,
            session_cgroup: cgroup.SessionCgroup | None,
            no_cgroup: str) -> tuple[LayerStatus, ...]:
    fs = profile.fs
    writable = ", ".join([fs.sandbox_workspace, SANDBOX_TMP, fs.sandbox_home,
                          *WRITABLE_DEVICE_DIRS])
    limits = profile.limits
    return (
        LayerStatus(name=LayerName.NAMESPACES, applied=True, mechanism="bubblewrap",
                    detail=("user, mount, pid, ipc, uts, net and cgroup namespaces; "
                            if LayerName.NETWORK in profile.required
                            else "user, mount, pid, ipc, uts and cgroup namespaces; ")
                    + "nested user namespaces disabled" + describe_protection(fs)),
        LayerStatus(name=LayerName.LANDLOCK, applied=landlock_abi > 0,
                    mechanism=f"landlock ABI {landlock_abi}" if landlock_abi else "landlock",
                    detail=f"writes only beneath {writable}" if landlock_abi
                    else _OMITTED if LayerName.LANDLOCK not in profile.required
                    else f"not applied: {landlock_error}"),
        LayerStatus(name=LayerName.SECCOMP, applied=seccomp_applied, mechanism="seccomp-bpf",
                    detail=f"{len(seccomp.RULES)} deny rules" if seccomp_applied
                    else _OMITTED if LayerName.SECCOMP not in profile.required
                    else "not applied: libseccomp unavailable"),
        LayerStatus(name=LayerName.NETWORK, applied=True,
                    mechanism="empty network namespace",
                    detail=f"only 127.0.0.1:{PROXY_PORT}, relayed to the egress proxy"
                    if proxy is not None else "no egress at all (no proxy)")
        if LayerName.NETWORK in profile.required
        else LayerStatus(name=LayerName.NETWORK, applied=False,
                         mechanism="the host's network namespace", detail=_OMITTED),
        _limits_layer(limits, session_cgroup, no_cgroup),
        LayerStatus(name=LayerName.UNPRIVILEGED, applied=True,
                    mechanism=f"uid {uid}" if uid is not None else f"uid {os.geteuid()}",
                    detail="per-session unprivileged uid, no supplementary groups"
                    if uid is not None else "the invoking user's own uid; no capabilities"),
    )
