"""Host patterns and canonical hosts: what an allow-list entry can and cannot mean."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from firstrun.errors import PolicyError
from firstrun.policy.hosts import (
    HostPattern,
    canonical_host,
    parse_ip_literal,
    parse_patterns,
)


@pytest.mark.parametrize(
    "entry",
    ["*", "*.com", "*.org", "*.co.uk", "*.github.io", "*.*.example.org", "a.*.example.org",
     "pypi*.org", "*.127.0.0.1", "", "pypi.org:0", "pypi.org:+443", "pypi.org:65536",
     # One spelling per port, as the proxy reads a CONNECT authority: no leading zero.
     "pypi.org:0443", "pypi.org:٤٤٣",
     "[::1", "[::1]x", "exa mple.org"],
)
def test_broad_or_malformed_patterns_are_refused_at_load(entry: str) -> None:
    with pytest.raises(PolicyError):
        parse_patterns([entry], source="test")


def test_refusal_names_its_source() -> None:
    with pytest.raises(PolicyError) as info:
        parse_patterns(["pypi.org", "*.co.uk"], source="task.yaml allow")
    assert "task.yaml allow" in str(info.value)


@pytest.mark.parametrize(
    ("entry", "host", "wildcard", "port"),
    [
        ("pypi.org", "pypi.org", False, None),
        ("PyPI.org.", "pypi.org", False, None),
        ("*.pythonhosted.org", "pythonhosted.org", True, None),
        ("registry.npmjs.org:8443", "registry.npmjs.org", False, 8443),
        ("[::1]:8080", "::1", False, 8080),
        ("bücher.example", "xn--bcher-kva.example", False, None),
    ],
)
def test_patterns_parse_to_canonical_form(entry: str, host: str, wildcard: bool, port: int | None) -> None:
    pattern = HostPattern.parse(entry)
    assert (pattern.host, pattern.wildcard, pattern.port) == (host, wildcard, port)


@pytest.mark.parametrize(
    ("pattern", "host", "port", "matches"),
    [
        ("pypi.org", "pypi.org", 443, True),
        ("pypi.org", "pypi.org", 80, True),
        ("pypi.org", "pypi.org", 8080, False),
        ("pypi.org", "evilpypi.org", 443, False),
        ("pypi.org", "pypi.org.evil.com", 443, False),
        ("pypi.org", "sub.pypi.org", 443, False),
        ("*.pythonhosted.org", "files.pythonhosted.org", 443, True),
        ("*.pythonhosted.org", "pythonhosted.org", 443, False),
        ("*.pythonhosted.org", "evilpythonhosted.org", 443, False),
        ("*.pythonhosted.org", "files.pythonhosted.org.evil.com", 443, False),
        ("pypi.org:8443", "pypi.org", 8443, True),
        ("pypi.org:8443", "pypi.org", 443, False),
    ],
)
def test_matching_is_on_label_boundaries(pattern: str, host: str, port: int, matches: bool) -> None:
    assert HostPattern.parse(pattern).matches(host, port) is matches


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("PyPI.Org", "pypi.org"),
        ("pypi.org.", "pypi.org"),
        ("user:pw@pypi.org", "pypi.org"),
        ("pypi.org@evil.com", "evil.com"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "127.0.0.1"),
        ("[::1]", "::1"),
        ("BÜCHER.example", "xn--bcher-kva.example"),
    ],
)
def test_canonical_host(raw: str, canonical: str) -> None:
    assert canonical_host(raw) == canonical


@pytest.mark.parametrize("raw", ["", "pypi..org", "-a.org", "a b.org", "a/b", "pypi.org:443", "."])
def test_not_hosts(raw: str) -> None:
    with pytest.raises(PolicyError):
        canonical_host(raw)


@pytest.mark.parametrize("raw", ["256.0.0.1", "1.2.3.4.5", "0x1g", "pypi.org", "09.0.0.1"])
def test_not_ip_literals(raw: str) -> None:
    assert parse_ip_literal(raw) is None


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_domain = st.lists(_label, min_size=2, max_size=4).map(".".join).filter(
    lambda d: parse_ip_literal(d) is None
)


@given(domain=_domain, suffix=st.lists(_label, min_size=1, max_size=3).map(".".join), port=st.sampled_from([80, 443]))
def test_a_com_never_matches_a_com_dot_anything(domain: str, suffix: str, port: int) -> None:
    host = f"{domain}.{suffix}"
    assert not HostPattern.parse(domain).matches(host, port)
    # ``*.a.a`` rightly matches ``www.a.a.a``: only a host that does not end in the suffix counts.
    assume(not host.endswith("." + domain))
    assert not HostPattern.parse(f"*.{domain}").matches(f"www.{host}", port)


@given(domain=_domain, prefix=_label, port=st.sampled_from([80, 443]))
def test_x_a_com_never_matches_a_com(domain: str, prefix: str, port: int) -> None:
    host = prefix + domain
    assert not HostPattern.parse(domain).matches(host, port)
    assert not HostPattern.parse(f"*.{domain}").matches(host, port)


@given(domain=_domain)
def test_canonical_host_is_idempotent_and_case_blind(domain: str) -> None:
    assert canonical_host(domain.upper() + ".") == canonical_host(domain) == domain


@given(number=st.integers(min_value=0, max_value=2**32 - 1))
def test_every_ipv4_spelling_meets_the_same_address(number: int) -> None:
    addr = ipaddress.IPv4Address(number)
    spellings = [str(number), hex(number), "0" + oct(number)[2:] if number else "0",
                 f"[::ffff:{addr}]", str(addr)]
    assert {canonical_host(s) for s in spellings} == {str(addr)}
