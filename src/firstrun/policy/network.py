"""Every egress decision, as pure functions over the policy (stdlib only, no I/O, no clock).

Guarantee: the proxy asks ``decide_name`` before it resolves anything and
``decide_addresses`` after it resolved once, so a name the rules deny is never
resolved and an address that passes is the one dialled; ``decide_dns`` and
``decide_stream`` rule on the DNS stub's answers and on streams that are neither
TLS nor HTTP. Report mode turns a denial into an allow carrying ``would_deny``,
except the floor's and malformed input's, which hold in every mode.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from firstrun.errors import PolicyError
from firstrun.policy.addresses import AddressClass, IPAddress, address_class
from firstrun.policy.decision import Decision, DecisionLayer, Reason, Verdict
from firstrun.policy.hosts import (
    HostPattern,
    canonical_host,
    parse_ip_literal,
    parse_patterns,
)
from firstrun.policy.methods import InspectionPolicy


class Channel(StrEnum):
    SHELL = "shell"
    DOCS = "docs"
    # An agent CLI's own traffic to its vendor's API (``NetworkPolicy.agent``),
    # counted apart from the shell's egress: neither a page read nor a blocked step.
    AGENT = "agent"


class Mode(StrEnum):
    ENFORCE = "enforce"
    REPORT = "report"


_FLOOR_REASON = {
    AddressClass.LOOPBACK: Reason.RESOLVED_LOOPBACK,
    AddressClass.PRIVATE: Reason.RESOLVED_PRIVATE,
    AddressClass.LINK_LOCAL: Reason.RESOLVED_LINK_LOCAL,
    AddressClass.METADATA: Reason.RESOLVED_METADATA,
    AddressClass.CGNAT: Reason.RESOLVED_CGNAT,
    AddressClass.MULTICAST: Reason.RESOLVED_MULTICAST,
    AddressClass.UNSPECIFIED: Reason.RESOLVED_UNSPECIFIED,
    AddressClass.RESERVED: Reason.RESOLVED_RESERVED,
    AddressClass.EMBEDDED_IPV4: Reason.RESOLVED_EMBEDDED_IPV4,
}

# Reserved (RFC 6761 ``.invalid``): the proxy answers it itself with its nonce,
# never resolving or dialling, so a sandbox can prove which proxy it reached.
ATTESTATION_HOST = "attest.firstrun.invalid"


def destination_label(host: str | None, port: int | None, reason: str | None = None) -> str:
    """A record's destination as people read it: ``host:port``, an IPv6 host bracketed.

    A record without a host is the proxy's closing record for the requests
    past its record budget, or a request too malformed to name a host.
    """
    if not host:
        if reason == Reason.RECORD_BUDGET_EXHAUSTED:
            return "(requests past the proxy's record budget)"
        return "(no valid host)"
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}" if port is not None else shown


# Package registries for Python, Node and Debian: what a quickstart installs from.
DEFAULT_ALLOW = (
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "deb.debian.org",
    "security.debian.org",
)


@dataclass(frozen=True, kw_only=True)
class Override:
    """A task's explicit exception: ``pattern`` may reach ``networks`` despite the floor.

    An override without networks only bypasses the allow-list; with networks
    it also lets those exact address ranges through the floor.
    """

    pattern: HostPattern
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    allow: tuple[HostPattern, ...] = ()
    deny: tuple[HostPattern, ...] = ()
    docs: tuple[HostPattern, ...] = ()
    # Docs hosts the task also named for the shell (quickstarted's rule: an
    # explicit network.allow entry wins over attribution for that host). Every
    # such request is recorded as ``allowed_docs_host_on_shell``, an
    # attribution gap a report can count, never a silent hole.
    shell_docs: tuple[HostPattern, ...] = ()
    overrides: tuple[Override, ...] = ()
    mode: Mode = Mode.ENFORCE
    # Addresses of the proxy itself, refused even when an override would allow them.
    proxy_addresses: tuple[tuple[str, int], ...] = ()
    # Set when the proxy terminates TLS (--inspect-tls): the method, path and
    # body rules and the credentials for decrypted requests.
    inspection: InspectionPolicy | None = None
    # Exact name:port pairs a raw TCP stream (not TLS, not HTTP) may reach.
    tcp: tuple[HostPattern, ...] = ()
    # An agent CLI's API hosts: reached from the sandbox, allowed and recorded
    # on the agent channel (``channel_for``). The proxy cannot tell which
    # process dialled, so a shell command reaching one is recorded there too.
    agent: tuple[HostPattern, ...] = ()
    # An agent CLI's own web fetch: a request from the sandbox to a docs host
    # is answered by the run's docs reader (``allowed_as_page_read``), never
    # dialled, so each page it fetched is a page read like read_docs's.
    serve_docs: bool = False

    @classmethod
    def build(
        cls,
        *,
        allow: Sequence[str] = DEFAULT_ALLOW,
        deny: Sequence[str] = (),
        docs: Sequence[str] = (),
        shell_docs: Sequence[str] = (),
        overrides: Sequence[tuple[str, Sequence[str]]] = (),
        mode: Mode = Mode.ENFORCE,
        source: str = "policy",
        tcp: Sequence[str] = (),
    ) -> NetworkPolicy:
        """Parse text entries; ``source`` names where they came from in any error."""
        ovs = []
        for pattern_text, nets in overrides:
            try:
                networks = tuple(ipaddress.ip_network(n, strict=False) for n in nets)
            except ValueError as exc:
                raise PolicyError(f"{source}: override {pattern_text!r}: {exc}") from None
            (pattern,) = parse_patterns([pattern_text], source=source)
            ovs.append(Override(pattern=pattern, networks=networks))
        return cls(
            allow=parse_patterns(list(allow), source=f"{source} allow"),
            deny=parse_patterns(list(deny), source=f"{source} deny"),
            docs=parse_patterns(list(docs), source=f"{source} docs"),
            shell_docs=parse_patterns(list(shell_docs), source=f"{source} docs opened to the shell"),
            overrides=tuple(ovs),
            mode=mode,
            tcp=parse_tcp_rules(tcp, source=f"{source} tcp"),
        )

    def with_proxy_addresses(self, addresses: Sequence[tuple[str, int]]) -> NetworkPolicy:
        return replace(self, proxy_addresses=tuple(addresses))

    def with_inspection(self, inspection: InspectionPolicy | None) -> NetworkPolicy:
        return replace(self, inspection=inspection)

    def to_data(self) -> dict[str, object]:
        """Plain data for hashing, recording and the Docker sidecar.

        ``inspection`` appears only when set, so a policy without it hashes
        as it did before inspection existed.
        """
        data = self._name_data()
        if self.inspection is not None:
            data["inspection"] = self.inspection.to_data()
        if self.tcp:
            # Only when set, like inspection: a policy without tcp rules hashes as before.
            data["tcp"] = [str(p) for p in self.tcp]
        if self.agent:
            data["agent"] = [str(p) for p in self.agent]
        if self.serve_docs:
            data["serve_docs"] = True
        return data

    def _name_data(self) -> dict[str, object]:
        return {
            "allow": [str(p) for p in self.allow],
            "deny": [str(p) for p in self.deny],
            "docs": [str(p) for p in self.docs],
            "shell_docs": [str(p) for p in self.shell_docs],
            "overrides": [
                {"pattern": str(o.pattern), "networks": [str(n) for n in o.networks]}
                for o in self.overrides
            ],
            "mode": self.mode.value,
        }


def parse_tcp_rules(entries: Sequence[str], *, source: str) -> tuple[HostPattern, ...]:
    """``name:port`` entries, each an exact name (no wildcard) with an explicit port."""
    patterns = parse_patterns(list(entries), source=source)
    for text, pattern in zip(entries, patterns, strict=True):
        if pattern.port is None:
            raise PolicyError(f"{source}: {text!r} needs its port (a tcp rule is one name and "
                              "one port, such as github.com:22)")
        if pattern.wildcard:
            raise PolicyError(f"{source}: {text!r}: a tcp rule names one host, not a wildcard")
    return patterns


@dataclass(frozen=True, kw_only=True)
class Request:
    channel: Channel
    host: str
    port: int


# Layers whose denials report mode never lifts.
# Report mode is for learning which names a quickstart needs, so an allow-list
# can be written from a real run; a quickstart nobody vetted must still not
# reach the host's loopback or the cloud metadata service meanwhile.
_ALWAYS_ENFORCED = frozenset({DecisionLayer.FLOOR, DecisionLayer.PROTOCOL})


def _deny(policy: NetworkPolicy, reason: Reason, layer: DecisionLayer, host: str) -> Decision:
    if policy.mode is Mode.REPORT and layer not in _ALWAYS_ENFORCED:
        return Decision(
            verdict=Verdict.ALLOW, reason=reason, layer=layer, host=host, would_deny=reason
        )
    return Decision(verdict=Verdict.DENY, reason=reason, layer=layer, host=host)


def _override_for(policy: NetworkPolicy, host: str, port: int) -> Override | None:
    for ov in policy.overrides:
        if ov.pattern.matches(host, port):
            return ov
    return None


def _allow(reason: Reason, layer: DecisionLayer, host: str, override: str | None = None) -> Decision:
    return Decision(verdict=Verdict.ALLOW, reason=reason, layer=layer, host=host,
                    override=override)


def _refuse(reason: Reason, layer: DecisionLayer, host: str) -> Decision:
    # Enforced as found; report mode lifts it once, in the rule walk (_reported).
    return Decision(verdict=Verdict.DENY, reason=reason, layer=layer, host=host)


def _reported(policy: NetworkPolicy, decision: Decision) -> Decision:
    if decision.allowed:
        return decision
    return _deny(policy, decision.reason, decision.layer, decision.host)


# A name rule decides a (canonical) host and port for a channel, or passes
# (None) to the next; NAME_RULES is their order, and the first to decide wins.
NameRule = Callable[["NetworkPolicy", "Channel", str, int], "Decision | None"]


def _docs_channel(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Decision | None:
    # The docs reader's channel reaches the route's hosts and nothing else.
    if channel is not Channel.DOCS:
        return None
    if any(p.matches(host, port) for p in policy.docs):
        return _allow(Reason.ALLOWED_DOCS_CHANNEL, DecisionLayer.ATTRIBUTION, host)
    return _refuse(Reason.NOT_DOCS_HOST, DecisionLayer.ATTRIBUTION, host)


def _agent_channel(policy: NetworkPolicy, channel: Channel, host: str,
                   port: int) -> Decision | None:
    # Only an agent host is on the agent channel (``channel_for``): the harness
    # granted it for the run, so no task list has a say.
    if channel is not Channel.AGENT:
        return None
    if any(p.matches(host, port) for p in policy.agent):
        return _allow(Reason.ALLOWED_AGENT_CHANNEL, DecisionLayer.ATTRIBUTION, host)
    return _refuse(Reason.NOT_ALLOWED, DecisionLayer.DEFAULT, host)


def _docs_host_on_shell(policy: NetworkPolicy, channel: Channel, host: str,
                        port: int) -> Decision | None:
    # Before the lists: a docs host read from the shell would not be counted
    # as a page read, unless the task opened it to the shell (and not denied it).
    if not any(p.matches(host, port) for p in policy.docs):
        return None
    if _opened_to_shell(policy, host, port) and not any(p.matches(host, port) for p in policy.deny):
        return _allow(Reason.ALLOWED_DOCS_HOST_ON_SHELL, DecisionLayer.ATTRIBUTION, host)
    if policy.serve_docs:
        return _allow(Reason.ALLOWED_AS_PAGE_READ, DecisionLayer.ATTRIBUTION, host)
    return _refuse(Reason.DOCS_HOST_ON_SHELL, DecisionLayer.ATTRIBUTION, host)


def _deny_list(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Decision | None:
    if any(p.matches(host, port) for p in policy.deny):
        return _refuse(Reason.DENIED_BY_LIST, DecisionLayer.ALLOWLIST, host)
    return None


def _override_rule(policy: NetworkPolicy, channel: Channel, host: str,
                   port: int) -> Decision | None:
    override = _override_for(policy, host, port)
    if override is None:
        return None
    return _allow(Reason.ALLOWED_BY_OVERRIDE, DecisionLayer.OVERRIDE, host, str(override.pattern))


def _allow_list(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Decision | None:
    if any(p.matches(host, port) for p in policy.allow):
        return _allow(Reason.ALLOWED_BY_LIST, DecisionLayer.ALLOWLIST, host)
    return None


def _tcp_rule(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Decision | None:
    if any(p.matches(host, port) for p in policy.tcp):
        return _allow(Reason.ALLOWED_BY_TCP_RULE, DecisionLayer.ALLOWLIST, host)
    return None


def _ip_literal(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Decision | None:
    # An address no entry named is refused as what it is, not as an unknown name.
    if parse_ip_literal(host) is not None:
        return _refuse(Reason.IP_LITERAL, DecisionLayer.ALLOWLIST, host)
    return None


def _other_port(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Decision | None:
    # Allowed on some port, not this one: the task line that would allow it names the port.
    if any(p.matches_host(host) for p in policy.allow):
        return _refuse(Reason.PORT_NOT_ALLOWED, DecisionLayer.ALLOWLIST, host)
    return None


def _nothing_allows(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Decision:
    return _refuse(Reason.NOT_ALLOWED, DecisionLayer.DEFAULT, host)


# Attribution first: docs hosts are refused on the shell channel and allowed on
# the docs channel, so every page an agent reads goes through ``read_docs`` and
# is recorded. A docs host the task also opened to the shell (``shell_docs``)
# is let through and each request recorded as ``allowed_docs_host_on_shell``,
# so the gap in the page record is counted, not hidden; with ``serve_docs``
# any other is answered by the docs reader, a page read. An agent CLI's API
# host is allowed on the agent channel, whatever the lists say. Then the deny
# list, the task's overrides, the allow list and the tcp rules; whatever none
# of them allows is refused (an IP literal or another port of an allowed host
# under its own reason). The floor is the address rules' (``ADDRESS_RULES``).
NAME_RULES: tuple[NameRule, ...] = (
    _docs_channel, _agent_channel, _docs_host_on_shell, _deny_list, _override_rule,
    _allow_list, _tcp_rule, _ip_literal, _other_port, _nothing_allows,
)


def channel_for(policy: NetworkPolicy, channel: Channel, host: str, port: int) -> Channel:
    """The channel a request from ``channel`` to ``host:port`` is decided and recorded on:
    the agent channel for a shell request to an agent host, else its own."""
    if channel is not Channel.SHELL or not policy.agent:
        return channel
    try:
        canonical = canonical_host(host)
    except PolicyError:
        return channel
    return Channel.AGENT if any(p.matches(canonical, port) for p in policy.agent) else channel


def decide_name(policy: NetworkPolicy, request: Request) -> Decision:
    """Decide on the name alone, by the first of ``NAME_RULES`` that decides; report mode
    is applied once, to that decision. An ALLOW here still needs ``decide_addresses``."""
    try:
        host = canonical_host(request.host)
    except PolicyError:
        return _deny(policy, Reason.INVALID_HOST, DecisionLayer.PROTOCOL, request.host)
    for rule in NAME_RULES:
        decision = rule(policy, request.channel, host, request.port)
        if decision is not None:
            return _reported(policy, decision)
    raise AssertionError("the last name rule always decides")


# A DNS rule decides whether the stub answers a (canonical) name, or passes
# (None) to the next; DNS_RULES is their order. A name is answered when some
# port of it could be allowed, so these match the host alone.
#
# Every flow reaches these rules whether or not the program honours the proxy
# variables: on backends with transparent capture the DNS stub answers only the
# names ``decide_dns`` allows (with synthetic addresses the proxy maps back to
# the name), and a redirected connection is decided by name like a CONNECT.
DnsRule = Callable[["NetworkPolicy", str], "Decision | None"]


def _dns_ip_literal(policy: NetworkPolicy, host: str) -> Decision | None:
    if parse_ip_literal(host) is not None:
        return _refuse(Reason.DNS_NOT_ALLOWED, DecisionLayer.DEFAULT, host)
    return None


def _dns_docs_host(policy: NetworkPolicy, host: str) -> Decision | None:
    # A docs host keeps its attribution, as decide_name would give it.
    if not any(p.matches_host(host) for p in policy.docs):
        return None
    if any(p.matches_host(host) for p in policy.shell_docs) and \
            any(p.matches_host(host) for p in policy.allow):
        return _allow(Reason.ALLOWED_DOCS_HOST_ON_SHELL, DecisionLayer.ATTRIBUTION, host)
    if policy.serve_docs:
        return _allow(Reason.ALLOWED_AS_PAGE_READ, DecisionLayer.ATTRIBUTION, host)
    return _refuse(Reason.DOCS_HOST_ON_SHELL, DecisionLayer.ATTRIBUTION, host)


def _dns_named(policy: NetworkPolicy, host: str) -> Decision | None:
    # The deny list is the connection's to apply (decide_name): a name denied
    # on one port may be allowed on another.
    shell = (*policy.allow, *policy.tcp, *(o.pattern for o in policy.overrides), *policy.agent)
    if any(p.matches_host(host) for p in shell):
        return _allow(Reason.ALLOWED_BY_LIST, DecisionLayer.ALLOWLIST, host)
    return None


def _dns_nothing_names(policy: NetworkPolicy, host: str) -> Decision:
    return _refuse(Reason.DNS_NOT_ALLOWED, DecisionLayer.DEFAULT, host)


DNS_RULES: tuple[DnsRule, ...] = (_dns_ip_literal, _dns_docs_host, _dns_named, _dns_nothing_names)


def decide_dns(policy: NetworkPolicy, name: str) -> Decision:
    """Whether the shell's DNS stub answers ``name``, by the first of ``DNS_RULES`` that
    decides; report mode is applied once, to that decision, and so answers all.

    The stub never forwards a query, so answering leaks nothing; refusing is
    what keeps a name nothing may reach from even looking reachable.
    """
    try:
        host = canonical_host(name)
    except PolicyError:
        return _deny(policy, Reason.DNS_NOT_ALLOWED, DecisionLayer.PROTOCOL, name)
    for rule in DNS_RULES:
        decision = rule(policy, host)
        if decision is not None:
            return _reported(policy, decision)
    raise AssertionError("the last DNS rule always decides")


def decide_stream(policy: NetworkPolicy, host: str, port: int, *, connect: bool) -> Decision:
    """Whether a stream that is neither TLS nor HTTP may go to ``host:port`` (canonical).

    A ``tcp`` rule for that exact name and port lets one through. So does,
    for a CONNECT (``connect``: the client itself asked the proxy for a
    tunnel to that port, as proxy-aware clients always could), an allow or
    override entry that names that port. An entry without a port names a
    web host (ports 80 and 443), and a web host's port is no licence to
    speak ssh or a database protocol to it; nor is any entry for a stream
    that was redirected rather than asked for.
    """
    if any(p.matches(host, port) for p in policy.tcp):
        return Decision(verdict=Verdict.ALLOW, reason=Reason.ALLOWED_BY_TCP_RULE,
                        layer=DecisionLayer.ALLOWLIST, host=host)
    named = (*policy.allow, *(o.pattern for o in policy.overrides))
    if connect and any(p.port == port and p.matches(host, port) for p in named):
        return Decision(verdict=Verdict.ALLOW, reason=Reason.ALLOWED_BY_LIST,
                        layer=DecisionLayer.ALLOWLIST, host=host)
    return _deny(policy, Reason.TCP_NOT_ALLOWED, DecisionLayer.ALLOWLIST, host)


# An address rule decides a (canonical) host and port for a channel from
# every address the name resolved to, or passes (None) to the next;
# ADDRESS_RULES is their order: the floor's refusals, then the ground an
# allowed connection is recorded with. The ground is not decide_name's: an
# override outranks the docs channel here, because it is what let the
# addresses through the floor.
AddressRule = Callable[
    ["NetworkPolicy", "Channel", str, int, "Sequence[IPAddress]"], "Decision | None"
]


def _resolved_nothing(policy: NetworkPolicy, channel: Channel, host: str, port: int,
                      addresses: Sequence[IPAddress]) -> Decision | None:
    if addresses:
        return None
    return _refuse(Reason.RESOLVE_FAILED, DecisionLayer.FLOOR, host)


def _below_floor(policy: NetworkPolicy, channel: Channel, host: str, port: int,
                 addresses: Sequence[IPAddress]) -> Decision | None:
    # Any bad address refuses the lot (rather than dialling a good one): a name
    # that answers with both a public and a private address is a rebinding
    # attempt. The first bad one, in the order resolved, names the reason.
    override = _override_for(policy, host, port)
    for addr in addresses:
        reason = _address_refusal(policy, port, override, addr)
        if reason is not None:
            return _refuse(reason, DecisionLayer.FLOOR, host)
    return None


def _address_refusal(policy: NetworkPolicy, port: int, override: Override | None,
                     addr: IPAddress) -> Reason | None:
    if any(parse_ip_literal(h) == addr and p == port for h, p in policy.proxy_addresses):
        return Reason.PROXY_ITSELF
    cls = address_class(addr)
    if cls is AddressClass.PUBLIC:
        return None
    if override is not None and any(addr in net for net in override.networks):
        return None
    return _FLOOR_REASON[cls]


def _override_ground(policy: NetworkPolicy, channel: Channel, host: str, port: int,
                     addresses: Sequence[IPAddress]) -> Decision | None:
    return _override_rule(policy, channel, host, port)


def _docs_channel_ground(policy: NetworkPolicy, channel: Channel, host: str, port: int,
                         addresses: Sequence[IPAddress]) -> Decision | None:
    if channel is not Channel.DOCS:
        return None
    return _allow(Reason.ALLOWED_DOCS_CHANNEL, DecisionLayer.ATTRIBUTION, host)


def _agent_channel_ground(policy: NetworkPolicy, channel: Channel, host: str, port: int,
                          addresses: Sequence[IPAddress]) -> Decision | None:
    if channel is not Channel.AGENT:
        return None
    return _allow(Reason.ALLOWED_AGENT_CHANNEL, DecisionLayer.ATTRIBUTION, host)


def _docs_host_on_shell_ground(policy: NetworkPolicy, channel: Channel, host: str, port: int,
                               addresses: Sequence[IPAddress]) -> Decision | None:
    if not (any(p.matches(host, port) for p in policy.docs) and _opened_to_shell(policy, host, port)):
        return None
    return _allow(Reason.ALLOWED_DOCS_HOST_ON_SHELL, DecisionLayer.ATTRIBUTION, host)


def _list_ground(policy: NetworkPolicy, channel: Channel, host: str, port: int,
                 addresses: Sequence[IPAddress]) -> Decision:
    return _allow(Reason.ALLOWED_BY_LIST, DecisionLayer.ALLOWLIST, host)


ADDRESS_RULES: tuple[AddressRule, ...] = (
    _resolved_nothing, _below_floor, _override_ground, _docs_channel_ground,
    _agent_channel_ground, _docs_host_on_shell_ground, _list_ground,
)


def decide_addresses(
    policy: NetworkPolicy, request: Request, addresses: Sequence[IPAddress]
) -> Decision:
    """Decide on every address a name resolved to, by the first of ``ADDRESS_RULES`` that
    decides; report mode is applied once, to that decision (and never lifts the floor)."""
    host = canonical_host(request.host)
    for rule in ADDRESS_RULES:
        decision = rule(policy, request.channel, host, request.port, addresses)
        if decision is not None:
            return _reported(policy, decision)
    raise AssertionError("the last address rule always decides")


def _opened_to_shell(policy: NetworkPolicy, host: str, port: int) -> bool:
    return any(p.matches(host, port) for p in policy.shell_docs) and any(
        p.matches(host, port) for p in policy.allow
    )
