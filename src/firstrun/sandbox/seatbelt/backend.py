"""The macOS Seatbelt backend: every command under ``sandbox-exec``, attested before use.

Guarantee: ``SeatbeltBackend.start`` returns a session only after attestation,
under the very profile every command gets, proved the boundary from inside;
otherwise it removes what it made and raises. Layers Seatbelt cannot give are
refused unless downgraded, and then recorded. No command can change the next
one's profile. Stray processes are killed by an environment marker: a daemon
that scrubs its environment can outlive the session, still under the profile.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.policy.filesystem import is_under
from firstrun.policy.process import build_environment
from firstrun.policy.profile import LayerName, Provides, SandboxProfile, unprovided
from firstrun.sandbox import attest as attestation
from firstrun.sandbox.base import (
    Capability,
    Enforcement,
    ExecResult,
    LayerStatus,
    OutputCallback,
    ProxyEndpoint,
    SessionInfo,
    Stream,
    prepare_command,
)
from firstrun.sandbox.output import collect_streams
from firstrun.sandbox.seatbelt.profile import (
    MACH_SERVICES,
    SANDBOX_EXEC,
    WRITABLE_DEVICES,
    SeatbeltHost,
    SeatbeltSpec,
    build_seatbelt_spec,
)
from firstrun.sandbox.seatbelt.relay import ProxyRelay

WHO = "seatbelt"
# macOS has no pid namespace, so a command that leaves its process group (setsid, a double
# fork) is not taken down with it. Every command carries this marker, the session's random
# token and the command's number: a timeout kills the command's group and every process
# holding that command's marker (a server an earlier command started keeps running);
# interrupt and close kill every group and every process holding the session's token. A
# daemon that also scrubs its environment (env -i) escapes the sweep, and a harness killed
# with SIGKILL leaves its sessions' daemons running: macOS has nothing like PR_SET_PDEATHSIG
# or a cgroup to end them by. Those daemons stay inside the Seatbelt profile all the same.
MARKER_VARIABLE = "FIRSTRUN_SEATBELT_SESSION"
# Host directories that hold people's files outside the invoking user's
# home: every account's home (macOS keeps them all under /Users), other
# disks, and the shared temporary directories. The per-user temporary and
# cache root (``/private/var/folders/xx/yyyy``) is added by ``private_roots``
# from the harness's own TMPDIR.
SHARED_PRIVATE = ("/Users", "/Volumes", "/private/tmp", "/private/var/tmp")

_OTHER_BACKENDS = "use --backend linux or --backend docker on Linux"
_CANNOT = {
    LayerName.NAMESPACES: "macOS has no namespaces",
    LayerName.LIMITS: "macOS has no cgroups and does not enforce memory rlimits",
    LayerName.UNPRIVILEGED: "the harness runs as root, and Seatbelt cannot drop it",
}
_DOWNGRADE_FIX = ("pass --allow-downgrade {layers} to run with {them} recorded as not applied, "
                  "or use the linux or docker backend")


def provides(euid: int) -> Provides:
    """The layers Seatbelt gives, by mechanism; pure in the harness's euid."""
    given = {
        LayerName.LANDLOCK: "seatbelt file-write rules",
        LayerName.SECCOMP: "seatbelt deny-default",
        LayerName.NETWORK: "seatbelt network-outbound rule",
    }
    if euid != 0:
        given[LayerName.UNPRIVILEGED] = f"uid {euid}"
    return given


# Layers Seatbelt cannot give (namespaces, limits; unprivileged for a root harness) are
# refused before anything runs unless the profile downgrades them, and a session with a
# downgrade says so (Enforcement.DOWNGRADED).
def refusal(profile: SandboxProfile, euid: int) -> SandboxUnavailable | None:
    """Why ``profile`` cannot run under Seatbelt for this euid, with the fix; None if it can."""
    gaps = unprovided(profile, provides(euid))
    if not gaps:
        return None
    return SandboxUnavailable(
        "Seatbelt cannot provide required layers: "
        + "; ".join(f"{layer}: {_CANNOT[layer]}" for layer in gaps),
        who=WHO, fix=_DOWNGRADE_FIX.format(layers=" --allow-downgrade ".join(gaps),
                                           them="it" if len(gaps) == 1 else "them"))


def probe() -> tuple[Capability, ...]:
    """Off macOS, only why not; on macOS, sandbox-exec and a non-root harness."""
    if sys.platform != "darwin":
        return (Capability(name="macos", available=False,
                           detail=f"Seatbelt exists only on macOS; this is {sys.platform}",
                           fix=_OTHER_BACKENDS),)
    present = os.access(SANDBOX_EXEC, os.X_OK)
    euid = os.geteuid()
    return (
        Capability(name="macos", available=True, detail="Seatbelt is macOS's own sandbox"),
        Capability(name="sandbox_exec", available=present,
                   detail=f"{SANDBOX_EXEC} (deprecated by Apple, still shipped)" if present
                   else f"{SANDBOX_EXEC} is missing",
                   fix=None if present else
                   "sandbox-exec ships with macOS; without it use the docker backend"),
        Capability(name="unprivileged", available=euid != 0,
                   detail=f"commands run as uid {euid}",
                   fix=None if euid != 0 else
                   "run firstrun as your own user, not root: Seatbelt cannot drop root"),
    )


def private_roots(tmp_root: str) -> tuple[str, ...]:
    """The canonical private directories of this host that exist: the user's own
    temporary root (the parent of macOS's per-user ``.../T``) and ``SHARED_PRIVATE``."""
    found: list[str] = []
    user_tmp = os.path.realpath(tmp_root)
    if os.path.basename(user_tmp) == "T" and user_tmp.startswith("/private/var/folders/"):
        found.append(os.path.dirname(user_tmp))
    found += [p for p in SHARED_PRIVATE if os.path.isdir(p) and not os.path.islink(p)]
    return tuple(found)


def host_for(profile: SandboxProfile, *, session_dir: str, tmpdir: str,
             private: Sequence[str], readable: Sequence[str]) -> SeatbeltHost:
    """What the pure builder needs: every policy path resolved to the real path
    Seatbelt matches (symlinks followed, ``/var`` to ``/private/var``)."""
    fs = profile.fs
    paths = (fs.workspace, *fs.readonly, *fs.hidden, *fs.real_homes)
    canonical = tuple((p, os.path.realpath(p)) for p in dict.fromkeys(paths)
                      if os.path.realpath(p) != p)
    return SeatbeltHost(
        canonical=canonical,
        tmpdir=os.path.realpath(tmpdir),
        profile_file=os.path.join(os.path.realpath(session_dir), "profile.sb"),
        private=tuple(dict.fromkeys(os.path.realpath(p) for p in private)),
        readable=tuple(dict.fromkeys(os.path.realpath(p) for p in readable)),
    )


def exposed(spec: SeatbeltSpec) -> tuple[str, ...]:
    """What the profile lets a command read beneath a home or private directory."""
    return (*spec.named("TOOLCHAIN"), *spec.named("WRITABLE"))


def inside_path(host_path: str, spec: SeatbeltSpec) -> list[str]:
    """The host PATH, kept to the directories a command can read under the profile."""
    closed = (*spec.named("HOME"), *spec.named("PRIVATE"), *spec.named("HIDDEN"))
    kept: list[str] = []
    for entry in host_path.split(":"):
        if not entry.startswith("/") or not os.path.isdir(entry) or entry in kept:
            continue
        real = os.path.realpath(entry)
        if any(is_under(real, c) for c in closed) and not any(is_under(real, o) for o in exposed(spec)):
            continue
        kept.append(entry)
    return kept


def session_environment(host_env: Mapping[str, str], spec: SeatbeltSpec, *,
                        proxy_port: int | None, marker: str,
                        toolchains: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """Every command's environment: built from scratch, plus the session marker.

    HOME is ``home`` inside the sandbox's temporary directory (``prepare_session_dirs``
    makes it), so whatever a tool keeps in HOME is writable and private.
    """
    tmpdir = spec.named("WRITABLE")[1]
    env = build_environment(
        host_env, path=inside_path(host_env.get("PATH", ""), spec),
        home=os.path.join(tmpdir, "home"), tmpdir=tmpdir,
        proxy_url=f"http://127.0.0.1:{proxy_port}" if proxy_port is not None else None,
        toolchains=toolchains)
    env[MARKER_VARIABLE] = marker
    return env


def layers(profile: SandboxProfile, spec: SeatbeltSpec, *, euid: int,
           proxy_port: int | None) -> tuple[LayerStatus, ...]:
    given = provides(euid)
    workspace, tmpdir = spec.named("WRITABLE")
    details = {
        LayerName.NAMESPACES: "macOS has no namespaces: commands see the host's processes, "
                              "mounts and network interfaces; Seatbelt filters what they may "
                              "do with them, and a daemon that leaves its process group "
                              "outlives a command (swept by session marker at close)",
        LayerName.LANDLOCK: f"writes only beneath {workspace} and {tmpdir}, and to "
                            f"{', '.join(WRITABLE_DEVICES)}",
        LayerName.SECCOMP: f"every operation not allowed is refused: Mach services but "
                           f"{len(MACH_SERVICES)}, IOKit, sysctl writes, signals and process "
                           "inspection outside the sandbox, binds and inbound connections, "
                           "Unix sockets",
        LayerName.NETWORK: f"only localhost:{proxy_port}, relayed to the egress proxy; the "
                           "host's network stack is shared (no network namespace)"
                           if proxy_port is not None else "no network at all (no proxy)",
        LayerName.LIMITS: f"output capped at {profile.limits.output_bytes} bytes per stream; "
                          "memory and processes are not capped (macOS has no cgroups, does "
                          "not enforce RLIMIT_DATA or RLIMIT_AS on mmap, and counts "
                          "RLIMIT_NPROC over the whole user)",
        LayerName.UNPRIVILEGED: "the invoking user's own uid (Seatbelt cannot switch it); "
                                "setuid programs keep their bit but stay inside the profile"
                                if euid != 0 else "the harness runs as root",
    }
    return tuple(
        LayerStatus(name=layer, applied=layer in given,
                    mechanism=given.get(layer, "none"),
                    detail=details[layer] if layer in given else f"not applied: {details[layer]}")
        for layer in LayerName)


def attest_plan(spec: SeatbeltSpec, *, python: str, proxy_port: int | None,
                nonce: str | None,
                protected: tuple[tuple[str, str], ...] = ()) -> attestation.AttestPlan:
    """What the probe must prove under this profile, in the host's own paths.

    The private directories are checked like homes (unreadable). The write
    witness is the profile's own directory: this uid owns it, so only the
    profile can refuse a write there, which is also the proof that no
    command can replace the profile.
    """
    return attestation.AttestPlan(
        python=python, workspace=spec.named("WRITABLE")[0],
        real_homes=(*spec.named("HOME"), *spec.named("PRIVATE")), exposed=exposed(spec),
        proxy_port=proxy_port, nonce=nonce, landlock=False, network="profile_filtered",
        kernel="darwin", write_witness=os.path.dirname(spec.profile_file), supervisor="none",
        protected=protected)


class SeatbeltSession:
    """Commands under one Seatbelt profile, each its own ``sandbox-exec``."""

    def __init__(self, *, profile: SandboxProfile, spec: SeatbeltSpec, env: dict[str, str],
                 session_dir: str, relay: ProxyRelay | None, info: SessionInfo) -> None:
        self.info = info
        self.spec = spec
        self._profile = profile
        self._env = env
        self._marker = env[MARKER_VARIABLE]
        self._session_dir = session_dir
        self._relay = relay
        self._workspace = spec.named("WRITABLE")[0]
        self._groups: set[int] = set()
        self._commands = 0
        self._lock = threading.Lock()
        self._closed = False
        self._cleaned = False

    def __enter__(self) -> SeatbeltSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        cmd = prepare_command(command, cwd=cwd, timeout=timeout, env=env, session_env=self._env,
                              workspace=self._workspace,
                              default_timeout=self._profile.limits.command_timeout_s, who=WHO)
        merged = cmd.env
        with self._lock:
            if self._closed:
                raise SandboxError("session is closed", who=WHO)
            self._commands += 1
            # The command's own marker (``SESSION.N``): a timeout takes down
            # what this command left, never what an earlier one started.
            marker = merged[MARKER_VARIABLE] = f"{self._marker}.{self._commands}"
            started = time.monotonic()
            try:
                # Its own ``sandbox-exec -f PROFILE -D NAME=VALUE ... -- ARGV`` in a new
                # process group, with an environment built from scratch.
                proc = subprocess.Popen(
                    self.spec.argv(cmd.argv), cwd=cmd.cwd, env=merged, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                    start_new_session=True)
            except OSError as exc:
                raise SandboxError(f"cannot start sandbox-exec: {exc}", who=WHO) from exc
            self._groups.add(proc.pid)
        outputs, timed_out = collect_streams(proc, started + cmd.timeout,
                                             self._profile.limits.output_bytes, on_output)
        if timed_out:
            _kill_groups([proc.pid])
            kill_marked(marker)
        code = proc.wait()
        with self._lock:
            if self._closed:
                raise SandboxError("the session was interrupted during a command", who=WHO)
        return ExecResult(exit_code=128 - code if code < 0 else code,
                          stdout=outputs[Stream.STDOUT].result(),
                          stderr=outputs[Stream.STDERR].result(),
                          duration_s=time.monotonic() - started, timed_out=timed_out)

    def kill_all(self) -> int:
        """Every process carrying the session's marker, counted, then every command's group."""
        with self._lock:
            groups = list(self._groups)
        killed = kill_marked(self._marker)
        _kill_groups(groups)
        return killed

    def interrupt(self) -> None:
        with self._lock:
            self._closed = True
        self.kill_all()

    def close(self) -> None:
        with self._lock:
            if self._cleaned:
                return
            self._closed = self._cleaned = True
        try:
            self.kill_all()
        finally:
            if self._relay is not None:
                self._relay.close()
            shutil.rmtree(self._session_dir, ignore_errors=True)


def _kill_groups(pgids: Sequence[int]) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def procargs_environment(procargs: bytes) -> list[bytes]:
    """The environment strings of a ``KERN_PROCARGS2`` buffer.

    Layout: ``int argc``, the executable path, NUL padding, ``argc``
    NUL-terminated arguments, then the environment up to an empty string.
    """
    if len(procargs) < 4:
        return []
    (argc,) = struct.unpack("=i", procargs[:4])
    rest = procargs[4:]
    end = rest.find(b"\0")
    if end < 0:
        return []
    rest = rest[end:].lstrip(b"\0")
    fields = rest.split(b"\0")
    env = []
    for item in fields[argc:]:
        if not item:
            break
        env.append(item)
    return env


def _darwin_procargs(libc: ctypes.CDLL, pid: int, size: int) -> bytes | None:
    mib = (ctypes.c_int * 3)(1, 49, pid)  # CTL_KERN, KERN_PROCARGS2
    buf = ctypes.create_string_buffer(size)
    length = ctypes.c_size_t(size)
    if libc.sysctl(mib, 3, buf, ctypes.byref(length), None, 0) != 0:
        return None
    return buf.raw[:length.value]


def carries(environment: Sequence[bytes], marker: str) -> bool:
    """Whether an environment holds ``marker``: a session's marker (``SESSION``)
    is carried by each of its commands (``SESSION.N``); a command's only by itself."""
    wanted = f"{MARKER_VARIABLE}={marker}".encode()
    return any(e == wanted or e.startswith(wanted + b".") for e in environment)


def marked_pids(marker: str) -> list[int]:
    """Pids of this host whose environment ``carries`` the marker (macOS)."""
    if sys.platform != "darwin":
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sysctl.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_uint, ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t]
    libc.proc_listallpids.argtypes = [ctypes.c_void_p, ctypes.c_int]
    argmax = ctypes.c_int(0)
    size = ctypes.c_size_t(ctypes.sizeof(argmax))
    mib = (ctypes.c_int * 2)(1, 8)  # CTL_KERN, KERN_ARGMAX
    if libc.sysctl(mib, 2, ctypes.byref(argmax), ctypes.byref(size), None, 0) != 0:
        raise SandboxError("sysctl(KERN_ARGMAX) failed: cannot sweep the session's processes",
                           who=WHO)
    count = libc.proc_listallpids(None, 0)
    pids = (ctypes.c_int * (count + 256))()
    count = libc.proc_listallpids(pids, ctypes.sizeof(pids))
    found = []
    for pid in pids[:max(count, 0)]:
        if pid <= 0 or pid == os.getpid():
            continue
        args = _darwin_procargs(libc, pid, argmax.value)
        if args is not None and carries(procargs_environment(args), marker):
            found.append(pid)
    return found


def kill_marked(marker: str) -> int:
    """SIGKILL every process carrying the session marker, until none is left; how many.

    Bounded: a fork bomb outrunning the sweep is stopped after the last round,
    and what it left is reported rather than waited on forever.
    """
    killed: set[int] = set()
    for _ in range(100):
        pids = marked_pids(marker)
        if not pids:
            return len(killed)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    raise SandboxError(f"processes of session {marker} still running after 100 sweeps: "
                       f"{marked_pids(marker)}", who=WHO)


@dataclass(frozen=True, kw_only=True)
class SessionDirs:
    """The session's own 0700 directory (the profile file's) and, inside it, the
    sandbox's temporary directory with HOME at ``tmp/home``."""

    session_dir: str
    tmpdir: str


class SeatbeltBackend:
    """``sandbox-exec`` with a generated profile, a loopback relay to the proxy, attested.

    ``state_root`` is where each session's private directory (the profile
    file, the sandbox's temporary directory and HOME) is made; the default is
    the harness's own temporary directory.
    """

    name = "seatbelt"

    def __init__(self, *, state_root: str | None = None) -> None:
        self._state_root = state_root

    def probe(self) -> tuple[Capability, ...]:
        return probe()

    def start(self, profile: SandboxProfile, *, proxy: ProxyEndpoint | None) -> SeatbeltSession:
        missing = [c for c in probe() if c.name in ("macos", "sandbox_exec") and not c.available]
        if missing:
            raise SandboxUnavailable("; ".join(c.detail for c in missing), who=WHO,
                                     fix=missing[0].fix)
        euid = os.geteuid()
        if (refused := refusal(profile, euid)) is not None:
            raise refused
        if not os.path.isdir(profile.fs.workspace):
            raise SandboxError(f"workspace {profile.fs.workspace} is not a directory", who=WHO)
        root = self._state_root or tempfile.gettempdir()
        prepared = prepare_session_dirs(root)
        relay = None
        try:
            try:
                # The proxy is reachable as one loopback TCP port, the only network the
                # profile allows.
                relay = ProxyRelay(proxy.socket_path) if proxy is not None else None
            except OSError as exc:
                raise SandboxError(f"cannot listen on loopback for the proxy relay: {exc}",
                                   who=WHO) from exc
            port = relay.port if relay is not None else None
            interpreter = os.path.realpath(sys.executable)
            host = host_for(profile, session_dir=prepared.session_dir, tmpdir=prepared.tmpdir,
                            private=private_roots(root),
                            readable=(os.path.realpath(sys.base_prefix),
                                      os.path.dirname(interpreter)))
            spec = build_seatbelt_spec(profile, host=host, proxy_port=port)
            write_profile(spec)
            env = session_environment(os.environ, spec, proxy_port=port,
                                      marker=secrets.token_hex(16),
                                      toolchains=profile.fs.toolchain_env)
        except BaseException:
            if relay is not None:
                relay.close()
            shutil.rmtree(prepared.session_dir, ignore_errors=True)
            raise
        session = SeatbeltSession(
            profile=profile, spec=spec, env=env, session_dir=prepared.session_dir, relay=relay,
            info=SessionInfo(backend=self.name, enforcement=Enforcement.ENFORCED,
                             policy_hash=profile.policy_hash()))
        try:
            applied = layers(profile, spec, euid=euid, proxy_port=port)
            downgrades = tuple(layer.name.value for layer in applied
                               if not layer.applied and layer.name in profile.required)
            checks = attestation.attest(session, attest_plan(
                spec, python=interpreter, proxy_port=port,
                nonce=proxy.nonce if proxy is not None else None, protected=profile.fs.protected))
            session.info = SessionInfo(
                backend=self.name,
                enforcement=Enforcement.DOWNGRADED if downgrades else Enforcement.ENFORCED,
                policy_hash=profile.policy_hash(), layers=applied, attestation=checks,
                exposed=exposed(spec), downgrades=downgrades)
            attestation.require_passed(checks)
        except BaseException:
            session.close()
            raise
        return session


def prepare_session_dirs(root: str) -> SessionDirs:
    """The session's own 0700 directory under ``root``, with the sandbox's tmp and HOME."""
    try:
        session_dir = tempfile.mkdtemp(prefix="firstrun-seatbelt-", dir=root)
        tmpdir = os.path.join(session_dir, "tmp")
        os.mkdir(tmpdir, 0o700)
        os.mkdir(os.path.join(tmpdir, "home"), 0o700)
    except OSError as exc:
        raise SandboxError(f"cannot make the session directory under {root}: {exc}",
                           who=WHO) from exc
    return SessionDirs(session_dir=session_dir, tmpdir=tmpdir)


# Written once, in a 0700 directory of the harness's own that is outside every writable root
# after resolving symlinks (/tmp is /private/tmp on macOS), so no command can change what
# the next one runs under.
def write_profile(spec: SeatbeltSpec) -> None:
    """The profile, mode 0400, created new (never through a link, never over a file)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(spec.profile_file, flags, 0o400)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(spec.profile_text)
    except OSError as exc:
        raise SandboxError(f"cannot write the profile {spec.profile_file}: {exc}",
                           who=WHO) from exc
