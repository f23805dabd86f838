"""The docker backend: a run container behind an internal network, a proxy sidecar, attested.

Guarantee: ``DockerBackend.start`` returns a session only after the topology
is up, the run container's namespace firewall is loaded, the sidecar answered
with its nonce and attestation proved every layer from inside (seccomp, OOM
and, with TLS inspection, the run CA's trust included); otherwise it removes
everything it created and raises. Commands run under the helper, so their
whole tree dies with them; ``close`` removes every container and network.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import IO

import h11
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

import firstrun
from firstrun.errors import SandboxError, SandboxUnavailable, UsageError, one_line
from firstrun.images.build import image_present, local_tag, missing_image, resolve_image
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.process import CA_VARIABLES, SANDBOX_CA_BUNDLE
from firstrun.policy.profile import LayerName, Provides, SandboxProfile, unprovided
from firstrun.sandbox import attest as attestation
from firstrun.sandbox import bytecode, helper
from firstrun.sandbox.base import (
    Capability,
    Check,
    LayerStatus,
    RecordCallback,
    SessionInfo,
    ShellProxy,
)
from firstrun.sandbox.channel import JsonLines, decode_message, kill_and_wait
from firstrun.sandbox.docker import seccomp_probe
from firstrun.sandbox.docker.probe import probe_daemon
from firstrun.sandbox.docker.resources import (
    apply_firewall,
    bridge_gateway,
    docker,
    docker_binary,
    harness_identity,
    reap,
    remove,
)
from firstrun.sandbox.docker.seccomp import mechanism as seccomp_mechanism
from firstrun.sandbox.docker.seccomp import write_profile
from firstrun.sandbox.docker.topology import (
    CAPTURE_PORTS,
    DNS_PORT,
    PROXY_PORT,
    PYTHON,
    SANDBOX_TMP,
    TRANSPARENT_PORT,
    DockerFacts,
    DockerPlan,
    Topology,
    prepare,
)
from firstrun.sandbox.ownership import pick_uid, recover
from firstrun.sandbox.protect import describe as describe_protection
from firstrun.sandbox.supervised import LaunchedSession, read_ready, tail_of, take_workspace

HELPER_SOURCE = bytecode.source(helper)
SECCOMP_PROBE_SOURCE = Path(seccomp_probe.__file__).read_text(encoding="utf-8")
# Per-session uids lent the workspace when its owner is root: far above any
# distribution's ranges, as on the linux backend.
_UID_RANGE = (1_600_000_000, 1_700_000_000)
# A container's start waits on the daemon, and the run container's on its sidecar.
_READY_TIMEOUT_S = 60.0
# How long a signalled sidecar gets to end its tunnels and deliver their records.
_SIDECAR_STOP_S = 10.0
_HELPER = "the run container's helper"

_SIDECAR = "the proxy sidecar"


class _Sidecar:
    """The sidecar's stdout: the ready line, then records handed to ``on_record`` as they come."""

    def __init__(self, process: subprocess.Popen[str], on_record: RecordCallback | None,
                 stderr: IO[bytes]) -> None:
        self.process = process
        self._stderr = stderr
        self._on_record = on_record
        self._thread: threading.Thread | None = None
        self.failure: Exception | None = None

    def await_ready(self) -> dict[str, object]:
        """The sidecar's ready line (``nonce``; under inspection ``ca`` and ``placeholders``)."""
        assert self.process.stdout is not None
        ready: dict[str, object] = {}
        heard: list[str] = []

        def read() -> None:
            line = self.process.stdout.readline()  # type: ignore[union-attr]
            try:
                ready.update(decode_message(line, peer=_SIDECAR) if line else {})
            except ValueError as exc:
                heard.append(str(exc))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(_READY_TIMEOUT_S)
        error, fix = ready.get("error"), ready.get("fix")
        if ready.get("event") == "refused" and isinstance(error, str) and isinstance(fix, str):
            # The sidecar's own check, made before it loads anything it cannot;
            # its words come over a channel beside untrusted code: one line, capped.
            raise SandboxUnavailable(one_line(error, 500), who="docker", fix=one_line(fix, 500))
        if ready.get("event") != "ready":
            # Its own words (a policy or credential it refused names no value).
            why = "; ".join([*heard, tail_of(self._stderr, 500)])
            raise SandboxError(f"the proxy sidecar did not start{': ' + why if why.strip('; ') else ''}",
                               who="docker")
        self._thread = threading.Thread(target=self._pump, daemon=True,
                                        name="firstrun-docker-records")
        self._thread.start()
        return ready

    # Each egress record the sidecar writes reaches ``on_record`` (plain data, as
    # ``EgressRecord.to_data`` gives it) the moment it is written.
    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                msg = decode_message(line, peer=_SIDECAR)
                if msg.get("event") != "record":
                    continue
                record = msg.get("record")
                if not isinstance(record, dict):
                    raise ValueError(f"{_SIDECAR} sent a record that is not an object: {record!r:.80}")
                if self._on_record is not None:
                    self._on_record(record)
            except Exception as exc:
                # Kept for close to raise: a line the harness could not read,
                # or a record it could not take, must neither end the pump
                # (losing the rest) nor pass unnoticed.
                if self.failure is None:
                    self.failure = exc

    def wait_stopped(self, within_s: float) -> None:
        """Wait up to ``within_s`` for the sidecar to exit after it was signalled."""
        try:
            self.process.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            pass

    def finish(self) -> None:
        """Wait for the last records after the sidecar was stopped; raise if one was refused."""
        self.process.wait()
        if self._thread is not None:
            self._thread.join()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()
        if self.failure is not None:
            raise SandboxError(f"an egress record could not be delivered: {self.failure}",
                               who="docker") from self.failure


def _take_down(topology: Topology, sidecars: list[_Sidecar], docker_bin: str, *,
               quiet: bool) -> None:
    """Stop the sidecar (so it records the tunnels still open), remove every container and
    network, then collect the sidecar's last records; ``quiet`` when another error is
    already on its way, which this must not replace."""
    errors = []
    for sidecar in sidecars:
        # Stopped, not removed outright: a tunnel's record is written when
        # the tunnel ends, so the sidecar must end the tunnels still open
        # and deliver their records (and the record budget's closing one)
        # before it goes. A sidecar that does not finish in time is removed
        # below all the same.
        docker("kill", "--signal", "TERM", topology.sidecar, docker_bin=docker_bin, check=False)
        sidecar.wait_stopped(_SIDECAR_STOP_S)
    try:
        remove(topology, docker_bin=docker_bin)
    except SandboxError as exc:
        errors.append(str(exc))
    for sidecar in sidecars:
        try:
            sidecar.finish()
        except SandboxError as exc:
            errors.append(str(exc))
    if errors and not quiet:
        raise SandboxError("; ".join(errors), who="docker")


class DockerSession(LaunchedSession):
    """A running run container; its pid 1 is the helper, attached over one socket.

    The process is docker's attach client: its death closes the helper's
    stdin, and the container is killed beside it.
    """

    who = "docker"
    sandbox = "the run container"
    ready_timeout_s = _READY_TIMEOUT_S

    def __init__(self, *, topology: Topology, profile: SandboxProfile, env: dict[str, str],
                 info: SessionInfo, attach: subprocess.Popen[bytes], control: socket.socket,
                 attach_stderr: IO[bytes], docker_bin: str, cleanup: ExitStack) -> None:
        super().__init__(process=attach, channel=JsonLines(control, peer=_HELPER), env=env,
                         profile=profile, info=info, output=attach_stderr, cleanup=cleanup)
        self.topology = topology
        self._docker = docker_bin
        self._killed = False

    def _end(self) -> None:
        """Kill the run container (its pid 1, and with it every process) and the attach client."""
        if not self._killed:
            self._killed = True
            docker("kill", self.topology.run, docker_bin=self._docker, check=False)
        super()._end()

    def interrupt(self) -> None:
        # Killing the container does not wait for the helper to notice its stdin closed.
        super().interrupt()
        with contextlib.suppress(SandboxError):
            self._end()


# Every layer a profile can require is provided. Landlock's guarantee (writes confined to
# the workspace and the session's own temporary directories) is given by the read-only root
# with tmpfs /tmp and HOME and the workspace as the only writable bind, with every
# capability dropped so nothing can remount; a session whose layers were all applied and
# attested is therefore ENFORCED. The mechanism behind each layer is recorded in
# SessionInfo.layers.
PROVIDES: Provides = {
    LayerName.NAMESPACES: "docker container",
    LayerName.LANDLOCK: "read-only root + tmpfs",
    LayerName.SECCOMP: seccomp_mechanism(),
    LayerName.NETWORK: "internal network + namespace firewall",
    LayerName.LIMITS: "container cgroup + rlimits",
    LayerName.UNPRIVILEGED: "non-root uid, no capabilities",
}


def _layers(profile: SandboxProfile, *, image: str, user: str, proxy: bool,
            landlock_abi: int, inspection: str | None = None) -> tuple[LayerStatus, ...]:
    limits = profile.limits
    fs = profile.fs
    writable = f"{fs.sandbox_workspace}, {SANDBOX_TMP}, {fs.sandbox_home}"
    mechanisms = dict(PROVIDES)
    if landlock_abi:
        mechanisms[LayerName.LANDLOCK] = f"landlock ABI {landlock_abi} + read-only root"
    details = {
        LayerName.NAMESPACES: f"image {image}; pid, mount, ipc, uts and net namespaces; "
                              "oom_score_adj floored at its start (runc set it as root, and "
                              "lowering it needs CAP_SYS_RESOURCE)" + describe_protection(fs),
        LayerName.LANDLOCK: (f"writes only beneath {writable} and a few devices (Landlock, "
                             "applied by the helper before any command); the root filesystem is "
                             "read-only besides; no capability to remount") if landlock_abi else
                            (f"in place of Landlock (not in this kernel): the root filesystem is "
                             f"read-only; writable only {fs.sandbox_workspace} (the bound "
                             f"workspace) and tmpfs {SANDBOX_TMP} and {fs.sandbox_home}; no "
                             "capability to remount"),
        LayerName.SECCOMP: "an allow-list with the linux backend's refusals (io_uring, bpf, "
                           "namespaces, mounts, ptrace, keyrings, TIOCSTI, ...), "
                           "no-new-privileges"
                           if LayerName.SECCOMP in profile.required else _OMITTED_SECCOMP,
        LayerName.NETWORK: f"only the proxy sidecar's port {PROXY_PORT}; no host, no DNS"
                           + (f"; {inspection}" if inspection else "")
                           if proxy else "loopback only (no proxy)",
        LayerName.LIMITS: f"session-wide: pids {limits.pids}, memory {limits.memory_bytes} bytes "
                          f"(no extra swap); per process: open files {limits.open_files}, core 0",
        LayerName.UNPRIVILEGED: f"uid {user}; every capability dropped, bounding set included; "
                                "the helper (pid 1) runs as the container's root, so no command "
                                "shares its uid",
    }
    return tuple(LayerStatus(name=layer, applied=layer in profile.required,
                             mechanism=mechanisms[layer], detail=details[layer])
                 for layer in LayerName)


# Only the audit builds a profile without seccomp; Docker's default stays on.
_OMITTED_SECCOMP = ("omitted: not in the profile's required layers (an audit configuration); "
                    "Docker's default profile applies")


def _await_ready(control: socket.socket, stderr: IO[bytes]) -> dict:
    """The helper's ready line, or the container's own words on why it did not start."""
    return read_ready(JsonLines(control, peer=_HELPER), within_s=_READY_TIMEOUT_S,
                      tail=lambda: tail_of(stderr), sandbox=DockerSession.sandbox, who="docker")


def _seccomp_file(directory: str) -> str:
    try:
        return write_profile(directory)
    except OSError as exc:
        raise SandboxError(f"cannot write the seccomp profile in {directory}: {exc.strerror}",
                           who="docker") from exc


def _seccomp_checks(session: DockerSession) -> tuple[Check, ...]:
    """What firstrun's profile adds to Docker's default, proven from inside."""
    result = session.exec([PYTHON, "-I", "-S", "-c", SECCOMP_PROBE_SOURCE], timeout=60.0)
    try:
        return tuple(Check(name=c["name"], passed=bool(c["passed"]), detail=str(c["detail"]))
                     for c in json.loads(result.stdout.text()))
    except (ValueError, KeyError, TypeError):
        return (Check(name="seccomp_probe_ran", passed=False,
                      detail=f"exit {result.exit_code}: {result.stderr.text()[-300:]}"),)


def _ca_files() -> tuple[str, ...]:
    """The host's CA bundle and every CA variable's file: what pip, npm and curl trust here."""
    found = [SANDBOX_CA_BUNDLE] if os.path.isfile(SANDBOX_CA_BUNDLE) else []
    for name in CA_VARIABLES:
        value = os.environ.get(name, "")
        if value.startswith("/") and os.path.isfile(value) and value not in found:
            found.append(value)
    return tuple(found)


def _credentials(policy: InspectionPolicy, env: Mapping[str, str]) -> dict[str, str]:
    """Each credential's value, by the variable it is read from; the sidecar's alone."""
    values: dict[str, str] = {}
    for rule in policy.credentials:
        value = env.get(rule.from_env)
        if not value:
            raise UsageError(
                f"credential {rule.name}: ${rule.from_env} is not set in firstrun's "
                "environment; export it (the sandbox only ever sees a placeholder)")
        values[rule.from_env] = value
    return values


# TLS inspection is done by the sidecar, which makes the run's CA and keeps its private key
# in its own memory: the key is never on the host's disk nor in the run container. The
# credentials' real values reach the sidecar on its stdin only; the run container's
# environment gets the placeholders the sidecar minted.
class _Inspection:
    """One session's TLS inspection, on the harness side: the bundle file and the run CA."""

    def __init__(self, policy: InspectionPolicy) -> None:
        self.names = tuple(rule.name for rule in policy.credentials)
        # Harness-private (0700); the bundle in it holds certificates only.
        self.directory = tempfile.mkdtemp(prefix="firstrun-docker-trust-")
        self.bundle = os.path.join(self.directory, "trust.pem")
        # Created empty now: a bind mount needs its source when the container is created.
        os.close(os.open(self.bundle, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        os.chmod(self.bundle, 0o644)
        self.ca: x509.Certificate | None = None
        self.placeholders: dict[str, str] = {}

    # The CA is parsed and re-serialized, so nothing but one CA certificate reaches the
    # bundle, which holds the system CAs, the harness's SSL_CERT_FILE and the run CA; the
    # run container sees it read-only at SANDBOX_CA_BUNDLE, where every CA variable points.
    def take(self, ready: Mapping[str, object]) -> None:
        """Fill the bundle from the sidecar's ready line, in place (the bind names this inode)."""
        try:
            ca = x509.load_pem_x509_certificate(str(ready["ca"]).encode("ascii"))
            constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        except (KeyError, ValueError, UnicodeEncodeError, x509.ExtensionNotFound) as exc:
            raise SandboxError(f"the proxy sidecar reported no usable run CA: {exc}",
                               who="docker") from None
        placeholders = ready.get("placeholders")
        if not constraints.ca or not isinstance(placeholders, dict) \
                or sorted(placeholders) != sorted(self.names) \
                or not all(isinstance(v, str) for v in placeholders.values()):
            raise SandboxError("the proxy sidecar's run CA or placeholders are not what was asked",
                               who="docker")
        self.ca, self.placeholders = ca, dict(placeholders)
        bundle = _system_trust() + ca.public_bytes(serialization.Encoding.PEM)
        with open(self.bundle, "r+b") as f:
            f.truncate(0)
            f.write(bundle)

    def detail(self) -> str:
        assert self.ca is not None
        fingerprint = self.ca.fingerprint(hashes.SHA256()).hex()[:16]
        masked = f"; credentials masked: {', '.join(self.names)}" if self.names else ""
        return (f"TLS inspected by the sidecar (run CA sha256 {fingerprint}..., key in the "
                f"sidecar's memory only; trusted through {SANDBOX_CA_BUNDLE}){masked}")


def _system_trust() -> bytes:
    """The host's system CAs and the harness's ``$SSL_CERT_FILE``, as the linux backend trusts them."""
    parts: list[bytes] = []
    seen: set[str] = set()
    for path in (SANDBOX_CA_BUNDLE, os.environ.get("SSL_CERT_FILE", "")):
        real = os.path.realpath(path) if path else ""
        if not real or real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        try:
            with open(real, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise SandboxError(f"cannot read CA bundle {path}: {exc.strerror}", who="docker") from exc
        parts.append(data if data.endswith(b"\n") else data + b"\n")
    if not parts:
        raise SandboxUnavailable(f"no system CA bundle at {SANDBOX_CA_BUNDLE}", who="docker",
                                 fix="install ca-certificates or set SSL_CERT_FILE")
    return b"".join(parts)


def _trust_check(session: DockerSession, inspection: _Inspection) -> Check:
    """From inside: the bundle at ``SANDBOX_CA_BUNDLE`` holds the run CA the sidecar reported."""
    assert inspection.ca is not None
    pem = inspection.ca.public_bytes(serialization.Encoding.PEM).decode("ascii")
    # Compared inside: the bundle is larger than a task's output cap may be.
    script = f"import sys; print(open({SANDBOX_CA_BUNDLE!r}).read().endswith(sys.argv[1]))"
    result = session.exec([PYTHON, "-I", "-S", "-c", script, pem], timeout=60.0)
    trusted = result.exit_code == 0 and result.stdout.text().strip() == "True"
    return Check(name="run_ca_trusted", passed=trusted,
                 detail=f"{SANDBOX_CA_BUNDLE} ends with the sidecar's run CA" if trusted
                 else f"{SANDBOX_CA_BUNDLE} does not hold the run CA (exit {result.exit_code})")


# What the proxy module imports beyond the standard library: h11 and dnspython
# always, idna and publicsuffixlist (with its bundled list) for host names, and
# cryptography (with its cffi backend) for TLS interception. Bound from the
# harness's own environment, so the sidecar runs exactly the harness's proxy;
# cryptography's abi3 module loads in any Python 3 on the same libc, but
# cffi's backend only in the harness's minor version, which the sidecar
# checks (``libs_python``) before it loads it.
_SIDECAR_MODULES = ("h11", "dns", "idna", "publicsuffixlist", "cryptography", "cffi",
                    "_cffi_backend")


def libs_python() -> str:
    """The Python (``3.11``) the bound libraries' extension modules were built for: this one."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def sidecar_lib_binds() -> tuple[tuple[str, str], ...]:
    """(host path, name under the sidecar's library directory) for the proxy and its imports."""
    binds = [(os.path.dirname(firstrun.__file__), "firstrun"),
             (os.path.dirname(h11.__file__), "h11")]
    for name in _SIDECAR_MODULES[1:]:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            binds.append((os.path.dirname(spec.origin), name))
        else:
            binds.append((spec.origin, os.path.basename(spec.origin)))
    return tuple(binds)


def _root() -> Capability:
    return Capability(
        name="root", available=os.geteuid() == 0,
        detail="the run container's namespace firewall is loaded from the host as root"
        if os.geteuid() == 0 else f"harness is uid {os.geteuid()}",
        fix=None if os.geteuid() == 0 else "run the harness as root (or use --backend linux)")


def harness_address() -> str:
    """Where a harness service listens for a sidecar to reach it: the default bridge's gateway.

    The sidecar reaches the host's own addresses over its egress bridge; the
    run container, alone on its internal network behind its firewall, reaches
    none of them (attested). Never loopback, which is the sidecar's own.
    Raises ``SandboxUnavailable`` where the daemon names no such address.
    """
    try:
        return bridge_gateway("bridge")
    except SandboxError as exc:
        raise SandboxUnavailable(f"no address where the sidecar reaches the harness: {exc}",
                                 who="docker", fix="see firstrun doctor; docker's default "
                                 "bridge network must exist") from None


class DockerBackend:
    """A container per session behind an internal network, with the proxy as a sidecar.

    ``image`` is the run container's image (a task's ``image`` wins over
    it; None means the default Python image). ``sidecar_hosts`` are
    (name, address) entries for the sidecar's ``/etc/hosts`` (see
    ``DockerHost``; the audit's fixture registry). Under TLS inspection,
    ``upstream_cafiles`` are CA files the sidecar trusts upstream besides
    the image's store and the host's bundles (a fixture registry's own CA),
    and ``credential_env`` is where credential values are read (the
    harness's environment when None).
    """

    name = "docker"

    def __init__(self, *, image: str | None = None,
                 on_record: RecordCallback | None = None,
                 sidecar_hosts: tuple[tuple[str, str], ...] = (),
                 upstream_cafiles: tuple[str, ...] = (),
                 credential_env: Mapping[str, str] | None = None) -> None:
        self._image = image
        self._on_record = on_record
        self._sidecar_hosts = sidecar_hosts
        self._upstream_cafiles = upstream_cafiles
        self._credential_env = credential_env

    def probe(self) -> tuple[Capability, ...]:
        """The daemon (version judged), root, and the image a session would run, already local."""
        daemon = probe_daemon(os.environ)
        root = _root()
        tag = local_tag(self._image)
        if not daemon.available:
            image = Capability(name="image", available=False,
                               detail=f"{tag}: not checked, the daemon does not answer",
                               fix=daemon.fix)
        else:
            try:
                present = image_present(tag, docker_binary())
            except SandboxUnavailable as exc:
                present, missing = False, (exc.args[0], exc.fix or "")
            else:
                missing = missing_image(tag)
            # Asked of the daemon only: nothing is built or pulled to find out.
            image = Capability(name="image", available=True, detail=f"{tag} present") if present \
                else Capability(name="image", available=False, detail=missing[0], fix=missing[1])
        return (daemon, root, image)

    def start(self, profile: SandboxProfile, *, proxy: ShellProxy | None) -> DockerSession:
        # Only what the start uses, the sweep having probed in full: a daemon that
        # answers its ping (its Engine was judged then) and root; the image is
        # resolved below, which refuses an absent one with its fix.
        missing = [c for c in (probe_daemon(os.environ, judge=False), _root())
                   if not c.available]
        if missing:
            raise SandboxUnavailable("; ".join(f"{c.name}: {c.detail}" for c in missing),
                                     who="docker", fix="; ".join(c.fix for c in missing if c.fix))
        lacking = unprovided(profile, PROVIDES)
        if lacking:
            raise SandboxUnavailable(
                f"the docker backend cannot enforce {', '.join(lacking)}", who="docker",
                fix="use a backend that provides it (firstrun doctor), or --allow-downgrade "
                    "it, recorded")
        fs = profile.fs
        if not os.path.isdir(fs.workspace):
            raise SandboxError(f"workspace {fs.workspace} is not a directory", who="docker")
        docker_bin = docker_binary()
        image = resolve_image(self._image, docker_bin)
        # Leftovers of a harness that died are reaped before anything is created.
        reap(docker_bin=docker_bin)
        # After the reap: a dead harness's containers are gone before its
        # workspace changes owner again.
        if os.geteuid() == 0:
            recover(who="docker")
        st = os.lstat(fs.workspace)
        owner = (st.st_uid, st.st_gid)
        lent = pick_uid(_UID_RANGE, who="docker") if owner[0] == 0 else None
        uid, gid = (lent, lent) if lent is not None else owner
        # Each resource is registered with its undo as it is acquired, so a
        # start that fails anywhere unwinds exactly what it took, in reverse,
        # and a session that starts takes the same stack as its close.
        with ExitStack() as acquired:
            inspection: _Inspection | None = None
            credentials: dict[str, str] = {}
            if proxy is not None and profile.net.inspection is not None:
                # Read before anything is created: a missing value is the user's to fix.
                credentials = _credentials(
                    profile.net.inspection,
                    os.environ if self._credential_env is None else self._credential_env)
                inspection = _Inspection(profile.net.inspection)
                acquired.callback(shutil.rmtree, inspection.directory, ignore_errors=True)
            # Harness-private (0700) and gone once the containers exist: the CLI
            # sends the profile's content with each create request.
            with tempfile.TemporaryDirectory(prefix="firstrun-docker-") as private:
                # Everything a session will be is decided here, before anything is created,
                # so it can be golden-tested: the host's facts go into ``topology.prepare``,
                # and the launch executes the plan.
                plan = prepare(profile, proxy, DockerFacts(
                    session=uuid.uuid4().hex[:12], image=image, uid=uid, gid=gid,
                    lib_binds=sidecar_lib_binds(), harness=harness_identity(),
                    ca_files=_ca_files(),
                    seccomp_profile=_seccomp_file(private)
                    if LayerName.SECCOMP in profile.required else None,
                    sidecar_hosts=self._sidecar_hosts,
                    trust_bundle=inspection.bundle if inspection is not None else None,
                    upstream_cafiles=self._upstream_cafiles, credentials=credentials,
                    host_env=os.environ, helper_source=HELPER_SOURCE,
                    libs_python=libs_python()))
                sidecars = _create(plan, fs, acquired, owner=owner, lent=lent,
                                   docker_bin=docker_bin)
            return self._launch(profile, plan, acquired, sidecars=sidecars, inspection=inspection,
                                docker_bin=docker_bin)

    def _launch(self, profile: SandboxProfile, plan: DockerPlan, acquired: ExitStack, *,
                sidecars: list[_Sidecar], inspection: _Inspection | None,
                docker_bin: str) -> DockerSession:
        """Start the created containers as the plan says, attest, and return the session.

        Whatever this takes joins ``acquired``; once the session holds the
        stack, a failure closes the session instead.
        """
        topology = plan.topology
        nonce: str | None = None
        if plan.sidecar_request is not None:
            # Unlinked: read only when the sidecar fails to start.
            stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _Sidecar.finish)
            sidecar = _Sidecar(subprocess.Popen(
                [docker_bin, "start", "--attach", "--interactive", topology.sidecar],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                text=True), self._on_record, stderr)
            sidecars.append(sidecar)
            assert sidecar.process.stdin is not None
            sidecar.process.stdin.write(json.dumps(plan.sidecar_request))
            sidecar.process.stdin.close()
            ready = sidecar.await_ready()
            nonce = str(ready["nonce"])
            if inspection is not None:
                # Before the run container starts: nothing in it ever sees an empty bundle.
                inspection.take(ready)
        sidecar_ip = docker(
            "inspect", "--format",
            '{{(index .NetworkSettings.Networks "%s").IPAddress}}' % topology.internal_network,
            topology.sidecar, docker_bin=docker_bin).stdout.strip()
        # The helper's stdin and stdout, through the attach client, are
        # one socket here: the channel's own reader and deadlines apply.
        control, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        acquired.callback(control.close)
        attach_stderr = tempfile.TemporaryFile()
        acquired.callback(attach_stderr.close)
        try:
            attach = subprocess.Popen(
                [docker_bin, "start", "--attach", "--interactive", topology.run],
                stdin=child, stdout=child, stderr=attach_stderr)
        finally:
            child.close()
        acquired.callback(kill_and_wait, attach)
        session = DockerSession(
            topology=topology, profile=profile,
            env=plan.environment(sidecar_ip=sidecar_ip, placeholders=inspection.placeholders
                                 if inspection is not None else None),
            info=SessionInfo(backend=self.name, enforcement=plan.enforcement,
                             policy_hash=profile.policy_hash()),
            attach=attach, control=control, attach_stderr=attach_stderr,
            docker_bin=docker_bin, cleanup=acquired.pop_all())
        try:
            if plan.capture:
                JsonLines(control, peer=_HELPER).send({
                    "op": "endpoints",
                    "endpoints": {"t": [sidecar_ip, TRANSPARENT_PORT], "d": [sidecar_ip, DNS_PORT]}})
            ready = _await_ready(control, attach_stderr)
            gateway = bridge_gateway(topology.internal_network, docker_bin=docker_bin)
            pid = int(docker("inspect", "--format", "{{.State.Pid}}", topology.run,
                             docker_bin=docker_bin).stdout)
            # Without a proxy the firewall lets nothing but loopback out:
            # no address inside the sandbox is the sidecar's.
            apply_firewall(pid, sidecar_ip if plan.sidecar_request is not None else "127.0.0.1",
                           capture=CAPTURE_PORTS if plan.capture else None, host_address=gateway,
                           ipv6=bool(ready.get("capture_ipv6")))
            landlock_abi = int(ready.get("landlock_abi", 0))
            checks = attestation.attest(session, plan.attestation(
                nonce=nonce, sidecar_ip=sidecar_ip, gateway=gateway, landlock_abi=landlock_abi))
            if plan.seccomp:
                checks += _seccomp_checks(session)
            if inspection is not None:
                checks += (_trust_check(session, inspection),)
            session.info = SessionInfo(
                backend=self.name, enforcement=plan.enforcement,
                policy_hash=profile.policy_hash(), image=plan.image,
                layers=_layers(profile, image=plan.image, user=plan.user,
                               proxy=plan.sidecar_request is not None, landlock_abi=landlock_abi,
                               inspection=inspection.detail() if inspection is not None else None),
                attestation=checks)
            attestation.require_passed(checks)
        except BaseException:
            session.close()
            raise
        return session


def _create(plan: DockerPlan, fs: FilesystemPolicy, acquired: ExitStack, *,
            owner: tuple[int, int], lent: int | None, docker_bin: str) -> list[_Sidecar]:
    """Place the protected entries, lend the workspace and create the plan's resources.

    The list returned is where the launch puts the sidecar it starts, so the
    take-down registered here stops it before the containers go.
    """
    take_workspace(acquired, fs, lent=lent, owner=owner, who="docker")
    sidecars: list[_Sidecar] = []
    acquired.push(lambda kind, value, tb: _take_down(
        plan.topology, sidecars, docker_bin, quiet=kind is not None))
    for argv in plan.topology.create:
        docker(*argv, docker_bin=docker_bin)
    return sidecars
