"""A docker session's networks and containers, as data: a pure function of the profile.

Guarantee: ``build_topology`` is pure (no I/O, no clock), so every docker
command a session issues to create its resources is golden-tested. The
shape it gives:

- an **internal** network (``docker network create --internal``): no route
  off it, no NAT, no published ports;
- an **egress** network, an ordinary bridge, for the sidecar only;
- the **proxy sidecar**, created on the egress network and then connected
  to the internal one, running ``python -m firstrun.proxy`` (this package's
  own egress proxy, bound read-only from the harness) with the policy as
  JSON on its stdin;
- the **run container**, attached to the internal network only, so its one
  way out is the sidecar's port. Its pid 1 is the helper
  (``firstrun.sandbox.helper``), attached by the harness on its stdin and
  stdout, running as the container's root with only CAP_SETUID, CAP_SETGID,
  CAP_SETPCAP and CAP_KILL, which each command drops (bounding set included) with
  every id before it execs; no command shares the helper's uid.

With TLS inspection (``DockerHost.trust_bundle``) the run container's trust
is one host file bound read-only at ``SANDBOX_CA_BUNDLE`` (the system CAs
plus the run CA the sidecar made; certificates only), and the host's own
bundles are not bound there; the sidecar instead gets the host's CA files,
read-only at their own paths, to verify the real servers against.

Both containers drop every capability (the run container's helper keeps the
four above, for itself only), set ``no-new-privileges``, run under
firstrun's own seccomp profile (``seccomp.py``: Docker's allow-list
semantics with the linux backend's refusals; Docker's default profile only
when the host names none, which only the audit does, never ``unconfined``),
have a read-only
root with a size-capped tmpfs ``/tmp``, run their untrusted code as a non-root
uid, and carry pids, memory (no extra swap) and CPU limits. The run
container also has ``WRITE_WITNESS``, a tmpfs anyone may write by its mode
that the helper's Landlock rules leave out: a write refused there is
Landlock's refusal, which attestation proves. The workspace is the only host
directory bound writable. Every resource carries the ``org.firstrun.session``
label, so leftovers of a harness that died are found and removed by label.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
from dataclasses import dataclass

from firstrun.policy.process import SANDBOX_CA_BUNDLE
from firstrun.policy.profile import SandboxProfile
from firstrun.sandbox.capture import CapturePorts
from firstrun.sandbox.linux.spec import WRITABLE_DEVICE_DIRS, WRITABLE_DEVICE_FILES

LABEL_MANAGED = "org.firstrun.managed"
LABEL_SESSION = "org.firstrun.session"
LABEL_HARNESS = "org.firstrun.harness"
PROXY_PORT = 3128
SANDBOX_TMP = "/tmp"
# Where the sidecar finds this package and h11, bound read-only.
SIDECAR_LIB = "/opt/firstrun/lib"
# The sidecar handles a few connections at a time; it needs little.
SIDECAR_LIMITS = {"pids": 64, "memory": 256 << 20, "cpus": "0.5"}
SIDECAR_UID = 65534
# The run container's interpreter (the images' Debian Python), which runs the helper.
PYTHON = "/usr/bin/python3"
# The capabilities the helper keeps: to start each command as the session's uid,
# and to kill what the commands leave (they run under another uid than its own).
HELPER_CAPS = ("SETUID", "SETGID", "SETPCAP", "KILL")
WRITE_WITNESS = "/run/firstrun-witness"
CAPTURE_PORTS = CapturePorts()
# The sidecar's listeners for the helper alone: redirected flows, and DNS.
TRANSPARENT_PORT = PROXY_PORT + 1
DNS_PORT = PROXY_PORT + 2


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
        *(_ro_binds(host.ca_files) if host.trust_bundle is None else
          ("--mount", mount_value("type=bind", f"source={host.trust_bundle}",
                                  f"target={SANDBOX_CA_BUNDLE}", "readonly"))),
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
        ("network", "connect", internal, sidecar),
        tuple(run_argv),
    )
    return Topology(session=session, internal_network=internal, egress_network=egress,
                    sidecar=sidecar, run=run, create=create)
