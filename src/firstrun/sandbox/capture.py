"""Transparent capture's outside half: the nat rules that send every flow of a sandbox to its relay.

Guarantee: ``capture_rules`` is pure, so the rules every session loads are
golden-tested. Loaded into the sandbox's own network namespace from outside
(``apply_linux``, before any untrusted command runs), they send every DNS
query (UDP or TCP, to any address, on port 53) to the in-sandbox stub,
every other outbound TCP connection to the relay, and every other datagram
to the catcher, each on 127.0.0.1 (or ::1) inside; loopback traffic inside
the sandbox is left alone. The relay and the stub are the helper's
(``helper._Capture``); the proxy decides every flow they pass on. A rule
set that cannot be loaded, or a route that cannot be added, refuses the
session: capture is never quietly absent.

On linux the namespace has no interface but ``lo``; a default route through
``lo`` gives a connection to any address a route, and the nat rule
rewrites it before it could be delivered anywhere. On docker the run
container's namespace firewall (``docker.resources``) loads the same nat
rules beside its own filter rules. On gvisor the network stack is the
sentry's, which nothing outside can enter: the helper loads the same rules
and routes from inside, as the container's init and before it reports ready
(``gvisor_steps``), with the legacy xtables tools, since the sentry's
netstack speaks their socket options and not nftables' netlink.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.sandbox.base import apt_fix

WHO = "capture"


@dataclass(frozen=True, kw_only=True)
class CapturePorts:
    """Where the helper listens inside the sandbox (its own namespace: no clash with the host)."""

    dns: int = 15353
    tcp: int = 15001
    udp: int = 15354

    def to_config(self, *, ipv6: bool) -> dict[str, object]:
        return {"dns_port": self.dns, "tcp_port": self.tcp, "udp_port": self.udp, "ipv6": ipv6}


def nat_rules(ports: CapturePorts, *, loopback: str) -> list[str]:
    """The nat OUTPUT rules, for one family (``loopback`` is 127.0.0.0/8 or ::1/128)."""
    return [
        f"-A OUTPUT -p udp -m udp --dport 53 -j REDIRECT --to-ports {ports.dns}",
        f"-A OUTPUT -p tcp -m tcp --dport 53 -j REDIRECT --to-ports {ports.dns}",
        f"-A OUTPUT -d {loopback} -j RETURN",
        f"-A OUTPUT -p tcp -j REDIRECT --to-ports {ports.tcp}",
        f"-A OUTPUT -p udp -j REDIRECT --to-ports {ports.udp}",
    ]


def capture_rules(ports: CapturePorts) -> tuple[str, str]:
    """``iptables-restore`` and ``ip6tables-restore`` input for a linux sandbox's namespace."""
    def table(loopback: str) -> str:
        # The namespace has no interface but lo: after these, nothing is bound
        # anywhere but a listener of the helper's or the sandbox's own loopback.
        lines = ["*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]",
                 ":OUTPUT ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]",
                 *nat_rules(ports, loopback=loopback), "COMMIT"]
        return "\n".join(lines) + "\n"
    return table("127.0.0.0/8"), table("::1/128")


@dataclass(frozen=True, kw_only=True)
class GvisorTools:
    """Host paths of the tools the helper runs inside (the host's /usr is bound read-only)."""

    ip: str
    restore: str
    restore6: str


GVISOR_TOOLS = ("ip", "iptables-legacy-restore", "ip6tables-legacy-restore")


# xtables locks a file under /run, which is read-only inside; removed once loaded.
GVISOR_LOCKFILE = "/dev/shm/.firstrun-xtables.lock"


def gvisor_steps(ports: CapturePorts, tools: GvisorTools) -> dict[str, object]:
    """What the helper runs inside a gVisor sandbox, per family, before any command.

    The sentry has no ``ip route replace`` but starts with no default route,
    so ``add`` is exact. IPv6's steps run only where the sandbox has ``::1``.
    """
    v4, v6 = capture_rules(ports)
    return {
        "lockfile": GVISOR_LOCKFILE,
        "v4": [{"argv": [tools.ip, "route", "add", "default", "via", "127.0.0.1", "dev", "lo"]},
               {"argv": [tools.restore, "-w"], "stdin": v4}],
        "v6": [{"argv": [tools.ip, "-6", "route", "add", "default", "via", "::1", "dev", "lo"]},
               {"argv": [tools.restore6, "-w"], "stdin": v6}],
    }


def find_gvisor_tools() -> GvisorTools | str:
    """The tools ``gvisor_steps`` runs, or which are missing."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    found = {t: shutil.which(t, path=path) for t in GVISOR_TOOLS}
    missing = [t for t, where in found.items() if where is None]
    if missing:
        return f"transparent capture needs {', '.join(missing)}"
    # Not resolved: xtables-legacy-multi is one binary that acts on the name it was run by.
    ip, restore, restore6 = (found[t] or "" for t in GVISOR_TOOLS)
    return GvisorTools(ip=ip, restore=restore, restore6=restore6)


def _tool(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise SandboxUnavailable(
            f"transparent capture needs {name}, which is not installed", who=WHO,
            fix=apt_fix("iptables", "iproute2", "util-linux"))
    return found


def apply_linux(pid: int, ports: CapturePorts, *, own_user_namespace: bool, ipv6: bool) -> None:
    """Load the rules and routes into the network namespace of ``pid`` (the helper).

    A root harness enters the namespace alone; one that is not root enters
    the sandbox's user namespace first, which it owns (it made it), and so
    holds CAP_NET_ADMIN over the network namespace that belongs to it.
    """
    v4, v6 = capture_rules(ports)
    load(pid, v4=v4, v6=v6 if ipv6 else None, default_via_lo=True, v6_via_lo=ipv6,
         own_user_namespace=own_user_namespace, who=WHO)


def load(pid: int, *, v4: str, v6: str | None, default_via_lo: bool, v6_via_lo: bool,
         own_user_namespace: bool, who: str) -> None:
    """``iptables-restore`` ``v4`` (and ``ip6tables-restore`` ``v6``) in ``pid``'s network
    namespace, from outside; ``default_via_lo`` also makes the default route go through
    ``lo`` from the loopback address, so the nat table's REDIRECT lands on a listener
    there (a connection sourced from another interface's address cannot be delivered to
    127.0.0.1); ``v6_via_lo`` the same for IPv6, where the namespace has it. Any step
    that fails refuses the session."""
    nsenter = _tool("nsenter")
    ip, restore, restore6 = _tool("ip"), _tool("iptables-restore"), _tool("ip6tables-restore")
    enter = [nsenter, f"--target={pid}", "--net"]
    if own_user_namespace:
        enter += ["--user", "--preserve-credentials"]
    Step = tuple[list[str], str | None]
    routes: list[Step] = []
    tables: list[Step] = [([restore, "-w"], v4)]
    if default_via_lo:
        routes.append(([ip, "route", "replace", "default", "dev", "lo", "src", "127.0.0.1"], None))
    if v6 is not None:
        if v6_via_lo:
            routes.append(([ip, "-6", "route", "replace", "default", "dev", "lo", "src", "::1"],
                           None))
        tables.append(([restore6, "-w"], v6))

    def run(step: Step) -> subprocess.CompletedProcess[str] | Exception:
        argv, stdin = step
        try:
            return subprocess.run([*enter, "--", *argv], input=stdin, text=True,
                                  capture_output=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return exc

    # The routes and the tables touch different things, and nothing in the
    # namespace runs before both are in: the two lanes run at once, so a
    # session's start waits for the slower. The two tables stay one after
    # the other: iptables-nft's restores can trip over each other's
    # generation counter in one namespace.
    with ThreadPoolExecutor(max_workers=2) as pool:
        lanes = list(pool.map(lambda lane: [run(step) for step in lane], (routes, tables)))
    steps, outcomes = [*routes, *tables], [*lanes[0], *lanes[1]]
    for (argv, _), done in zip(steps, outcomes, strict=True):
        if isinstance(done, Exception):
            raise SandboxError(f"cannot run {argv[0]} in the sandbox's network namespace: "
                               f"{done}", who=who) from done
        if done.returncode != 0:
            raise SandboxUnavailable(
                f"{os.path.basename(argv[0])} {' '.join(argv[1:])} failed in the sandbox's "
                f"network namespace: {done.stderr.strip()[-300:]}", who=who,
                fix="load the kernel's nat support (modprobe nf_nat nft_redir, or run the "
                    "harness as root once so the kernel loads it)")
