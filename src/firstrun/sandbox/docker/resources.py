"""Creating, firewalling and removing a docker session's resources, and reaping leftovers.

Guarantee: every resource is created from the pure ``Topology``, labelled with
its session and its harness (pid and start time). ``reap`` removes every
labelled resource whose harness is gone, never one whose harness runs;
``remove`` removes a session's resources however far creation got. The run
container's firewall lets out only loopback (not the embedded DNS) and the
sidecar's ports (the capture ports for the helper alone), on any daemon.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import dataclass

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.fixes import apt_fix
from firstrun.sandbox.capture import CapturePorts, load, nat_rules
from firstrun.sandbox.docker.topology import (
    DNS_PORT,
    LABEL_HARNESS,
    LABEL_MANAGED,
    LABEL_SESSION,
    PROXY_PORT,
    TRANSPARENT_PORT,
    Topology,
)
from firstrun.sandbox.ownership import alive, process_identity

EMBEDDED_DNS = "127.0.0.11"
_DOCKER_TIMEOUT_S = 120.0


def docker_binary() -> str:
    path = shutil.which("docker")
    if path is None:
        raise SandboxUnavailable("the docker CLI is not installed", who="docker",
                                 fix=apt_fix("docker.io"))
    return path


# The CLI, not the Engine API: it negotiates the API version with any daemon, and its
# ``exec -i`` and ``start --attach`` give plain pipes, where the API's hijacked, multiplexed
# streams would need a framing parser of our own.
def docker(*args: str, docker_bin: str | None = None, stdin: str | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one docker CLI command; a failure is a ``SandboxError`` carrying docker's words."""
    argv = [docker_bin or docker_binary(), *args]
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              stdin=None if stdin is not None else subprocess.DEVNULL,
                              timeout=_DOCKER_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"docker {args[0]}: {exc}", who="docker") from exc
    if check and done.returncode != 0:
        raise SandboxError(f"docker {' '.join(args[:2])}: {done.stderr.strip()[-1000:]}",
                           who="docker")
    return done


_SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name`` in this process's network namespace, if any."""
    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def bridge_gateway(network: str, *, docker_bin: str | None = None) -> str:
    """The host's address on docker bridge ``network``, found as the kernel knows it.

    The daemon's own IPAM record is asked first; it is empty for the
    default bridge on a daemon's first start, before a restart fills it
    (moby/moby#26799), so then the bridge interface's own address is read,
    and failing that the subnet's first host, which is where docker puts
    the gateway. Raises ``SandboxError`` when none of them names an address.
    """
    raw = docker("network", "inspect", network, "--format", "{{json .}}",
                 docker_bin=docker_bin).stdout
    try:
        info = json.loads(raw)
        configs = (info.get("IPAM") or {}).get("Config") or []
        options = info.get("Options") or {}
    except (ValueError, AttributeError) as exc:
        raise SandboxError(f"docker network inspect {network}: unreadable answer",
                           who="docker") from exc
    for config in configs:
        if config.get("Gateway"):
            return str(config["Gateway"]).split("/")[0]
    name = options.get("com.docker.network.bridge.name")
    if name:
        address = interface_address(str(name))
        if address is not None:
            return address
    for config in configs:
        subnet = config.get("Subnet")
        if subnet and ":" not in subnet:
            return str(next(ipaddress.ip_network(subnet, strict=False).hosts()))
    raise SandboxError(f"docker network {network} has no gateway address: no IPAM gateway, no "
                       "bridge interface address and no IPv4 subnet", who="docker")


def harness_identity() -> str:
    identity = process_identity(os.getpid())
    if identity is None:
        raise SandboxError("cannot read this process's own /proc entry", who="docker")
    return identity


@dataclass(frozen=True, kw_only=True)
class Reaped:
    containers: tuple[str, ...]
    networks: tuple[str, ...]
    volumes: tuple[str, ...]


def _labelled(kind: str, docker_bin: str | None) -> list[tuple[str, str]]:
    listing = {"container": ("ps", "--all"), "network": ("network", "ls"),
               "volume": ("volume", "ls")}[kind]
    name = "{{.Name}}" if kind == "volume" else ("{{.Names}}" if kind == "container"
                                                 else "{{.Name}}")
    out = docker(*listing, "--filter", f"label={LABEL_MANAGED}=1", "--format",
                 f'{name}\t{{{{.Label "{LABEL_HARNESS}"}}}}', docker_bin=docker_bin).stdout
    return [tuple(line.split("\t", 1)) for line in out.splitlines() if "\t" in line]  # type: ignore[misc]


# How long a concurrent reaper's removal is waited for: 50 listings, 0.2 s apart.
_REAP_POLLS = 50
_REAP_POLL_S = 0.2


def reap(*, docker_bin: str | None = None) -> Reaped:
    """Remove every labelled resource whose harness is no longer running.

    Concurrent starts may reap the same leftovers, so a removal that fails
    is judged by listing again: only a dead harness's resource that still
    exists afterwards is an error. Another reaper's removal may still be in
    progress then ("removal ... is already in progress"), so the listing is
    repeated, a bounded number of times, until that removal has finished.
    """
    removers = {"container": ("rm", "--force", "--volumes"), "network": ("network", "rm"),
                "volume": ("volume", "rm", "--force")}
    removed: dict[str, list[str]] = {"container": [], "network": [], "volume": []}
    for kind in ("container", "network", "volume"):
        dead = [name for name, owner in _labelled(kind, docker_bin) if not alive(owner)]
        if not dead:
            continue
        done = docker(*removers[kind], *dead, docker_bin=docker_bin, check=False)
        if done.returncode != 0:
            left = set(dead)
            for _ in range(_REAP_POLLS):
                left &= {name for name, _ in _labelled(kind, docker_bin)}
                if not left:
                    break
                time.sleep(_REAP_POLL_S)
            if left:
                raise SandboxError(f"cannot remove leftover {kind}s {sorted(left)}: "
                                   f"{done.stderr.strip()[-500:]}", who="docker")
        removed[kind] = dead
    return Reaped(containers=tuple(removed["container"]), networks=tuple(removed["network"]),
                  volumes=tuple(removed["volume"]))


def remove(topology: Topology, *, docker_bin: str | None = None) -> None:
    """Remove whichever of the session's containers and networks exist, containers first."""
    label = f"label={LABEL_SESSION}={topology.session}"
    containers = docker("ps", "--all", "--filter", label, "--format", "{{.Names}}",
                        docker_bin=docker_bin).stdout.split()
    if containers:
        docker("rm", "--force", "--volumes", *containers, docker_bin=docker_bin)
    networks = docker("network", "ls", "--filter", label, "--format", "{{.Name}}",
                      docker_bin=docker_bin).stdout.split()
    if networks:
        docker("network", "rm", *networks, docker_bin=docker_bin)


# This closes what ``--internal`` leaves open. Docker gives a container on an internal
# network a default route through the bridge, and the host answers on the bridge's address:
# any host service on 0.0.0.0 is reachable (proven in tests/docker). On daemons before
# 26.0.0 the embedded DNS at 127.0.0.11 also forwards names from the host's namespace
# (CVE-2024-29018), a way to leak data by lookup. The rules are set from the host, in the
# container's own network namespace, which has no CAP_NET_ADMIN to undo them; IPv6 gets
# loopback only.
def firewall_rules(sidecar_ip: str, *, capture: CapturePorts | None = None,
                   host_address: str | None = None, ipv6: bool = False) -> tuple[str, str]:
    """(iptables-restore, ip6tables-restore) input for the run container's namespace (pure).

    With ``capture``, the nat table sends every flow to the helper's relay
    and stub, as on linux, except what goes to the sidecar (the proxy-aware
    path, and the helper's own way to the sidecar's flow and DNS ports,
    which only uid 0, the helper, may take) and to the host's bridge
    address, which stays refused outright (no record: nothing could ever be
    allowed there). ``ipv6``: the container has ``::1``, so IPv6 is redirected too.
    """
    nat4: list[str] = []
    nat6: list[str] = []
    helper_only: list[str] = []
    if capture is not None:
        nat4 = ["*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
                ":POSTROUTING ACCEPT [0:0]", f"-A OUTPUT -d {sidecar_ip}/32 -j RETURN",
                *([f"-A OUTPUT -d {host_address}/32 -j RETURN"] if host_address else []),
                *nat_rules(capture, loopback="127.0.0.0/8"), "COMMIT"]
        if ipv6:
            nat6 = ["*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]",
                    ":OUTPUT ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]",
                    *nat_rules(capture, loopback="::1/128"), "COMMIT"]
        helper_only = [f"-A OUTPUT -d {sidecar_ip}/32 -p tcp -m tcp -m multiport --dports "
                       f"{TRANSPARENT_PORT},{DNS_PORT} -m owner --uid-owner 0 -j ACCEPT"]
    v4 = "\n".join([
        *nat4,
        "*filter",
        ":INPUT ACCEPT [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT DROP [0:0]",
        f"-A OUTPUT -d {EMBEDDED_DNS}/32 -j DROP",
        "-A OUTPUT -o lo -j ACCEPT",
        f"-A OUTPUT -d {sidecar_ip}/32 -p tcp -m tcp --dport {PROXY_PORT} -j ACCEPT",
        *helper_only,
        # A reset from the firewall itself: a refused dial fails at once with
        # ECONNREFUSED instead of hanging; anything else gets EPERM (DROP).
        "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
        "COMMIT",
        "",
    ])
    v6 = "\n".join([
        *nat6,
        "*filter",
        ":INPUT ACCEPT [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT DROP [0:0]",
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
        "COMMIT",
        "",
    ])
    return v4, v6


def apply_firewall(container_pid: int, sidecar_ip: str, *, capture: CapturePorts | None = None,
                   host_address: str | None = None, ipv6: bool = False) -> None:
    """Load ``firewall_rules`` into the network namespace of ``container_pid``.

    Under capture the default route goes through ``lo`` first (the sidecar
    and the host stay on the bridge's own subnet route), as on linux.
    """
    v4, v6 = firewall_rules(sidecar_ip, capture=capture, host_address=host_address, ipv6=ipv6)
    load(container_pid, v4=v4, v6=v6, default_via_lo=capture is not None,
         v6_via_lo=capture is not None and ipv6, who="docker")
