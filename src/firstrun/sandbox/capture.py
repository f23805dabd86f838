"""Transparent capture's outside half: the nat rules that send every flow of a sandbox to its relay.

Guarantee: ``capture_rules`` is pure and golden-tested. Loaded into the
sandbox's network namespace before any untrusted command runs, the rules send
every DNS query (UDP or TCP, any address, port 53) to the in-sandbox stub,
every other outbound TCP connection to the relay and every other datagram to
the catcher, leaving loopback traffic alone. Rules or a route that cannot be
loaded refuse the session: capture is never quietly absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from firstrun.errors import SandboxError, SandboxUnavailable
from firstrun.fixes import apt_fix

WHO = "capture"


@dataclass(frozen=True, kw_only=True)
class CapturePorts:
    """Where the helper listens inside the sandbox (its own namespace: no clash with the host)."""

    dns: int = 15353
    tcp: int = 15001
    udp: int = 15354

    def to_config(self, *, ipv6: bool) -> dict[str, object]:
        return {"dns_port": self.dns, "tcp_port": self.tcp, "udp_port": self.udp, "ipv6": ipv6}


# Each target listens on 127.0.0.1 (or ::1) inside: the relay and the stub are the helper's
# (``helper._Capture``), and the proxy decides every flow they pass on.
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


# On gvisor the network stack is the sentry's, which nothing outside can enter: the helper
# loads the same rules and routes from inside, as the container's init, before it reports
# ready, with the legacy xtables tools, since the sentry's netstack speaks their socket
# options and not nftables' netlink.
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


_Step = tuple[list[str], str | None]


def _run(enter: list[str], step: _Step, fds: list[int]) -> subprocess.CompletedProcess[str] | Exception:
    argv, stdin = step
    try:
        return subprocess.run([*enter, "--", *argv], input=stdin, text=True, capture_output=True,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, timeout=30,
                              pass_fds=fds)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return exc


def _raise_failed(steps: list[_Step], outcomes: list[subprocess.CompletedProcess[str] | Exception],
                  *, who: str) -> None:
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


# On linux the namespace has no interface but lo; a default route through lo gives a
# connection to any address a route, and the nat rule rewrites it before it could be
# delivered anywhere.
class LinuxCapture:
    """A linux sandbox's capture, loaded from outside in two lanes, before any command runs.

    The tables need only the network namespace, so they load from the
    moment bubblewrap has made it (``start``, in a thread, while bubblewrap
    and the helper set up); the routes need ``lo`` up with its addresses,
    so they load once the helper is ready (``finish``), after the tables,
    and the first failure is raised. The
    namespaces are entered by descriptors opened while bubblewrap's child
    was held before its setup (``--userns-block-fd``): its first user
    namespace, which owns the network namespace, for a harness that is not
    root (which holds CAP_NET_ADMIN there because it made it).

    The IPv6 table is loaded wherever the kernel has IPv6 (a nat table
    refuses more, never less), the IPv6 route only where the sandbox's
    ``lo`` has ``::1``, which the helper reports.
    """

    def __init__(self, ports: CapturePorts, *, net_fd: int, user_fd: int | None) -> None:
        v4, v6 = capture_rules(ports)
        self._fds = [fd for fd in (net_fd, user_fd) if fd is not None]
        self._enter = [_tool("nsenter"), f"--net=/proc/self/fd/{net_fd}"]
        if user_fd is not None:
            self._enter += [f"--user=/proc/self/fd/{user_fd}", "--preserve-credentials"]
        self._ip = _tool("ip")
        restore, restore6 = _tool("iptables-restore"), _tool("ip6tables-restore")
        self._tables: list[_Step] = [([restore, "-w"], v4)]
        if os.path.exists("/proc/net/if_inet6"):
            self._tables.append(([restore6, "-w"], v6))
        self._outcomes: list[subprocess.CompletedProcess[str] | Exception] = []
        self._thread = threading.Thread(target=self._load_tables, name="firstrun-capture",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _load_tables(self) -> None:
        # One after the other: iptables-nft's restores can trip over each
        # other's generation counter in one namespace.
        for step in self._tables:
            self._outcomes.append(_run(self._enter, step, self._fds))

    def finish(self, *, ipv6: bool) -> None:
        """Wait for the tables, then load the routes (IPv6's where ``ipv6``); raise what failed.

        IPv4's default route goes in last, after everything else has loaded:
        a process inside that sees it (``attest_probe``) sees capture whole.
        """
        self._thread.join()
        try:
            _raise_failed(self._tables, self._outcomes, who=WHO)
            routes: list[_Step] = []
            if ipv6:
                routes.append(([self._ip, "-6", "route", "replace", "default", "dev", "lo",
                                "src", "::1"], None))
            routes.append(([self._ip, "route", "replace", "default", "dev", "lo",
                            "src", "127.0.0.1"], None))
            for step in routes:
                _raise_failed([step], [_run(self._enter, step, self._fds)], who=WHO)
        finally:
            self.close()

    def close(self) -> None:
        """Close the namespace descriptors (after ``finish``, or when the start failed)."""
        if self._thread.is_alive():
            self._thread.join()
        while self._fds:
            os.close(self._fds.pop())


# Docker: the run container's namespace firewall (``docker.resources``) loads the same nat
# rules beside its own filter rules.
def load(pid: int, *, v4: str, v6: str | None, default_via_lo: bool, v6_via_lo: bool,
         who: str) -> None:
    """``iptables-restore`` ``v4`` (and ``ip6tables-restore`` ``v6``) in ``pid``'s network
    namespace, from outside (docker's run container); ``default_via_lo`` also makes the default route go through
    ``lo`` from the loopback address, so the nat table's REDIRECT lands on a listener
    there (a connection sourced from another interface's address cannot be delivered to
    127.0.0.1); ``v6_via_lo`` the same for IPv6, where the namespace has it. Any step
    that fails refuses the session."""
    nsenter = _tool("nsenter")
    ip, restore, restore6 = _tool("ip"), _tool("iptables-restore"), _tool("ip6tables-restore")
    enter = [nsenter, f"--target={pid}", "--net"]
    routes: list[_Step] = []
    tables: list[_Step] = [([restore, "-w"], v4)]
    if default_via_lo:
        routes.append(([ip, "route", "replace", "default", "dev", "lo", "src", "127.0.0.1"], None))
    if v6 is not None:
        if v6_via_lo:
            routes.append(([ip, "-6", "route", "replace", "default", "dev", "lo", "src", "::1"],
                           None))
        tables.append(([restore6, "-w"], v6))

    # The routes and the tables touch different things, and nothing in the
    # namespace runs before both are in: the two lanes run at once, so a
    # session's start waits for the slower. The two tables stay one after
    # the other: iptables-nft's restores can trip over each other's
    # generation counter in one namespace.
    with ThreadPoolExecutor(max_workers=2) as pool:
        lanes = list(pool.map(lambda lane: [_run(enter, step, []) for step in lane],
                              (routes, tables)))
    _raise_failed([*routes, *tables], [*lanes[0], *lanes[1]], who=who)
