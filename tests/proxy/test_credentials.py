"""Credential substitution as properties: only the named host, only headers, never a value leaked."""

from __future__ import annotations

import base64

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from firstrun.errors import PolicyError, UsageError
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.process import RESERVED_VARIABLES, build_environment
from firstrun.proxy.credentials import mint, sandbox_variables, substitute

_value = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30)
_header_name = st.sampled_from([b"authorization", b"x-api-key", b"cookie", b"user-agent"])
_label = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
_domain = st.lists(_label, min_size=2, max_size=3).map(".".join)

pytestmark = pytest.mark.fast


def _one(value: str, host: str = "registry.example.com"):
    policy = InspectionPolicy.build(credentials=[("NPM_TOKEN", host, "REAL")])
    (cred,) = mint(policy.credentials, {"REAL": value})
    return cred


@given(value=_value, host=_domain, prefix=_value, name=_header_name)
def test_another_host_receives_the_placeholder_verbatim(value: str, host: str, prefix: str,
                                                        name: bytes) -> None:
    assume(host != "registry.example.com")
    cred = _one(value)
    headers = [(name, f"{prefix} {cred.placeholder}".encode())]
    assert substitute(headers, [cred], host=host, port=443) == (headers, ())


@given(value=_value, prefix=_value, name=_header_name)
def test_the_named_host_receives_the_value_and_no_placeholder(value: str, prefix: str,
                                                              name: bytes) -> None:
    cred = _one(value)
    headers = [(name, f"{prefix} {cred.placeholder}".encode()), (b"accept", b"*/*")]
    out, used = substitute(headers, [cred], host="registry.example.com", port=443)
    assert used == ("NPM_TOKEN",)
    assert out == [(name, f"{prefix} {value}".encode()), (b"accept", b"*/*")]


@given(value=_value, user=_label)
def test_basic_credentials_are_swapped_inside_their_encoding(value: str, user: str) -> None:
    cred = _one(value)
    basic = base64.b64encode(f"{user}:{cred.placeholder}".encode())
    out, used = substitute([(b"authorization", b"Basic " + basic)], [cred],
                           host="registry.example.com", port=443)
    assert used == ("NPM_TOKEN",)
    assert out == [(b"authorization", b"Basic " + base64.b64encode(f"{user}:{value}".encode()))]


def test_a_header_without_the_placeholder_is_left_alone() -> None:
    cred = _one("v")
    headers = [(b"authorization", b"Basic not-base64!"), (b"x", b"y")]
    assert substitute(headers, [cred], host="registry.example.com", port=443) == (headers, ())


def test_placeholders_are_fresh_per_run_and_only_they_reach_the_environment() -> None:
    a, b = _one("secret-value"), _one("secret-value")
    assert a.placeholder != b.placeholder
    env = build_environment({"REAL": "secret-value"}, path=["/usr/bin"], home="/home/sandbox",
                            tmpdir="/tmp", proxy_url=None, inspected=True,
                            placeholders=sandbox_variables([a]))
    assert env["NPM_TOKEN"] == a.placeholder
    assert "secret-value" not in "".join(f"{k}={v}" for k, v in env.items())


def test_a_value_that_could_forge_a_header_is_refused() -> None:
    with pytest.raises(UsageError, match="control character"):
        _one("token\r\nX-Evil: 1")


def test_every_name_the_environment_builds_is_reserved() -> None:
    host = {name: "/x" for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "TERM")}
    for inspected in (False, True):
        env = build_environment(host, path=["/usr/bin"], home="/h", tmpdir="/t",
                                proxy_url="http://127.0.0.1:3128", inspected=inspected)
        assert set(env) <= RESERVED_VARIABLES
    with pytest.raises(PolicyError, match="shadow"):
        build_environment({}, path=[], home="/h", tmpdir="/t", proxy_url=None,
                          placeholders={"HOME": "x"})
