"""The ClientHello parser: exact on real shapes, total on anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proxy_fixtures import client_hello

from firstrun.policy.decision import Reason
from firstrun.proxy.flight import judge_first_flight
from firstrun.proxy.tls import HelloStatus, parse_client_hello

pytestmark = pytest.mark.fast


def test_reads_sni() -> None:
    hello = parse_client_hello(client_hello("pypi.org"))
    assert hello.status is HelloStatus.CLIENT_HELLO
    assert hello.sni == "pypi.org"


def test_hello_without_sni() -> None:
    hello = parse_client_hello(client_hello(None))
    assert (hello.status, hello.sni) == (HelloStatus.CLIENT_HELLO, None)


def test_reassembles_a_hello_split_across_records() -> None:
    assert parse_client_hello(client_hello("files.pythonhosted.org", record_size=7)).sni == (
        "files.pythonhosted.org"
    )


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.2\r\n",
        b"\x16\x02\x00",  # record type handshake, but not TLS 1.x
        b"\x80\x2e\x01\x03\x01",  # SSLv2-compatible hello: no SNI possible
    ],
)
def test_non_tls_first_flight(data: bytes) -> None:
    assert parse_client_hello(data).status is HelloStatus.NOT_TLS


@pytest.mark.parametrize(
    "data",
    [
        client_hello("a.example", duplicate_sni_extension=True),
        client_hello(None, names=[b"a.example", b"b.example"]),
        client_hello(None, names=[b""]),
        client_hello(None, names=["bücher.example".encode()]),
    ],
)
def test_ambiguous_hellos_are_malformed(data: bytes) -> None:
    assert parse_client_hello(data).status is HelloStatus.MALFORMED


def test_zero_length_record_is_malformed() -> None:
    assert parse_client_hello(b"\x16\x03\x01\x00\x00").status is HelloStatus.MALFORMED


def test_handshake_that_is_not_a_client_hello_is_malformed() -> None:
    data = client_hello("a.example")
    mutated = data[:5] + b"\x02" + data[6:]  # ServerHello from a client
    assert parse_client_hello(mutated).status is HelloStatus.MALFORMED


def test_every_strict_prefix_is_incomplete() -> None:
    data = client_hello("pypi.org", record_size=50)
    for cut in range(1, len(data)):
        assert parse_client_hello(data[:cut]).status is HelloStatus.INCOMPLETE, cut


@pytest.mark.parametrize(
    ("sni", "host", "reason"),
    [
        ("pypi.org", "pypi.org", None),
        ("PyPI.org.", "pypi.org", None),
        ("evil.com", "pypi.org", Reason.SNI_MISMATCH),
        ("pypi.org.evil.com", "pypi.org", Reason.SNI_MISMATCH),
        ("pypi.org:443", "pypi.org", Reason.SNI_MISMATCH),
        ("127.0.0.1", "pypi.org", Reason.SNI_MISMATCH),
    ],
)
def test_judge_first_flight(sni: str, host: str, reason: Reason | None) -> None:
    refusal = judge_first_flight(parse_client_hello(client_hello(sni)), host)
    assert (refusal.reason if refusal else None) is reason


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
_names = st.lists(_label, min_size=1, max_size=5).map(".".join)


@given(name=_names, record_size=st.integers(min_value=1, max_value=1 << 14))
def test_round_trips_any_name_and_record_split(name: str, record_size: int) -> None:
    hello = parse_client_hello(client_hello(name, record_size=record_size))
    assert (hello.status, hello.sni) == (HelloStatus.CLIENT_HELLO, name)


@settings(max_examples=500)
@given(data=st.binary(max_size=600))
def test_total_on_arbitrary_bytes(data: bytes) -> None:
    assert parse_client_hello(data).status in HelloStatus


@settings(max_examples=500)
@given(
    name=_names,
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
)
def test_total_on_mutated_hellos(name: str, flips: list[tuple[int, int]]) -> None:
    data = bytearray(client_hello(name))
    for position, value in flips:
        data[position % len(data)] = value
    hello = parse_client_hello(bytes(data))
    # Whatever the mutation, a name is only ever one the bytes really carry.
    if hello.sni is not None:
        assert hello.sni.encode() in bytes(data)
