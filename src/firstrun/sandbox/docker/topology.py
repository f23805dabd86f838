"""A docker session's networks, containers and launch, as data: a pure function of the profile.

Guarantee: ``build_topology`` and ``prepare`` are pure (no I/O, no clock), so
every docker command, the sidecar's stdin, every command's environment and what
attestation must prove are golden-tested. The run container sits on an
``--internal`` network alone with the proxy sidecar, its one way out. Both drop
every capability (the helper keeps four, for itself), have a read-only root,
seccomp and limits; the workspace is the only host directory bound writable.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from firstrun.policy.filesystem import FilesystemPolicy, is_under
from firstrun.policy.process import SANDBOX_CA_BUNDLE, build_environment
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox.attest import AttestPlan
from firstrun.sandbox.base import Enforcement, ShellProxy
from firstrun.sandbox.capture import CapturePorts
from firstrun.sandbox.linux.spec import WRITABLE_DEVICE_DIRS, WRITABLE_DEVICE_FILES

LABEL_MANAGED = "org.firstrun.managed"
LABEL_SESSION = "org.firstrun.session"
LABEL_HARNESS = "org.firstrun.harness"
PROXY_PORT = 3128
SANDBOX_TMP = "/tmp"
# Where the sidecar finds this package and h11, bound read-only.
SIDECAR_LIB = "/opt/firstrun/lib"
# The sidecar's proxy holds at most SIDECAR_CONNECTIONS connections on each
# of its two listeners that carry tunnels (proxy.server's
# ``ProxyLimits.max_connections``), and carries each tunnel with two blocking
# pump threads (proxy.tunnel). The pids limit counts threads: it admits all of
# those, and the interpreter's own (main, event loop, resolver executor), so
# the proxy's connection bound is what limits tunnels, never a thread refused.
SIDECAR_CONNECTIONS = 128
SIDECAR_LIMITS = {"pids": 2 * 2 * SIDECAR_CONNECTIONS + 64, "memory": 256 << 20, "cpus": "0.5"}
SIDECAR_UID = 65534
# The run container's interpreter (the images' Debian Python), which runs the helper.
PYTHON = "/usr/bin/python3"
# The capabilities the helper keeps: to start each command as the session's uid,
# and to kill what the commands leave (they run under another uid than its own).
# Each command drops these (bounding set included) with every id before it execs, so no
# command shares the helper's uid or its capabilities.
HELPER_CAPS = ("SETUID", "SETGID", "SETPCAP", "KILL")
# A tmpfs anyone may write by its mode that the helper's Landlock rules leave out: a write
# refused there is Landlock's refusal, which attestation proves.
WRITE_WITNESS = "/run/firstrun-witness"
CAPTURE_PORTS = CapturePorts()
# The sidecar's listeners for the helper alone: redirected flows, and DNS.
TRANSPARENT_PORT = PROXY_PORT + 1
DNS_PORT = PROXY_PORT + 2
# The images' (Debian's) PATH: nothing of the host's is inside.
SANDBOX_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True, kw_only=True)
class DockerHost:
    """What the pure builder needs from the host, gathered by the driver.

    ``lib_binds`` are (host directory, name under ``SIDECAR_LIB``) pairs: the
    ``firstrun`` package and the pure-Python libraries the proxy imports.
    ``uid``/``gid`` are who the run container's commands run as (the owner
    of the workspace, or a per-session uid lent the workspace when that
    owner is root). ``ca_files`` are the host's certificate bundles, bound
    read-only at the same paths so the CA variables that pass through name
    real files inside. ``harness`` is recorded as a label, so the reaper can
    tell a live session's resources from a dead harness's: ``harness`` is
    ``PID:STARTTIME``, so a reused pid is not mistaken for the harness.
    ``seccomp_profile`` is the harness-private file holding the profile
    ``seccomp.py`` builds; None leaves Docker's default profile in place.
    ``sidecar_hosts`` are (name, address) entries for the sidecar's
    ``/etc/hosts``: a name the proxy must reach that no resolver should be
    asked for (the audit's fixture registry on a docker bridge); an entry
    changes where a name leads, never what the policy allows.
    ``trust_bundle`` (TLS inspection): the host file the run container sees
    at ``SANDBOX_CA_BUNDLE``; it must exist before the containers are
    created and is filled before the run container starts.
    ``sidecar_ca_files`` (TLS inspection): CA files bound read-only into the
    sidecar at their own paths, its upstream trust besides the image's store.
    ``helper_source`` is the helper's source text, run as pid 1.
    ``capture``: the session captures transparently; the helper then runs
    the DNS stub and the relay, and takes the sidecar's endpoints on its
    channel before it says ready.
    """

    workspace: str
    uid: int
    gid: int
    image: str
    sidecar_image: str
    lib_binds: tuple[tuple[str, str], ...]
    harness: str
    cpus: str = "1"
    ca_files: tuple[str, ...] = ()
    seccomp_profile: str | None = None
    sidecar_hosts: tuple[tuple[str, str], ...] = ()
    trust_bundle: str | None = None
    sidecar_ca_files: tuple[str, ...] = ()
    helper_source: str = ""
    capture: bool = False


def helper_config(profile: SandboxProfile, *, uid: int, gid: int,
                  capture: bool = False) -> dict[str, object]:
    """The run container's helper configuration: nothing secret (its cmdline is readable).

    Landlock is applied where the kernel has it and never required: the
    read-only root is what confines writes on this backend, and the
    session records which of the two were in force. No RLIMIT_NPROC: the
    container's pids limit caps the session, and the uid may be a real
    user's, whose processes elsewhere that limit would count.
    """
    fs = profile.fs
    return {
        "channel_fds": [0, 1],
        "dial_fd": None,
        "proxy_port": None,
        "limits": {"pids": None, "memory_bytes": profile.limits.memory_bytes,
                   "open_files": profile.limits.open_files},
        "landlock": {"apply": True, "required": False, "min_abi": 1,
                     "dirs": [fs.sandbox_workspace, SANDBOX_TMP, fs.sandbox_home,
                              *WRITABLE_DEVICE_DIRS],
                     "files": list(WRITABLE_DEVICE_FILES)},
        "user": {"uid": uid, "gid": gid},
        **({"capture": CAPTURE_PORTS.to_config(ipv6=True), "await_endpoints": True}
           if capture else {}),
    }


def mount_value(*fields: str) -> str:
    """One ``--mount`` value from its fields.

    Docker reads the value as one CSV record, so a field with a comma, a
    quote or a newline (a workspace may be named anything) is CSV-quoted and
    stays one field: a directory name can never add a mount option.
    """
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(fields)
    return out.getvalue()


def _ro_binds(paths: tuple[str, ...]) -> list[str]:
    return [arg for path in paths
            for arg in ("--mount", mount_value("type=bind", f"source={path}", f"target={path}",
                                               "readonly"))]


def _lent_homes(fs: FilesystemPolicy) -> list[str]:
    return [home for home in fs.real_homes if any(is_under(p, home) for p in fs.lent)]


@dataclass(frozen=True, kw_only=True)
class Topology:
    session: str
    internal_network: str
    egress_network: str
    sidecar: str
    run: str
    create: tuple[tuple[str, ...], ...]
    """docker argvs (without the ``docker`` binary), in order."""

    def resources(self) -> tuple[tuple[str, str], ...]:
        """(kind, name) of everything created, in the order to remove it."""
        return (("container", self.run), ("container", self.sidecar),
                ("network", self.internal_network), ("network", self.egress_network))


def _labels(session: str, harness: str) -> list[str]:
    return ["--label", f"{LABEL_MANAGED}=1", "--label", f"{LABEL_SESSION}={session}",
            "--label", f"{LABEL_HARNESS}={harness}"]


# Both containers: no capability, no-new-privileges, firstrun's seccomp profile (Docker's
# allow-list semantics with the linux backend's refusals; Docker's default profile only when
# the host names none, which only the audit does, never unconfined), a read-only root with a
# size-capped tmpfs /tmp, and pids, memory (no extra swap) and CPU limits.
def _hardening(*, user: str, pids: int, memory: int, cpus: str, tmp_bytes: int,
               tmp_exec: bool, seccomp: str | None) -> list[str]:
    return [
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        *(("--security-opt", f"seccomp={seccomp}") if seccomp is not None else ()),
        "--read-only",
        "--tmpfs", f"{SANDBOX_TMP}:rw,{'exec' if tmp_exec else 'noexec'},nosuid,nodev,"
                   f"size={tmp_bytes}",
        "--user", user,
        "--pids-limit", str(pids),
        "--memory", str(memory),
        "--memory-swap", str(memory),
        "--cpus", cpus,
        "--ulimit", "core=0",
        "--ipc", "private",
        "--log-driver", "none",
    ]


def build_topology(profile: SandboxProfile, *, session: str, host: DockerHost) -> Topology:
    prefix = f"firstrun-{session}"
    internal, egress = f"{prefix}-internal", f"{prefix}-egress"
    sidecar, run = f"{prefix}-proxy", f"{prefix}-run"
    labels = _labels(session, host.harness)
    limits = profile.limits
    fs = profile.fs
    sidecar_argv = [
        "create", "--name", sidecar, *labels,
        "--network", egress,
        "--interactive",
        *_hardening(user=f"{SIDECAR_UID}:{SIDECAR_UID}", pids=SIDECAR_LIMITS["pids"],
                    memory=SIDECAR_LIMITS["memory"], cpus=SIDECAR_LIMITS["cpus"],
                    tmp_bytes=16 << 20, tmp_exec=False, seccomp=host.seccomp_profile),
        "--env", f"PYTHONPATH={SIDECAR_LIB}",
        *(arg for name, address in host.sidecar_hosts
          for arg in ("--add-host", f"{name}:{address}")),
    ]
    for source, name in host.lib_binds:
        sidecar_argv += ["--mount", mount_value("type=bind", f"source={source}",
                                                f"target={SIDECAR_LIB}/{name}", "readonly")]
    sidecar_argv += _ro_binds(host.sidecar_ca_files)
    # -s, not -I: the bound library is found through PYTHONPATH, which -I ignores.
    sidecar_argv += [host.sidecar_image, "python3", "-s", "-m", "firstrun.proxy", "0.0.0.0",
                     str(PROXY_PORT)]
    run_argv = [
        "create", "--name", run, *labels,
        "--network", internal,
        "--interactive",
        *_hardening(user="0:0", pids=limits.pids,
                    memory=limits.memory_bytes, cpus=host.cpus, tmp_bytes=limits.memory_bytes,
                    # Docker's tmpfs default is noexec, which no other backend
                    # imposes and which breaks installers that run what they unpack.
                    tmp_exec=True, seccomp=host.seccomp_profile),
        *(arg for cap in HELPER_CAPS for arg in ("--cap-add", cap)),
        "--tmpfs", f"{fs.sandbox_home}:rw,exec,nosuid,nodev,size={limits.memory_bytes},"
                   f"uid={host.uid},gid={host.gid},mode=700",
        "--tmpfs", f"{WRITE_WITNESS}:rw,nosuid,nodev,noexec,size=4096,mode=1777",
        "--ulimit", f"nofile={limits.open_files}:{limits.open_files}",
        "--mount", mount_value("type=bind", f"source={host.workspace}",
                               f"target={fs.sandbox_workspace}"),
        # Each a mount point on top of the workspace: read-only, and neither
        # removable nor renamable from inside (EBUSY), so it cannot be swapped.
        *(arg for name, _ in fs.protected
          for arg in ("--mount", mount_value(
              "type=bind", f"source={posixpath.join(host.workspace, name)}",
              f"target={posixpath.join(fs.sandbox_workspace, name)}", "readonly"))),
        # With TLS inspection the run container's trust is one host file (system CAs plus
        # the sidecar's run CA, certificates only) and the host's bundles are not bound; the
        # sidecar gets those instead, to verify the real servers against.
        *(_ro_binds(host.ca_files) if host.trust_bundle is None else
          ("--mount", mount_value("type=bind", f"source={host.trust_bundle}",
                                  f"target={SANDBOX_CA_BUNDLE}", "readonly"))),
        # Lent host directories (an agent CLI's install) at their own path. A
        # home the image keeps closed (root's, 0700) that holds one becomes an
        # empty tmpfs the session's uid may cross but not list.
        *(arg for home in _lent_homes(fs)
          for arg in ("--tmpfs", f"{home}:rw,nosuid,nodev,noexec,size=4096,mode=711")),
        *_ro_binds(fs.lent),
        "--workdir", fs.sandbox_workspace,
        "--hostname", "sandbox",
        # The helper is pid 1: every orphan comes back to it.
        "--entrypoint", PYTHON,
        host.image, "-I", "-S", "-c", host.helper_source,
        json.dumps(helper_config(profile, uid=host.uid, gid=host.gid, capture=host.capture),
                   separators=(",", ":")),
    ]
    create = (
        ("network", "create", "--driver", "bridge", "--internal", *labels, internal),
        ("network", "create", "--driver", "bridge", *labels, egress),
        tuple(sidecar_argv),
        # The sidecar is created on the egress bridge, then connected to the internal
        # network: it alone has a route off.
        ("network", "connect", internal, sidecar),
        tuple(run_argv),
    )
    return Topology(session=session, internal_network=internal, egress_network=egress,
                    sidecar=sidecar, run=run, create=create)


@dataclass(frozen=True, kw_only=True)
class DockerFacts:
    """What ``start`` found on this host and set up for one session, so ``prepare`` is pure.

    ``session`` names every resource. ``uid``/``gid``, ``lib_binds``,
    ``harness``, ``ca_files``, ``seccomp_profile`` and ``sidecar_hosts`` are
    ``DockerHost``'s. ``trust_bundle`` is set exactly when the session
    inspects TLS (a proxy, and a policy with ``inspection``): the
    harness-private file already created for the run's bundle. ``upstream_cafiles`` are the sidecar's upstream trust beyond the
    host's ``ca_files``. ``credentials`` are the values read for the
    inspection policy's credentials, by the variable they were read from;
    they are sent to the sidecar only. ``host_env`` is the harness's
    environment, which commands' environment is built from. ``libs_python``
    is the Python (``3.11``) the harness's bound libraries were built for:
    under inspection the sidecar loads compiled ones (cryptography's cffi
    backend), which only that Python can import.
    """

    session: str
    image: str
    uid: int
    gid: int
    lib_binds: tuple[tuple[str, str], ...]
    harness: str
    ca_files: tuple[str, ...]
    seccomp_profile: str | None
    sidecar_hosts: tuple[tuple[str, str], ...]
    trust_bundle: str | None
    upstream_cafiles: tuple[str, ...]
    credentials: Mapping[str, str] = field(repr=False)
    host_env: Mapping[str, str] = field(repr=False)
    helper_source: str
    libs_python: str


@dataclass(frozen=True, kw_only=True)
class DockerPlan:
    """A session's launch, whole: the resources, the sidecar's stdin, the enforcement, and
    the environment and attestation once the sidecar's address is known.

    ``seccomp``: firstrun's seccomp profile is in force, and its refusals
    are proven. ``sidecar_request`` is None without a proxy: the sidecar is
    created but never started. ``attest`` holds every check's input but the running
    session's; ``attestation`` completes it.
    """

    topology: Topology
    image: str
    user: str
    seccomp: bool
    enforcement: Enforcement
    capture: bool
    inspected: bool
    sidecar_request: Mapping[str, object] | None = field(repr=False)
    attest: AttestPlan
    home: str
    host_env: Mapping[str, str] = field(repr=False)

    def environment(self, *, sidecar_ip: str,
                    placeholders: Mapping[str, str] | None) -> dict[str, str]:
        """Every command's environment; ``placeholders`` are the sidecar's, under inspection."""
        return build_environment(
            self.host_env, path=SANDBOX_PATH, home=self.home, tmpdir=SANDBOX_TMP,
            proxy_url=f"http://{sidecar_ip}:{PROXY_PORT}"
            if self.sidecar_request is not None else None,
            inspected=self.inspected, placeholders=placeholders)

    def attestation(self, *, nonce: str | None, sidecar_ip: str, gateway: str,
                    landlock_abi: int) -> AttestPlan:
        """What to prove, given the sidecar's nonce and address, the bridge's gateway (where
        the host is reached) and the Landlock ABI the helper applied (0: none)."""
        return replace(self.attest, nonce=nonce, proxy_host=sidecar_ip, host_address=gateway,
                       write_witness=WRITE_WITNESS if landlock_abi else None,
                       self_mem_sealed=bool(landlock_abi))

    def to_data(self) -> dict[str, object]:
        return {"create": [list(argv) for argv in self.topology.create], "image": self.image,
                "user": self.user, "seccomp": self.seccomp, "enforcement": self.enforcement.value, "capture": self.capture,
                "inspected": self.inspected,
                "sidecar_request": dict(self.sidecar_request)
                if self.sidecar_request is not None else None,
                "attest": asdict(self.attest)}


def prepare(profile: SandboxProfile, proxy: ShellProxy | None, facts: DockerFacts) -> DockerPlan:
    """The launch of one docker session, as a pure function of the profile and the facts.

    With a proxy the session captures transparently, and its sidecar is
    told the policy (and, under inspection, the credentials' values and its
    upstream CA files); without one the run container's firewall lets
    nothing but loopback out. Leaving seccomp out of the profile (the
    audit's) leaves Docker's default profile in place and the session
    downgraded.
    """
    fs = profile.fs
    inspected = facts.trust_bundle is not None
    sidecar_ca_files = tuple(dict.fromkeys((*facts.ca_files, *facts.upstream_cafiles))) \
        if inspected else ()
    topology = build_topology(profile, session=facts.session, host=DockerHost(
        workspace=fs.workspace, uid=facts.uid, gid=facts.gid, image=facts.image,
        sidecar_image=facts.image, lib_binds=facts.lib_binds, harness=facts.harness,
        ca_files=facts.ca_files, seccomp_profile=facts.seccomp_profile,
        sidecar_hosts=facts.sidecar_hosts, trust_bundle=facts.trust_bundle,
        sidecar_ca_files=sidecar_ca_files, helper_source=facts.helper_source,
        capture=proxy is not None))
    request: dict[str, object] | None = None
    if proxy is not None:
        request = {"policy": profile.net.to_data()}
        if inspected:
            request.update({"credentials": dict(facts.credentials),
                            "cafiles": list(sidecar_ca_files),
                            "libs_python": facts.libs_python})
    seccomp = LayerName.SECCOMP in profile.required
    return DockerPlan(
        topology=topology, image=facts.image, user=f"{facts.uid}:{facts.gid}", seccomp=seccomp,
        enforcement=Enforcement.ENFORCED if seccomp else Enforcement.DOWNGRADED,
        capture=proxy is not None, inspected=inspected, sidecar_request=request,
        attest=AttestPlan(
            python=PYTHON, workspace=fs.sandbox_workspace, real_homes=fs.real_homes,
            exposed=fs.lent, proxy_port=PROXY_PORT if proxy is not None else None, nonce=None,
            landlock=False, network="firewalled_captured" if proxy is not None else "firewalled",
            supervisor="foreign_uid", protected=fs.protected),
        home=fs.sandbox_home, host_env=facts.host_env)
