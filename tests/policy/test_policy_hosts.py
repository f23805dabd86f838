"""Host patterns and canonical hosts: what an allow-list entry can and cannot mean."""

from __future__ import annotations

import ipaddress

import httpx
import publicsuffixlist
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from firstrun.errors import PolicyError
from firstrun.policy.hosts import (
    HostPattern,
    canonical_host,
    is_public_suffix,
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


# Public suffixes the old hand list of thirty missed: ICANN ones (co.kr,
# com.sg) and the private section's (a hosting platform's tenants).
_PUBLIC = ["co.kr", "com.sg", "web.app", "fly.dev", "onrender.com", "githubusercontent.com"]


@pytest.mark.parametrize("suffix", _PUBLIC + ["github.io", "foo.ck", "XN--55QX5D.CN.", "公司.香港"])
def test_a_wildcard_over_any_public_suffix_is_refused(suffix: str) -> None:
    with pytest.raises(PolicyError) as caught:
        HostPattern.parse(f"*.{suffix}")
    assert str(caught.value) == (
        f"policy: pattern '*.{suffix}' covers a whole public suffix; name the registrable domain"
    )
    # The suffix itself names one host, and the list allows it as such.
    assert not HostPattern.parse(suffix).wildcard


@pytest.mark.parametrize(
    "entry",
    ["*.pythonhosted.org", "*.example.com", "*.example.co.kr", "*.myapp.web.app",
     "*.files.pythonhosted.org", "*.www.ck", "*.corp.internal"],
)
def test_a_wildcard_over_a_registrable_domain_is_kept(entry: str) -> None:
    assert HostPattern.parse(entry).wildcard


def test_the_old_hand_list_is_still_refused() -> None:
    # The thirty suffixes hosts.py listed by hand before it read the Public Suffix List.
    old = ("co.uk org.uk ac.uk gov.uk com.au net.au org.au co.jp ne.jp or.jp com.br com.cn "
           "com.tw co.in co.nz co.za com.mx github.io gitlab.io herokuapp.com netlify.app "
           "vercel.app pages.dev workers.dev readthedocs.io appspot.com azurewebsites.net "
           "cloudfront.net s3.amazonaws.com blogspot.com").split()
    assert [suffix for suffix in old if not is_public_suffix(suffix)] == []


def _plain_rules() -> list[str]:
    with open(publicsuffixlist.PSLFILE, encoding="utf-8") as f:
        rules = [line.split()[0] for line in f if line.strip() and not line.startswith("//")]
    # ``*.ck`` and ``!www.ck`` are rules about the labels under a suffix, met above.
    return [rule for rule in rules if rule[0] not in "*!"]


def test_every_suffix_on_the_bundled_list_is_public_as_firstrun_spells_it() -> None:
    # The list's Unicode rules are looked up in firstrun's UTS-46 form: a rule
    # the two spell differently would be a wildcard let through.
    rules = _plain_rules()
    assert len(rules) > 9000
    missed = [rule for rule in rules if not is_public_suffix(canonical_host(rule))]
    assert missed == []


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
        # UTS-46, non-transitional: the deviation characters are kept, not mapped away.
        ("faß.de", "xn--fa-hia.de"),
        ("xn--fa-hia.de", "xn--fa-hia.de"),
        ("XN--FA-HIA.de.", "xn--fa-hia.de"),
        ("βόλος.com", "xn--nxasmm1c.com"),
        # Width and the ideographic full stop are mapped, as browsers map them.
        ("ｅｘａｍｐｌｅ。com", "example.com"),
        # An ASCII name is dialled as written, an underscore label included.
        ("_acme.example.org", "_acme.example.org"),
    ],
)
def test_canonical_host(raw: str, canonical: str) -> None:
    assert canonical_host(raw) == canonical


@pytest.mark.parametrize("raw", ["", "pypi..org", "-a.org", "a b.org", "a/b", "pypi.org:443", "."])
def test_not_hosts(raw: str) -> None:
    with pytest.raises(PolicyError):
        canonical_host(raw)


def test_fass_de_is_checked_as_the_name_httpx_dials() -> None:
    # IDNA 2003 (Python's ``idna`` codec) said ``fass.de``: another domain, another owner.
    assert canonical_host("faß.de") == httpx.URL("https://faß.de/").raw_host.decode() == "xn--fa-hia.de"
    assert HostPattern.parse("faß.de").matches("xn--fa-hia.de", 443)
    assert not HostPattern.parse("faß.de").matches("fass.de", 443)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        # Not the Punycode of anything, and a non-canonical spelling of ``xn--bbk``.
        ("xn--zz.com", "invalid_alabel"),
        ("xn---bbk.com", "non_canonical_alabel"),
        # CONTEXTJ: a zero-width joiner only after a virama.
        ("a\u200db.com", "contextj"),
        # An ``_`` label is kept in an ASCII name, as httpx keeps it, but IDNA
        # has no ``_``, and httpx too refuses it in a Unicode name.
        ("a_b.faß.de", "disallowed_codepoint"),
    ],
)
def test_bad_internationalised_names_say_why_in_one_line(raw: str, code: str) -> None:
    with pytest.raises(PolicyError) as caught:
        canonical_host(raw)
    message = str(caught.value)
    assert message.startswith(f"policy: not a valid internationalised host name: {raw!r} (")
    assert "\n" not in message
    # idna's error codes are stable where its wording is not.
    assert getattr(caught.value.__cause__, "code", None) == code


_uchar = st.one_of(
    st.characters(categories=("Ll", "Lu", "Lo", "Lm", "Mn", "Mc", "Nd")),
    # Where IDNA 2003, transitional UTS-46 and case mapping part ways, and the
    # context rules (ZWNJ, ZWJ, middle dot, keraia, geresh, katakana middle dot).
    st.sampled_from("ßςσΣİıẞ\u200c\u200d\u00b7\u0375\u05f3\u30fb-_aZ09ＡｚＯ０"),
)
_uname = st.tuples(
    st.lists(st.text(_uchar, min_size=1, max_size=10), min_size=1, max_size=3),
    st.sampled_from(["com", "de", "рф", "中国", "XN--P1AI"]),
).map(lambda parts: ".".join([*parts[0], parts[1]]))


@settings(max_examples=300)
@given(name=_uname)
def test_the_name_checked_is_the_name_httpx_dials(name: str) -> None:
    try:
        checked = canonical_host(name)
        dialled = httpx.URL(f"https://{name}/").raw_host.decode("ascii")
    except (PolicyError, httpx.InvalidURL):
        assume(False)
        return
    assert checked == dialled
    # The proxy sees the dialled name: it canonicalises to itself.
    assert canonical_host(dialled) == checked


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
