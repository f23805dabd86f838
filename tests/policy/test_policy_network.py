"""The floor and the decision order, as properties over any policy."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstrun.errors import PolicyError
from firstrun.policy.addresses import AddressClass, address_class
from firstrun.policy.decision import DecisionLayer, Reason, Verdict
from firstrun.policy.hosts import parse_patterns
from firstrun.policy.network import (
    Channel,
    Mode,
    NetworkPolicy,
    Request,
    channel_for,
    decide_addresses,
    decide_dns,
    decide_name,
    destination_label,
)

FLOOR_NETS = [
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "100.64.0.0/10", "224.0.0.0/4", "0.0.0.0/8", "::1/128", "fc00::/7", "fe80::/10",
    "::ffff:0:0/96", "64:ff9b::/96",
]

_label = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
_domain = st.lists(_label, min_size=2, max_size=3).map(".".join)


@st.composite
def _floor_address(draw: st.DrawFn) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    net = ipaddress.ip_network(draw(st.sampled_from(FLOOR_NETS)))
    offset = draw(st.integers(min_value=0, max_value=net.num_addresses - 1))
    return net.network_address + offset


@given(
    host=_domain,
    allow=st.lists(_domain, max_size=4),
    addr=_floor_address(),
    public=st.lists(st.sampled_from(["151.101.0.223", "93.184.216.34", "2a04:4e42::223"]), max_size=2),
    override_net=st.one_of(st.none(), st.sampled_from(FLOOR_NETS)),
    channel=st.sampled_from(list(Channel)),
)
def test_no_allow_rule_overrides_the_floor(host, allow, addr, public, override_net, channel) -> None:  # type: ignore[no-untyped-def]
    overrides = [(host, [override_net])] if override_net else []
    policy = NetworkPolicy.build(allow=[host, *allow], docs=[host], overrides=overrides)
    request = Request(channel=channel, host=host, port=443)
    addresses = [ipaddress.ip_address(p) for p in public] + [addr]
    decision = decide_addresses(policy, request, addresses)
    covered = override_net is not None and addr in ipaddress.ip_network(override_net)
    assert decision.allowed is covered
    if not covered:
        assert decision.layer is DecisionLayer.FLOOR


@given(addr=_floor_address())
def test_floor_addresses_are_never_public(addr) -> None:  # type: ignore[no-untyped-def]
    assert address_class(addr) is not AddressClass.PUBLIC


@pytest.mark.parametrize("addr", ["203.0.113.80", "192.0.2.1", "198.51.100.7", "151.101.0.223"])
def test_documentation_ranges_are_not_floored(addr: str) -> None:
    # The registries on this machine answer from TEST-NET-3.
    assert address_class(ipaddress.ip_address(addr)) is AddressClass.PUBLIC


def test_proxy_addresses_refused_even_with_an_override() -> None:
    policy = NetworkPolicy.build(overrides=[("self.test:3128", ["127.0.0.0/8"])]).with_proxy_addresses(
        [("127.0.0.1", 3128)]
    )
    request = Request(channel=Channel.SHELL, host="self.test", port=3128)
    decision = decide_addresses(policy, request, [ipaddress.ip_address("127.0.0.1")])
    assert decision.reason is Reason.PROXY_ITSELF


def test_deny_list_beats_allow_list_and_docs_beat_both() -> None:
    policy = NetworkPolicy.build(allow=["*.example.org"], deny=["bad.example.org"], docs=["docs.example.org"])
    shell = lambda h: decide_name(policy, Request(channel=Channel.SHELL, host=h, port=443))  # noqa: E731
    assert shell("good.example.org").reason is Reason.ALLOWED_BY_LIST
    assert shell("bad.example.org").reason is Reason.DENIED_BY_LIST
    assert shell("docs.example.org").reason is Reason.DOCS_HOST_ON_SHELL


@given(host=_domain, mode=st.sampled_from(list(Mode)))
def test_report_mode_never_denies_and_enforce_mode_never_carries_would_deny(host: str, mode: Mode) -> None:
    policy = NetworkPolicy.build(mode=mode)
    decision = decide_name(policy, Request(channel=Channel.SHELL, host=host, port=443))
    if mode is Mode.REPORT:
        assert decision.verdict is Verdict.ALLOW
        assert decision.would_deny is Reason.NOT_ALLOWED
    else:
        assert decision.verdict is Verdict.DENY and decision.would_deny is None


def test_override_with_bad_network_is_refused() -> None:
    with pytest.raises(PolicyError):
        NetworkPolicy.build(overrides=[("pypi.test", ["not-a-network"])])


def test_a_docs_host_opened_to_the_shell_is_allowed_only_with_its_own_reason() -> None:
    from firstrun.policy.network import decide_addresses

    opened = NetworkPolicy.build(allow=["docs.example.org"], docs=["docs.example.org"],
                                 shell_docs=["docs.example.org"])
    closed = NetworkPolicy.build(allow=["docs.example.org"], docs=["docs.example.org"])
    denied = NetworkPolicy.build(allow=["docs.example.org"], docs=["docs.example.org"],
                                 shell_docs=["docs.example.org"], deny=["docs.example.org"])
    request = Request(channel=Channel.SHELL, host="docs.example.org", port=443)
    public = [ipaddress.ip_address("203.0.113.7")]
    assert decide_name(opened, request).reason is Reason.ALLOWED_DOCS_HOST_ON_SHELL
    assert decide_addresses(opened, request, public).reason is Reason.ALLOWED_DOCS_HOST_ON_SHELL
    assert decide_name(closed, request).reason is Reason.DOCS_HOST_ON_SHELL
    assert decide_name(denied, request).reason is Reason.DOCS_HOST_ON_SHELL
    # Opening a docs host to the shell never lifts the floor.
    loopback = [ipaddress.ip_address("127.0.0.1")]
    assert decide_addresses(opened, request, loopback).reason is Reason.RESOLVED_LOOPBACK
    # Named for the shell but absent from the allow-list: still refused.
    stray = NetworkPolicy.build(allow=[], docs=["docs.example.org"], shell_docs=["docs.example.org"])
    assert decide_name(stray, request).reason is Reason.DOCS_HOST_ON_SHELL


def test_destination_labels_name_the_host_or_say_why_there_is_none() -> None:
    assert destination_label("pypi.org", 443) == "pypi.org:443"
    assert destination_label("::1", 8080) == "[::1]:8080"
    assert destination_label("example.com", None) == "example.com"
    assert destination_label(None, None, "smuggling_suspected") == "(no valid host)"
    assert destination_label(None, None, Reason.RECORD_BUDGET_EXHAUSTED) == \
        "(requests past the proxy's record budget)"
    assert destination_label("", None, "record_budget_exhausted") == \
        "(requests past the proxy's record budget)"


_AGENT = replace(NetworkPolicy.build(deny=["api.anthropic.com"]),
                 agent=parse_patterns(["api.anthropic.com"], source="test"))


@pytest.mark.parametrize(("channel", "host", "port", "on"), [
    (Channel.SHELL, "api.anthropic.com", 443, Channel.AGENT),
    (Channel.SHELL, "API.Anthropic.com.", 443, Channel.AGENT),
    (Channel.SHELL, "api.anthropic.com", 8443, Channel.SHELL),
    (Channel.SHELL, "pypi.org", 443, Channel.SHELL),
    (Channel.SHELL, "evil.api.anthropic.com", 443, Channel.SHELL),
    # The harness's docs reader stays on its own channel, whatever it asks for.
    (Channel.DOCS, "api.anthropic.com", 443, Channel.DOCS),
])
def test_an_agent_host_is_on_the_agent_channel(channel: Channel, host: str, port: int,
                                               on: Channel) -> None:
    assert channel_for(_AGENT, channel, host, port) is on


def test_the_agent_channel_reaches_its_hosts_alone_whatever_the_lists_say() -> None:
    # The task's deny list names the API host: the harness granted it to the agent.
    allowed = decide_name(_AGENT, Request(channel=Channel.AGENT, host="api.anthropic.com",
                                          port=443))
    assert (allowed.verdict, allowed.reason) == (Verdict.ALLOW, Reason.ALLOWED_AGENT_CHANNEL)
    other = decide_name(_AGENT, Request(channel=Channel.AGENT, host="pypi.org", port=443))
    assert other.verdict is Verdict.DENY
    # The floor holds on the agent channel as everywhere.
    floored = decide_addresses(_AGENT, Request(channel=Channel.AGENT, host="api.anthropic.com",
                                               port=443), [ipaddress.ip_address("10.0.0.1")])
    assert (floored.verdict, floored.reason) == (Verdict.DENY, Reason.RESOLVED_PRIVATE)
    public = decide_addresses(_AGENT, Request(channel=Channel.AGENT, host="api.anthropic.com",
                                              port=443), [ipaddress.ip_address("8.8.8.8")])
    assert (public.verdict, public.reason) == (Verdict.ALLOW, Reason.ALLOWED_AGENT_CHANNEL)
    assert _AGENT.to_data()["agent"] == ["api.anthropic.com"]
    assert "agent" not in NetworkPolicy.build().to_data()


_SERVED = replace(NetworkPolicy.build(docs=["docs.test"], shell_docs=[]), serve_docs=True)


@pytest.mark.parametrize(("policy", "channel", "host", "reason"), [
    # Without serve_docs a docs host stays refused on the shell channel.
    (NetworkPolicy.build(docs=["docs.test"]), Channel.SHELL, "docs.test",
     Reason.DOCS_HOST_ON_SHELL),
    (_SERVED, Channel.SHELL, "docs.test", Reason.ALLOWED_AS_PAGE_READ),
    # The reader's own channel is unchanged; other hosts too.
    (_SERVED, Channel.DOCS, "docs.test", Reason.ALLOWED_DOCS_CHANNEL),
    (_SERVED, Channel.SHELL, "other.test", Reason.NOT_ALLOWED),
    # A docs host the task opened to the shell keeps its direct, counted route.
    (replace(NetworkPolicy.build(allow=["docs.test"], docs=["docs.test"],
                                 shell_docs=["docs.test"]), serve_docs=True),
     Channel.SHELL, "docs.test", Reason.ALLOWED_DOCS_HOST_ON_SHELL),
])
def test_a_served_docs_host_is_a_page_read(policy: NetworkPolicy, channel: Channel, host: str,
                                           reason: Reason) -> None:
    assert decide_name(policy, Request(channel=channel, host=host, port=443)).reason is reason


def test_the_dns_stub_answers_a_served_docs_host() -> None:
    assert decide_dns(_SERVED, "docs.test").reason is Reason.ALLOWED_AS_PAGE_READ
    assert decide_dns(NetworkPolicy.build(docs=["docs.test"]), "docs.test").reason is \
        Reason.DOCS_HOST_ON_SHELL
    assert _SERVED.to_data()["serve_docs"] is True
    assert "serve_docs" not in NetworkPolicy.build().to_data()
