"""Transparent capture's protocol logic as tables: DNS answers, first flights, and their judges.

Each row is bytes in and a decision out, with no socket: what the DNS stub's
proxy answers for a query, what a tunnel's first bytes are, and whether they
may go where the name rules let them.
"""

from __future__ import annotations

import ipaddress

import dns.message
import dns.rcode
import dns.rdatatype
import pytest
from proxy_fixtures import client_hello

from firstrun.policy.decision import Reason
from firstrun.policy.network import Mode, NetworkPolicy, decide_dns, decide_stream
from firstrun.proxy.dns import SYNTHETIC_NETWORK, SyntheticNames, answer
from firstrun.proxy.errors import Refused
from firstrun.proxy.flight import FlightKind, judge_flight, read_flight

pytestmark = pytest.mark.fast

POLICY = NetworkPolicy.build(docs=["docs.example.org"], tcp=["github.com:22"],
                             overrides=[("db.test:5432", ["10.0.0.0/8"])])


def _query(name: str, qtype: str = "A") -> bytes:
    return dns.message.make_query(name, qtype).to_wire()


def _answered(wire: bytes | None) -> tuple[str, list[str]]:
    assert wire is not None
    reply = dns.message.from_wire(wire)
    return dns.rcode.to_text(reply.rcode()), [str(r) for rrset in reply.answer for r in rrset]


@pytest.mark.parametrize(("name", "reason"), [
    ("pypi.org", None),
    ("files.pythonhosted.org", None),
    ("PyPI.org.", None),
    ("github.com", None),                      # a tcp rule makes the name answerable
    ("db.test", None),                         # so does an override
    ("example.com", Reason.DNS_NOT_ALLOWED),
    ("docs.example.org", Reason.DOCS_HOST_ON_SHELL),
    ("203.0.113.80", Reason.DNS_NOT_ALLOWED),
    ("a" * 64 + ".com", Reason.DNS_NOT_ALLOWED),
])
def test_decide_dns(name: str, reason: Reason | None) -> None:
    decision = decide_dns(POLICY, name)
    assert decision.allowed is (reason is None)
    if reason is not None:
        assert decision.reason is reason


def test_report_mode_answers_every_name_and_says_what_it_would_refuse() -> None:
    decision = decide_dns(NetworkPolicy.build(mode=Mode.REPORT), "example.com")
    assert decision.allowed and decision.would_deny is Reason.DNS_NOT_ALLOWED


def test_an_allowed_name_gets_one_synthetic_address_for_the_session() -> None:
    names = SyntheticNames()
    first = answer(_query("pypi.org"), policy=POLICY, names=names)
    again = answer(_query("PYPI.ORG."), policy=POLICY, names=names)
    other = answer(_query("files.pythonhosted.org"), policy=POLICY, names=names)
    (rcode, [address]), (_, [same]), (_, [different]) = map(
        _answered, (first.wire, again.wire, other.wire))
    assert rcode == "NOERROR" and address == same != different
    assert ipaddress.ip_address(address) in SYNTHETIC_NETWORK
    assert names.name_for(ipaddress.ip_address(address)) == "pypi.org"
    assert first.refusal is None


@pytest.mark.parametrize("qtype", ["AAAA", "MX", "TXT", "HTTPS"])
def test_other_record_types_of_an_allowed_name_are_empty_answers(qtype: str) -> None:
    result = answer(_query("pypi.org", qtype), policy=POLICY, names=SyntheticNames())
    assert _answered(result.wire) == ("NOERROR", []) and result.refusal is None


def test_a_refused_name_is_nxdomain_and_a_refusal_to_record() -> None:
    names = SyntheticNames()
    result = answer(_query("exfil-6a6f686e.example.com"), policy=POLICY, names=names)
    assert _answered(result.wire) == ("NXDOMAIN", [])
    assert result.refusal is not None and result.refusal.reason is Reason.DNS_NOT_ALLOWED
    assert (result.name, result.qtype) == ("exfil-6a6f686e.example.com", "A")
    # Nothing was allocated for it: no address will ever stand for it.
    assert names.address_for("next.test") == next(SYNTHETIC_NETWORK.hosts())


def test_the_sandboxs_own_names_answer_without_a_record() -> None:
    names = SyntheticNames()
    attest = answer(_query("attest.firstrun.invalid"), policy=POLICY, names=names)
    other = answer(_query("refused.firstrun.invalid"), policy=POLICY, names=names)
    assert _answered(attest.wire)[0] == "NOERROR" and attest.refusal is None
    assert _answered(other.wire) == ("NXDOMAIN", []) and other.refusal is None


@pytest.mark.parametrize(("wire", "expect"), [
    (b"", None),
    (b"\x12\x34", None),
    (b"\x12\x34" + b"\x01\x00" + b"\xff" * 20, "FORMERR"),
])
def test_malformed_queries_get_formerr_or_nothing(wire: bytes, expect: str | None) -> None:
    result = answer(wire, policy=POLICY, names=SyntheticNames())
    if expect is None:
        assert result.wire is None
    else:
        assert result.wire is not None and result.wire[:2] == b"\x12\x34"
        assert dns.rcode.from_flags(result.wire[2] << 8 | result.wire[3], 0) == dns.rcode.FORMERR


HELLO = client_hello("pypi.org")


@pytest.mark.parametrize(("data", "eof", "kind"), [
    (b"", False, None),
    (b"", True, FlightKind.EMPTY),
    (HELLO[:10], False, None),
    (HELLO, False, FlightKind.TLS),
    (b"GE", False, None),
    (b"GET / HTTP/1.1\r\nHost: pypi.org\r\n", False, None),
    (b"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", False, FlightKind.HTTP),
    (b"SSH-2.0-OpenSSH_9.2\r\n", False, FlightKind.RAW),
    (b"\x00\x00\x00\x08\x04\xd2\x16\x2f", False, FlightKind.RAW),
    (b"GET /not-http\r\n\r\n", False, FlightKind.RAW),
])
def test_read_flight(data: bytes, eof: bool, kind: FlightKind | None) -> None:
    flight = read_flight(data, eof=eof)
    assert (flight.kind if flight is not None else None) is kind


@pytest.mark.parametrize(("data", "host", "port", "outcome"), [
    (HELLO, "pypi.org", 443, None),
    (client_hello("evil.test"), "pypi.org", 443, Reason.SNI_MISMATCH),
    (b"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", 80, None),
    (b"GET / HTTP/1.1\r\nHost: PyPI.org:80\r\n\r\n", "pypi.org", 80, None),
    (b"GET / HTTP/1.0\r\n\r\n", "pypi.org", 80, None),
    (b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "pypi.org", 80, Reason.HOST_MISMATCH),
    (b"GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.test\r\n\r\n", "pypi.org", 80,
     Reason.SMUGGLING_SUSPECTED),
    # A target's own authority is what a server routes on (RFC 9112 3.2.2), Host or no Host.
    (b"GET http://PyPI.org:80/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", 80, None),
    (b"GET http://evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", 80, Reason.HOST_MISMATCH),
    (b"GET http://evil.test/ HTTP/1.0\r\n\r\n", "pypi.org", 80, Reason.HOST_MISMATCH),
    (b"GET http://evil.test\\@pypi.org/ HTTP/1.1\r\n\r\n", "pypi.org", 80, Reason.HOST_MISMATCH),
    (b"CONNECT evil.test:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", 80, Reason.HOST_MISMATCH),
    (b"SSH-2.0-OpenSSH_9.2\r\n", "pypi.org", 443, Reason.TCP_NOT_ALLOWED),
    (b"SSH-2.0-OpenSSH_9.2\r\n", "github.com", 22, Reason.ALLOWED_BY_TCP_RULE),
    (b"SSH-2.0-OpenSSH_9.2\r\n", "github.com", 2222, Reason.TCP_NOT_ALLOWED),
])
def test_judge_flight(data: bytes, host: str, port: int, outcome: Reason | None) -> None:
    flight = read_flight(data, eof=True)
    assert flight is not None
    verdict = judge_flight(flight, host=host, port=port, policy=POLICY, connect=False)
    if outcome is None:
        assert verdict is None
    elif isinstance(verdict, Refused):
        assert verdict.reason is outcome
    else:
        assert verdict is not None and verdict.allowed and verdict.reason is outcome


@pytest.mark.parametrize(("connect", "outcome"), [(True, None), (False, Reason.TCP_NOT_ALLOWED)])
def test_an_entry_naming_the_port_licenses_raw_bytes_only_in_a_connect(
        connect: bool, outcome: Reason | None) -> None:
    # As it always did for proxy-aware clients; a redirected stream needs a tcp rule.
    flight = read_flight(b"\x00\x00\x00\x08\x04\xd2\x16\x2f", eof=True)
    verdict = judge_flight(flight, host="db.test", port=5432, policy=POLICY, connect=connect)
    assert (verdict.reason if isinstance(verdict, Refused) else verdict) == outcome


def test_a_raw_stream_in_report_mode_goes_and_says_what_it_would_refuse() -> None:
    policy = NetworkPolicy.build(mode=Mode.REPORT)
    verdict = judge_flight(read_flight(b"SSH-2.0-x\r\n", eof=True), host="pypi.org", port=443,
                           policy=policy, connect=False)
    assert not isinstance(verdict, Refused)
    assert verdict is not None and verdict.would_deny is Reason.TCP_NOT_ALLOWED
    assert decide_stream(policy, "pypi.org", 443, connect=False).allowed


@pytest.mark.parametrize("entry", ["github.com", "*.github.com:22"])
def test_a_tcp_rule_is_one_name_and_one_port(entry: str) -> None:
    from firstrun.errors import PolicyError

    with pytest.raises(PolicyError, match="tcp"):
        NetworkPolicy.build(tcp=[entry])


def test_tcp_rules_enter_the_hash_only_when_there_are_some() -> None:
    assert "tcp" not in NetworkPolicy.build().to_data()
    assert NetworkPolicy.build(tcp=["github.com:22"]).to_data()["tcp"] == ["github.com:22"]
