"""Method, path and body rules, as properties over any inspection policy and request."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstrun.errors import PolicyError
from firstrun.policy.decision import DecisionLayer, Reason, Verdict
from firstrun.policy.methods import (
    READ_ONLY,
    WRITE_METHODS,
    InnerRequest,
    InspectionPolicy,
    credentials_for,
    decide_inner,
    inspects,
)
from firstrun.policy.network import NetworkPolicy

_label = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
_domain = st.lists(_label, min_size=2, max_size=3).map(".".join)
_path = st.from_regex(r"/[a-z0-9/._-]{0,20}", fullmatch=True)
_method = st.sampled_from(sorted(READ_ONLY | WRITE_METHODS))
_write = st.sampled_from(sorted(WRITE_METHODS))
_rule = st.tuples(_domain, st.lists(_write, min_size=1, max_size=3), _path)


def _request(host: str, method: str, path: str, body: int = 0) -> InnerRequest:
    return InnerRequest(host=host, port=443, method=method, path=path, body_bytes=body)


@given(rules=st.lists(_rule, max_size=4), host=_domain, method=_write, path=_path)
def test_a_write_passes_only_where_a_rule_names_host_method_and_path(
    rules: list[tuple[str, list[str], str]], host: str, method: str, path: str
) -> None:
    policy = InspectionPolicy.build(rules=rules)
    decision = decide_inner(policy, _request(host, method, path))
    covered = any(h == host and method in ms and path.startswith(p) for h, ms, p in rules)
    assert decision.allowed == covered
    assert decision.layer is DecisionLayer.METHODS
    assert decision.reason is (Reason.ALLOWED_BY_METHOD_RULE if covered
                               else Reason.METHOD_NOT_ALLOWED)


@given(rules=st.lists(_rule, max_size=4), host=_domain,
       method=st.sampled_from(sorted(READ_ONLY)), path=_path)
def test_reads_always_pass_under_the_cap(
    rules: list[tuple[str, list[str], str]], host: str, method: str, path: str
) -> None:
    decision = decide_inner(InspectionPolicy.build(rules=rules), _request(host, method, path))
    assert (decision.verdict, decision.reason) == (Verdict.ALLOW, Reason.ALLOWED_READ_ONLY)


@given(rules=st.lists(_rule, max_size=4), host=_domain, method=_method, path=_path,
       cap=st.integers(min_value=0, max_value=1 << 20), over=st.integers(min_value=1, max_value=1 << 20))
def test_a_body_over_the_cap_is_refused_whatever_the_rules(
    rules: list[tuple[str, list[str], str]], host: str, method: str, path: str, cap: int, over: int
) -> None:
    policy = InspectionPolicy.build(rules=rules, max_body_bytes=cap)
    decision = decide_inner(policy, _request(host, method, path, cap + over))
    assert (decision.verdict, decision.reason) == (Verdict.DENY, Reason.BODY_TOO_LARGE)


@given(rules=st.lists(_rule, max_size=4), extra=_rule, host=_domain, method=_method, path=_path)
def test_adding_a_rule_never_refuses_what_was_allowed(
    rules: list[tuple[str, list[str], str]], extra: tuple[str, list[str], str], host: str,
    method: str, path: str,
) -> None:
    before = decide_inner(InspectionPolicy.build(rules=rules), _request(host, method, path))
    after = decide_inner(InspectionPolicy.build(rules=[*rules, extra]), _request(host, method, path))
    assert not before.allowed or after.allowed


@given(name=st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True), owner=_domain, host=_domain)
def test_a_credential_belongs_to_its_host_only(name: str, owner: str, host: str) -> None:
    policy = InspectionPolicy.build(credentials=[(name, owner, "REAL_" + name)])
    assert credentials_for(policy, host, 443) == ((name,) if host == owner else ())


@pytest.mark.parametrize("rules, credentials, match", [
    ([("pypi.org", ["CONNECT"], "/")], [], "CONNECT"),
    ([("pypi.org", [], "/")], [], "none given"),
    ([("pypi.org", ["POST"], "upload")], [], "must start with /"),
    ([], [("NPM-TOKEN", "registry.npmjs.org", "X")], "NPM-TOKEN"),
    ([], [("A", "x.example", "B"), ("A", "y.example", "C")], "declared twice"),
    ([], [("HTTPS_PROXY", "x.example", "B")], "shadow"),
])
def test_bad_rules_are_refused_naming_the_entry(rules, credentials, match) -> None:
    with pytest.raises(PolicyError, match=match):
        InspectionPolicy.build(rules=rules, credentials=credentials, source="task.yaml")


def test_inspection_changes_the_policy_data_and_its_absence_does_not() -> None:
    plain = NetworkPolicy.build()
    assert "inspection" not in plain.to_data()
    inspected = plain.with_inspection(InspectionPolicy())
    assert inspected.to_data()["inspection"] == {
        "rules": [], "credentials": [], "max_body_bytes": 1 << 20}


_SCOPED = InspectionPolicy.build(scope=["api.anthropic.com", "api.vendor.test:8443"])


@pytest.mark.parametrize(("policy", "host", "port", "inspected"), [
    # --inspect-tls: every host.
    (InspectionPolicy(), "pypi.org", 443, True),
    (InspectionPolicy(), "api.anthropic.com", 443, True),
    # An agent's API host alone: its own name and port, nothing beside it.
    (_SCOPED, "api.anthropic.com", 443, True),
    (_SCOPED, "api.anthropic.com", 80, True),
    (_SCOPED, "api.anthropic.com", 8443, False),
    (_SCOPED, "pypi.org", 443, False),
    (_SCOPED, "evil.api.anthropic.com", 443, False),
    (_SCOPED, "api.anthropic.com.evil", 443, False),
    (_SCOPED, "api.vendor.test", 8443, True),
    (_SCOPED, "api.vendor.test", 443, False),
    # A scope of nothing inspects nothing.
    (InspectionPolicy.build(scope=[]), "api.anthropic.com", 443, False),
])
def test_which_hosts_are_inspected(policy: InspectionPolicy, host: str, port: int,
                                   inspected: bool) -> None:
    assert inspects(policy, host, port) is inspected


def test_a_scope_is_data_and_appears_only_when_set() -> None:
    assert "scope" not in InspectionPolicy().to_data()
    assert _SCOPED.to_data()["scope"] == ["api.anthropic.com", "api.vendor.test:8443"]
    with pytest.raises(PolicyError, match="scope"):
        InspectionPolicy.build(scope=["bad host!"])
