"""The real battery: every action, inside every configuration a backend can really run.

Guarantee: each cell of the matrix is the outcome of a real attempt inside a
real session, judged by a host-side witness wherever one can see the action
(``fixtures``), else by the kernel's own answer as the probe reported it;
``Cell.witness`` says which. A configuration is a set of layers the backend
really applies or really omits. Nothing is sent off this machine: an action
that could only be attempted by leaving it is marked not run.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from firstrun.audit import fixtures
from firstrun.audit.model import (
    ACTIONS,
    DISK_BOUND,
    Action,
    ActionResult,
    AuditedLayer,
    Reach,
    closing_layers,
    predict,
    stoppers,
    subsets,
)
from firstrun.enclosure import ProxySetup, open_enclosure
from firstrun.errors import SandboxError, UsageError
from firstrun.policy.addresses import IPAddress
from firstrun.policy.decision import Reason, Verdict
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.process import SANDBOX_CA_BUNDLE
from firstrun.policy.profile import ALL_LAYERS, LayerName, SandboxProfile
from firstrun.proxy.records import EgressRecord
from firstrun.sandbox.base import Backend, ExecResult, Session
from firstrun.sandbox.disk import SizedWorkspace, open_sized_workspace
from firstrun.sandbox.docker.backend import DockerBackend
from firstrun.sandbox.docker.resources import bridge_gateway
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.select import (
    BackendOptions,
    build_backend,
    entry,
    unavailable,
)

PROBE_SOURCE = (Path(__file__).parent / "probe.py").read_text(encoding="utf-8")
# Under /usr, which every backend shows read-only: a write there is the
# audit's "system file", planted here so no real one is ever at stake.
SYSTEM_DIR = "/usr/local/share"
CREDENTIAL_VARIABLE = "FIRSTRUN_AUDIT_TOKEN"
# The credential belongs to this host, which the audit never contacts; the
# action sends it to the allowed registry instead.
CREDENTIAL_HOST = "private.firstrun-audit.test"
# The other tenant a fronted request names in its Host, inside a tunnel to the
# allowed registry. Not on the allow-list, and nothing resolves or dials it:
# the registry stands in for the CDN that would route on that Host.
FRONTED_HOST = "tenant.firstrun-audit.test"
_CREDENTIAL_SOURCE = "FIRSTRUN_AUDIT_TOKEN_VALUE"
# The fixture registry's CA, copied into each workspace: how a session
# without inspection trusts the registry (with it, the run's bundle does).
_FIXTURE_CA = "fixture-ca.pem"
_INSPECTION = frozenset({AuditedLayer.METHOD_RULES, AuditedLayer.CREDENTIAL_MASKING})
_ACTION_TIMEOUT_S = 150.0
# The workspace's disk bound: a run's default (4 GiB) is the same mechanism,
# and this one fills in a moment; fill_disk writes this much more than it.
DISK_MB = 32
_OVERFILL_MB = 8
# Planted before the session, as a clone of the user's would hold it.
PROTECTED_ENTRY = ".git/config"
_PROTECTED_CONTENT = "[core]\n\trepositoryformatversion = 0\n"
_FILL_PATH = "audit-fill.bin"

# The layers a backend is, whatever its profile says.
_LINUX_BASE = frozenset({AuditedLayer.FILESYSTEM, AuditedLayer.NAMESPACES})
_DOCKER_BASE = frozenset({AuditedLayer.FILESYSTEM, AuditedLayer.NAMESPACES, AuditedLayer.LANDLOCK, AuditedLayer.NETWORK})
# gVisor's sandbox, its read-only root and --network=none are the backend itself.
_GVISOR_BASE = _DOCKER_BASE
# The profile's layer for each model layer a backend's profile can leave out.
_OMITTABLE: dict[str, dict[AuditedLayer, LayerName]] = {
    "linux": {AuditedLayer.SECCOMP: LayerName.SECCOMP, AuditedLayer.LANDLOCK: LayerName.LANDLOCK,
              AuditedLayer.NETWORK: LayerName.NETWORK},
    "docker": {AuditedLayer.SECCOMP: LayerName.SECCOMP},
    "gvisor": {AuditedLayer.SECCOMP: LayerName.SECCOMP},
}
# The interpreter of the run images; the harness's own is not in the container.
_DOCKER_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True, kw_only=True)
class Configuration:
    """One backend with one set of layers applied."""

    backend: str
    layers: frozenset[AuditedLayer]
    omitted: frozenset[AuditedLayer] = frozenset()
    # What commands already cannot do, before any layer: the harness's own
    # privileges (``local`` only: every other backend runs commands as its
    # own user), and the workspace's disk bound (every backend, ``bounded``).
    host_refuses: frozenset[Reach] = frozenset()

    @property
    def inspect_tls(self) -> bool:
        return _INSPECTION <= self.layers

    @property
    def name(self) -> str:
        if not self.layers:
            return f"{self.backend}: no layers"
        base = f"{self.backend}: " + ("full stack" if not self.omitted else "without " + ", ".join(
            layer.value for layer in AuditedLayer if layer in self.omitted))
        return base + (" + --inspect-tls" if self.inspect_tls else "")


def bounded() -> frozenset[Reach]:
    """What the workspace's disk bound refuses here: a run's workspace is a filesystem of
    its own size wherever the harness can mount one (as root; ``sandbox.disk``)."""
    return DISK_BOUND if os.geteuid() == 0 else frozenset()


def configurations(backend: str) -> tuple[Configuration, ...]:
    """Every configuration of ``backend`` that can really be run, the full stack last."""
    # linux builds each subset of seccomp, Landlock and the network layer
    # through the profile's ``required`` set (bubblewrap's filesystem view and
    # namespaces are the backend itself and are always on), and each subset
    # with the network layer once more with the proxy's TLS inspection (method
    # rules and credential masking, which need the proxy). docker runs the full
    # stack, the stack without firstrun's seccomp profile (Docker's default
    # then applies; the container, its read-only root and its sidecar network
    # are the backend itself), and the full stack with the sidecar's TLS
    # inspection (the sidecar is handed the registry's CA and the credential's
    # value). gvisor runs the same three (without the layer no filter is loaded
    # in the sentry; the harness's proxy inspects). ``local`` is the no-layer
    # baseline, explicitly unenforced: it runs with the harness's own
    # privileges, so what those refuse is measured in a child of the harness
    # (``harness_refusals``) and given to the model.
    bound = bounded()
    if backend == "linux":
        optional = frozenset(_OMITTABLE["linux"])
        plain = [Configuration(backend="linux", layers=_LINUX_BASE | kept, omitted=optional - kept,
                               host_refuses=bound)
                 for kept in subsets(optional)]
        inspected = [Configuration(backend="linux", layers=c.layers | _INSPECTION,
                                   omitted=c.omitted, host_refuses=bound)
                     for c in plain if AuditedLayer.NETWORK in c.layers]
        return (*plain, *inspected)
    if backend == "docker":
        # --inspect-tls on the full stack only: the sidecar inspects, and the
        # layers it adds do not depend on which seccomp profile is loaded.
        optional = frozenset(_OMITTABLE["docker"])
        plain = [Configuration(backend="docker", layers=_DOCKER_BASE | kept,
                               omitted=optional - kept, host_refuses=bound)
                 for kept in subsets(optional)]
        return (*plain, Configuration(backend="docker", layers=_DOCKER_BASE | optional | _INSPECTION,
                                      host_refuses=bound))
    if backend == "gvisor":
        # As docker's: the harness's proxy inspects, whichever filter is loaded.
        optional = frozenset(_OMITTABLE["gvisor"])
        plain = [Configuration(backend="gvisor", layers=_GVISOR_BASE | kept,
                               omitted=optional - kept, host_refuses=bound)
                 for kept in subsets(optional)]
        return (*plain, Configuration(backend="gvisor", layers=_GVISOR_BASE | optional | _INSPECTION,
                                      host_refuses=bound))
    if backend == "local":
        return (Configuration(backend="local", layers=frozenset(),
                              host_refuses=harness_refusals() | bound),)
    raise UsageError(f"the audit has no configurations for backend {backend!r}; "
                     f"choose one of {', '.join(AUDITED_BACKENDS)}")


AUDITED_BACKENDS: tuple[str, ...] = ("linux", "docker", "gvisor", "local")

# A child of the harness runs the battery's own OOM-score probe, the way a
# local command would, and says whether the kernel let it.
_LOWER_OOM = ("from firstrun.audit.probe import lower_oom_score\n"
              "print('lowered' if lower_oom_score({})[0] else 'refused')\n")


def harness_refusals() -> frozenset[Reach]:
    """What a command run with the harness's own privileges cannot do, measured in a child.

    A command under ``local`` starts at the harness's OOM score. The kernel
    lowers a score below the process's floor (its start, unless a privileged
    ancestor set a lower one) only for a holder of CAP_SYS_RESOURCE, which a
    harness in a container usually lacks; neither the floor nor the answer
    can be read, so it is tried.
    """
    out = subprocess.run([sys.executable, "-c", _LOWER_OOM], capture_output=True,
                         text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    answer = out.stdout.strip()
    if out.returncode != 0 or answer not in ("refused", "lowered"):
        raise SandboxError(f"could not measure the harness's own OOM floor (exit "
                           f"{out.returncode}): {out.stderr.strip()[-300:]}", who="audit")
    return frozenset({Reach.OOM_SCORE_DOWN}) if answer == "refused" else frozenset()


# How a run turns on each layer a residual path may need.
CONTROLS: dict[AuditedLayer, str] = {
    AuditedLayer.METHOD_RULES: "--inspect-tls (a request's Host must be its tunnel's; registries "
                        "GET/HEAD only)",
    AuditedLayer.CREDENTIAL_MASKING: "--inspect-tls with the credential under firstrun.credentials",
}


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One action in one configuration: what the model said, and what happened."""

    action: str
    predicted: ActionResult
    observed: ActionResult | None
    evidence: str
    witness: str
    # What a host-side witness counted (connections, datagrams, requests,
    # leftover processes), where it counts; None where it does not.
    seen: int | None = None
    stopped_by: tuple[AuditedLayer, ...] = ()

    @property
    def agrees(self) -> bool:
        return self.observed is None or self.observed is self.predicted

    def to_data(self) -> dict[str, object]:
        return {
            "action": self.action,
            "predicted": self.predicted.value,
            "observed": self.observed.value if self.observed is not None else None,
            "agrees": self.agrees,
            "witness": self.witness,
            "evidence": self.evidence,
            "seen": self.seen,
            "stopped_by": [layer.value for layer in self.stopped_by],
        }


@dataclass(frozen=True, kw_only=True)
class ConfigurationResult:
    configuration: Configuration
    cells: tuple[Cell, ...]
    session: dict[str, object] = field(default_factory=dict)

    def _count(self, needed: bool, outcome: ActionResult) -> int:
        by_id = {a.id: a for a in ACTIONS}
        return sum(1 for c in self.cells
                   if by_id[c.action].needed is needed and c.observed is outcome)

    @property
    def unneeded_open(self) -> int:
        return self._count(False, ActionResult.THROUGH)

    @property
    def needed_broken(self) -> int:
        return self._count(True, ActionResult.STOPPED)

    @property
    def not_run(self) -> int:
        return sum(1 for c in self.cells if c.observed is None)

    def to_data(self) -> dict[str, object]:
        c = self.configuration
        return {
            "name": c.name,
            "backend": c.backend,
            "layers": [layer.value for layer in AuditedLayer if layer in c.layers],
            "omitted": [layer.value for layer in AuditedLayer if layer in c.omitted],
            "host_refuses": sorted(reach.value for reach in c.host_refuses),
            "unneeded_open": self.unneeded_open,
            "needed_broken": self.needed_broken,
            "not_run": self.not_run,
            "session": self.session,
            "cells": [cell.to_data() for cell in self.cells],
        }


@dataclass(frozen=True, kw_only=True)
class Residual:
    """An unneeded action still open under a configuration with no layer omitted.

    ``closed_by`` are the layers that would each close it; ``available``
    those of them this backend can apply (another configuration has them).
    """

    configuration: str
    backend: str
    action: str
    closed_by: tuple[AuditedLayer, ...]
    available: tuple[AuditedLayer, ...]


@dataclass(frozen=True, kw_only=True)
class Skipped:
    backend: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class AuditResult:
    results: tuple[ConfigurationResult, ...]
    skipped: tuple[Skipped, ...] = ()

    @property
    def disagreements(self) -> tuple[tuple[str, Cell], ...]:
        return tuple((r.configuration.name, cell) for r in self.results for cell in r.cells
                     if not cell.agrees)

    @property
    def residual(self) -> tuple[Residual, ...]:
        by_id = {a.id: a for a in ACTIONS}
        out = []
        for r in self.results:
            config = r.configuration
            if config.omitted or not config.layers:
                continue
            offered = frozenset().union(*(o.configuration.layers for o in self.results
                                          if o.configuration.backend == config.backend))
            for cell in r.cells:
                act = by_id[cell.action]
                if not act.needed and cell.observed is ActionResult.THROUGH:
                    closing = closing_layers(act, config.layers, config.backend)
                    out.append(Residual(
                        configuration=config.name, backend=config.backend, action=act.id,
                        closed_by=closing,
                        available=tuple(layer for layer in closing if layer in offered)))
        return tuple(out)

    def to_data(self) -> dict[str, object]:
        return {
            "schema": "firstrun.audit/2",
            "actions": [{"id": a.id, "title": a.title, "needed": a.needed,
                         "reaches": sorted(r.value for r in a.reaches)} for a in ACTIONS],
            "configurations": [r.to_data() for r in self.results],
            "residual": [{"configuration": r.configuration, "backend": r.backend,
                          "action": r.action,
                          "closed_by": [layer.value for layer in r.closed_by],
                          "available": [layer.value for layer in r.available]}
                         for r in self.residual],
            "disagreements": [{"configuration": name, **cell.to_data()}
                              for name, cell in self.disagreements],
            "skipped": [{"backend": s.backend, "reason": s.reason} for s in self.skipped],
        }


# -- running -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Run:
    """What one configuration's actions left behind, for the judges."""

    witnesses: fixtures.Witnesses
    registry: fixtures.Registry
    workspace: str
    probes: dict[str, tuple[bool, str]]
    records: tuple[EgressRecord, ...]
    proxied: bool
    leftovers: tuple[int, ...]
    kill_marker_alive: bool


def _params(act: Action, w: fixtures.Witnesses, registry: fixtures.Registry,
            inspected: bool) -> dict[str, object]:
    return {
        "action": act.id, "nonce": w.nonce,
        "cafile": SANDBOX_CA_BUNDLE if inspected else _FIXTURE_CA,
        "write_path": "audit-written.txt", "test_path": "audit-test-ran.txt",
        "site_path": "audit-site", "mount_path": "audit-mnt",
        "package": fixtures.PACKAGE,
        "registry_host": fixtures.REGISTRY_HOST, "registry_ip": registry.address,
        "registry_port": registry.port, "raw_ip_path": f"/rawip-{w.nonce}",
        "secret_path": w.secret_path, "system_path": w.system_path, "token": w.token,
        "environ_pid": w.environ_marker.pid, "kill_pid": w.kill_marker.pid,
        "abstract_name": w.abstract_name, "canary_host": w.address,
        "canary_port": w.canary.sock.getsockname()[1],
        "dns_port": w.dns.sock.getsockname()[1], "dns_label": w.nonce,
        "credential_variable": CREDENTIAL_VARIABLE,
        "protected_path": PROTECTED_ENTRY, "fill_path": _FILL_PATH,
        "fill_bytes": (DISK_MB + _OVERFILL_MB) << 20,
        "fronted_host": FRONTED_HOST, "fronted_path": f"/fronted-{w.nonce}",
    }


def _probe(session: Session, python: str, params: dict[str, object],
           env: dict[str, str]) -> tuple[bool, str]:
    result: ExecResult = session.exec(
        [python, "-I", "-S", "-c", PROBE_SOURCE, json.dumps(params)],
        timeout=_ACTION_TIMEOUT_S, env=env)
    try:
        reported = json.loads(result.stdout.text())
        return bool(reported["done"]), str(reported["detail"])
    except (ValueError, KeyError, TypeError):
        return False, f"probe exit {result.exit_code}: {result.stderr.text()[-300:]}"


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


Judgement = tuple[ActionResult | None, str, int | None]
Judge = Callable[[_Run], Judgement]
# The host's own witnesses: a canary's connection count, a planted file's
# contents, a marker process still alive, a request the fixture registry
# recorded (its method and body, its credential, the Host it named), a
# leftover found in the host's process table after the session closed. Only
# the kernel interfaces no host-side witness observes (a user namespace, a
# mount, an io_uring, a ptrace, an OOM score) are judged by the kernel's own
# answer, as the probe reported it.
_HOST, _KERNEL = "host", "kernel's answer"


def _through(yes: bool, evidence: str, seen: int | None = None) -> Judgement:
    return (ActionResult.THROUGH if yes else ActionResult.STOPPED), evidence, seen


def _file(name: str) -> Judge:
    def judge(run: _Run) -> Judgement:
        content = _read(os.path.join(run.workspace, name))
        return _through(content == run.witnesses.nonce,
                        f"{name} on the host {'holds the nonce' if content else 'is missing'}")
    return judge


def _installed(run: _Run) -> Judgement:
    module = os.path.join(run.workspace, "audit-site", fixtures.MODULE, "__init__.py")
    installed = run.registry.marker in _read(module)
    downloads = sum(1 for s in run.registry.seen() if s.path.endswith(".whl")
                    and s.method == "GET")
    detail = "" if installed else f" ({run.probes['install_package'][1]})"
    return _through(installed, f"module {'installed' if installed else 'absent'} in the "
                               f"workspace; registry served the wheel {downloads} time(s) so far"
                               + detail)


def _in_output(what: Callable[[fixtures.Witnesses], str], action: str) -> Judge:
    def judge(run: _Run) -> Judgement:
        _, detail = run.probes[action]
        leaked = what(run.witnesses) in detail
        return _through(leaked, "the secret appeared in the session's output" if leaked
                        else f"secret not seen ({detail[:60]})")
    return judge


def _system_file(run: _Run) -> Judgement:
    changed = _read(run.witnesses.system_path) != run.witnesses.system_content
    return _through(changed, f"canary {'changed' if changed else 'unchanged'} "
                             f"({run.probes['write_system_file'][1]})")


def _protected(run: _Run) -> Judgement:
    changed = _read(os.path.join(run.workspace, PROTECTED_ENTRY)) != _PROTECTED_CONTENT
    return _through(changed, f"{PROTECTED_ENTRY} on the host "
                             f"{'rewritten' if changed else 'unchanged'} "
                             f"({run.probes['write_protected_entry'][1]})")


def _filled(run: _Run) -> Judgement:
    try:
        size = os.path.getsize(os.path.join(run.workspace, _FILL_PATH))
    except OSError:
        size = 0
    return _through(size > DISK_MB << 20, f"{size >> 20} MiB landed in the workspace, whose "
                                          f"bound is {DISK_MB} MiB ({run.probes['fill_disk'][1]})")


def _leftover(run: _Run) -> Judgement:
    return _through(bool(run.leftovers),
                    f"{len(run.leftovers)} process(es) with the marker argv alive after close",
                    len(run.leftovers))


def _killed(run: _Run) -> Judgement:
    return _through(not run.kill_marker_alive,
                    f"host marker {'dead' if not run.kill_marker_alive else 'alive'} "
                    f"({run.probes['kill_host_process'][1]})")


def _kernel(action: str) -> Judge:
    def judge(run: _Run) -> Judgement:
        done, detail = run.probes[action]
        return _through(done, detail)
    return judge


def _listener(pick: Callable[[fixtures.Witnesses], object], action: str) -> Judge:
    def judge(run: _Run) -> Judgement:
        count, _ = pick(run.witnesses).count()  # type: ignore[attr-defined]
        return _through(count > 0, f"host listener accepted {count} connection(s) "
                                   f"({run.probes[action][1]})", count)
    return judge


def _dns(run: _Run) -> Judgement:
    count, data = run.witnesses.dns.count()
    seen = run.witnesses.nonce.encode() in data
    return _through(seen, f"host resolver canary received {count} datagram(s)", count)


def _registry_saw(match: Callable[[fixtures.Seen, fixtures.Witnesses], bool], action: str,
                  what: str) -> Judge:
    def judge(run: _Run) -> Judgement:
        hits = sum(1 for s in run.registry.seen() if match(s, run.witnesses))
        return _through(hits > 0, f"registry recorded {hits} {what} "
                                  f"({run.probes[action][1]})", hits)
    return judge


def _fronted(run: _Run) -> Judgement:
    """Through when the registry answered a request naming the other tenant in its Host.

    The registry stands in for a CDN behind the allowed name: it records the
    Host of every request that reached it, the header a CDN routes on. The
    proxy's own refusals (``host_mismatch``) are named beside the count, not
    judged by: what counts is what reached the upstream.
    """
    hits = sum(1 for s in run.registry.seen() if s.path == f"/fronted-{run.witnesses.nonce}"
               and any(k.lower() == "host" and v.split(":", 1)[0] == FRONTED_HOST
                       for k, v in s.headers))
    refused = sum(1 for r in run.records if r.reason is Reason.HOST_MISMATCH)
    proxy = f"; proxy refused {refused} as {Reason.HOST_MISMATCH.value}" if run.proxied else ""
    return _through(hits > 0, f"registry recorded {hits} request(s) with Host {FRONTED_HOST}"
                              f"{proxy} ({run.probes['domain_fronting'][1]})", hits)


def _metadata(run: _Run) -> Judgement:
    if not run.proxied:
        return None, "not run: without the network layer it would leave this machine", None
    seen = [r for r in run.records if r.host == "169.254.169.254"]
    allowed = [r for r in seen if r.decision is Verdict.ALLOW]
    reasons = sorted({r.reason.value for r in seen})
    return _through(bool(allowed), f"proxy records for 169.254.169.254: {len(seen)} "
                                   f"({', '.join(reasons) or 'none'}), {len(allowed)} allowed",
                    len(allowed))


JUDGES: dict[str, tuple[str, Judge]] = {
    "write_workspace": (_HOST, _file("audit-written.txt")),
    "run_test": (_HOST, _file("audit-test-ran.txt")),
    "install_package": (_HOST, _installed),
    "read_home_secret": (_HOST, _in_output(lambda w: w.secret, "read_home_secret")),
    "write_system_file": (_HOST, _system_file),
    "write_protected_entry": (_HOST, _protected),
    "leave_process": (_HOST, _leftover),
    "read_host_environ": (_HOST, _in_output(lambda w: w.secret, "read_host_environ")),
    "kill_host_process": (_HOST, _killed),
    "create_user_namespace": (_KERNEL, _kernel("create_user_namespace")),
    "mount": (_KERNEL, _kernel("mount")),
    "io_uring": (_KERNEL, _kernel("io_uring")),
    "ptrace_sibling": (_KERNEL, _kernel("ptrace_sibling")),
    "lower_oom_score": (_KERNEL, _kernel("lower_oom_score")),
    "host_abstract_socket": (_HOST, _listener(lambda w: w.abstract, "host_abstract_socket")),
    "host_loopback": (_HOST, _listener(lambda w: w.canary, "host_loopback")),
    "raw_ip": (_HOST, _registry_saw(lambda s, w: s.path == f"/rawip-{w.nonce}", "raw_ip",
                                    "direct request(s) by address")),
    "resolve_name": (_HOST, _dns),
    "cloud_metadata": (_HOST, _metadata),
    "upload_registry": (_HOST, _registry_saw(
        lambda s, w: s.method == "POST" and s.body == w.nonce.encode(), "upload_registry",
        "upload(s) of the nonce")),
    "credential_elsewhere": (_HOST, _registry_saw(
        lambda s, w: any(w.credential in v for _, v in s.headers), "credential_elsewhere",
        "request(s) carrying the real credential")),
    "domain_fronting": (_HOST, _fronted),
    "fill_disk": (_HOST, _filled),
}


def _resolver(address: str) -> Callable[[str, int], object]:
    async def resolve(host: str, _port: int) -> list[IPAddress]:
        # Only the fixture registry's name resolves, to its address; the audit
        # never asks the host's resolver, so no lookup leaves the machine.
        return [ipaddress.ip_address(address)] if host == fixtures.REGISTRY_HOST else []
    return resolve


def audit_policy(registry_port: int, registry_address: str = "127.0.0.1") -> NetworkPolicy:
    """The registry is the allow-list; it is on a private address, so an override names it."""
    return NetworkPolicy.build(
        allow=(), overrides=[(f"{fixtures.REGISTRY_HOST}:{registry_port}",
                              [f"{registry_address}/32"])],
        source="audit")


def docker_bridge_address() -> str:
    """The host's address on docker's default bridge: where a container can reach the host.

    Raises ``SandboxError`` when the daemon does not say; the audit never
    guesses an address (a wrong one could lead off this machine).
    """
    address = bridge_gateway("bridge")
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError as exc:
        raise SandboxError(f"docker's default bridge has no gateway address ({address!r})",
                           who="audit") from exc
    if not parsed.is_private:
        raise SandboxError(f"docker's default bridge gateway {address} is not a private address",
                           who="audit")
    # Only an address of this host's own can be bound.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            raise SandboxError(f"docker's default bridge gateway {address} is not this host's "
                               f"({exc.strerror})", who="audit") from exc
    return address


def _build(name: str, registry: fixtures.Registry,
           credentials: Mapping[str, str] | None = None) -> Callable[[BackendOptions], Backend]:
    """How the audit makes ``name``'s backend; ``credentials``: under --inspect-tls, the
    values docker's sidecar is handed."""
    if name == "docker":
        # The sidecar resolves the registry's name from its /etc/hosts, never by DNS,
        # and under inspection verifies it against the registry's own CA.
        return lambda options: DockerBackend(
            on_record=options.on_record,
            sidecar_hosts=((fixtures.REGISTRY_HOST, registry.address),),
            upstream_cafiles=(registry.cafile,) if credentials is not None else (),
            credential_env=credentials)
    return lambda options: build_backend(name, replace(options, allow_unenforced=name == "local"))


@contextmanager
def _workspace() -> Iterator[str]:
    """A workspace as a run makes one: sized where the harness can mount one (``bounded``)."""
    disk = open_sized_workspace(DISK_MB, asked=False)
    if isinstance(disk, SizedWorkspace):
        try:
            yield disk.path
        finally:
            disk.close()
        return
    path = tempfile.mkdtemp(prefix="firstrun-audit-ws-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_configuration(config: Configuration, registry: fixtures.Registry,
                      backend: Backend | None = None) -> ConfigurationResult:
    """One session of ``config``, every action in it, every cell judged after it closed.

    One session per configuration runs every action, so the matrix stays
    bounded. The registry, the canaries and the proxy are on loopback, or for
    docker on the default bridge's host address (a container cannot reach the
    host's loopback).

    The session is enclosed as ``firstrun run`` encloses its own
    (``firstrun.enclosure``). ``registry`` must listen where ``config``'s
    backend can reach it (for docker: ``docker_bridge_address()``); the
    witnesses listen there too. ``backend``: one already made, reused.
    """
    python = _DOCKER_PYTHON if config.backend == "docker" else os.path.realpath(sys.executable)
    policy = audit_policy(registry.port, registry.address)
    proxied = AuditedLayer.NETWORK in config.layers
    omitted = frozenset(_OMITTABLE[config.backend][layer] for layer in config.omitted)
    witnesses = fixtures.Witnesses(home=os.path.expanduser("~"), system_dir=SYSTEM_DIR,
                                   address=registry.address)
    probes: dict[str, tuple[bool, str]] = {}
    if config.inspect_tls:
        policy = policy.with_inspection(InspectionPolicy.build(
            credentials=[(CREDENTIAL_VARIABLE, CREDENTIAL_HOST, _CREDENTIAL_SOURCE)],
            source="audit"))
    credentials = {_CREDENTIAL_SOURCE: witnesses.credential}
    build = (lambda _options: backend) if backend is not None else _build(
        config.backend, registry, credentials if config.inspect_tls else None)
    egress = ProxySetup(env=credentials, resolver=_resolver(registry.address),
                    extra_cafiles=(registry.cafile,)) if proxied else None
    try:
        with ExitStack() as stack:
            workspace = stack.enter_context(_workspace())
            with open(os.path.join(workspace, _FIXTURE_CA), "wb") as f:
                f.write(registry.ca_pem)
            os.makedirs(os.path.join(workspace, os.path.dirname(PROTECTED_ENTRY)))
            with open(os.path.join(workspace, PROTECTED_ENTRY), "w", encoding="utf-8") as f:
                f.write(_PROTECTED_CONTENT)
            # Protected, as a recheck's kept workspace and ``sandbox --workspace`` are.
            profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=True),
                                     net=policy, required=ALL_LAYERS - omitted)
            # Without masking, a task given a credential hands the session its
            # real value; with it, the backend put the placeholder there.
            credential_env = ({} if config.inspect_tls
                              else {CREDENTIAL_VARIABLE: witnesses.credential})
            with open_enclosure(entry(config.backend), profile, egress,
                                build=build) as enclosure:
                session = enclosure.start()
                info = session.info.to_data()
                for act in ACTIONS:
                    if act.id == "cloud_metadata" and not proxied:
                        probes[act.id] = (False, "not attempted")
                        continue
                    probes[act.id] = _probe(session, python,
                                            _params(act, witnesses, registry, config.inspect_tls),
                                            credential_env)
            run = _Run(witnesses=witnesses, registry=registry, workspace=workspace,
                       probes=probes, records=tuple(enclosure.records()), proxied=proxied,
                       leftovers=tuple(fixtures.pids_with_argv0(witnesses.token)),
                       kill_marker_alive=witnesses.kill_marker.poll() is None)
            cells = []
            for act in ACTIONS:
                witness, judge = JUDGES[act.id]
                observed, evidence, seen = judge(run)
                cells.append(Cell(action=act.id,
                                  predicted=predict(act, config.layers, config.backend,
                                                    config.host_refuses),
                                  observed=observed, evidence=evidence, witness=witness,
                                  seen=seen,
                                  stopped_by=stoppers(act, config.layers, config.backend)))
    finally:
        witnesses.close()
    return ConfigurationResult(configuration=config, cells=tuple(cells), session=info)


def backend_unavailable(name: str) -> str | None:
    """Why ``name`` cannot be audited on this machine now; None when it can."""
    if name not in AUDITED_BACKENDS:
        raise UsageError(f"the audit has no configurations for backend {name!r}; "
                         f"choose one of {', '.join(AUDITED_BACKENDS)}")
    try:
        cap = unavailable(name, BackendOptions(allow_unenforced=name == "local"))
    except ImportError as exc:
        return f"cannot be loaded here ({exc})"
    return None if cap is None else f"{cap.name}: {cap.detail}"


def run_audit(backends: Sequence[str],
              on_configuration: Callable[[Configuration], None] | None = None) -> AuditResult:
    """Every configuration of every backend that is available; the others skipped with why.

    Raises ``SandboxError`` (with the configuration named) when a session of
    an available backend cannot start: the audit never reports a matrix it
    did not measure.
    """
    results: list[ConfigurationResult] = []
    skipped: list[Skipped] = []
    with ExitStack() as stack:
        registries: dict[str, fixtures.Registry] = {}
        for name in backends:
            why = backend_unavailable(name)
            if why is not None:
                skipped.append(Skipped(backend=name, reason=why))
                continue
            address = docker_bridge_address() if name == "docker" else "127.0.0.1"
            if address not in registries:
                registries[address] = stack.enter_context(fixtures.Registry(address))
            registry = registries[address]
            # Docker's sidecar hands its records to the backend it was built
            # with, so each configuration builds its own (run_configuration).
            backend = None if name == "docker" else _build(name, registry)(BackendOptions())
            for config in configurations(name):
                if on_configuration is not None:
                    on_configuration(config)
                try:
                    results.append(run_configuration(config, registry, backend))
                except SandboxError as exc:
                    raise SandboxError(f"{config.name}: {exc}", who="audit") from exc
    return AuditResult(results=tuple(results), skipped=tuple(skipped))
