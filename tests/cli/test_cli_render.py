"""The end-of-run summary counts every blocked attempt, grouped by destination."""

from __future__ import annotations

from firstrun.cli.render import group_blocked, summary_lines
from firstrun.policy.decision import DecisionLayer, Reason, Verdict
from firstrun.policy.network import Channel
from firstrun.proxy.records import EgressRecord, Scheme
from firstrun.sandbox.base import Check, Enforcement, SessionInfo


def record(host: str | None, port: int | None, decision: Verdict, reason: Reason,
           would_deny: Reason | None = None) -> EgressRecord:
    return EgressRecord(
        ts="2026-01-01T00:00:00Z", id="r", channel=Channel.SHELL, method="GET",
        scheme=Scheme.HTTP, host=host, port=port, path="/", decision=decision, reason=reason,
        layer=DecisionLayer.DEFAULT, would_deny=would_deny, override=None, resolved=None, status=403,
        bytes_up=0, bytes_down=0, duration_ms=1.0,
    )


def test_groups_denied_by_destination_and_counts_every_attempt() -> None:
    records = [
        record("pypi.org", 443, Verdict.ALLOW, Reason.ALLOWED_BY_LIST),
        record("example.com", 80, Verdict.DENY, Reason.NOT_ALLOWED),
        record("example.com", 80, Verdict.DENY, Reason.NOT_ALLOWED),
        record("example.com", 80, Verdict.DENY, Reason.PORT_NOT_ALLOWED),
        record("10.0.0.1", 443, Verdict.DENY, Reason.IP_LITERAL),
        record("::1", 443, Verdict.DENY, Reason.IP_LITERAL),
        record(None, None, Verdict.DENY, Reason.SMUGGLING_SUSPECTED),
    ]
    blocked = group_blocked(records)
    assert [g.destination for g in blocked] == [
        "example.com:80", "(no valid host)", "10.0.0.1:443", "[::1]:443",
    ]
    assert blocked[0].reasons == (("not_allowed", 2), ("port_not_allowed", 1))
    assert sum(g.attempts for g in blocked) == 6


def test_report_mode_counts_would_deny_and_ignores_plain_allows() -> None:
    records = [
        record("pypi.org", 443, Verdict.ALLOW, Reason.ALLOWED_BY_LIST),
        record("example.com", 443, Verdict.ALLOW, Reason.NOT_ALLOWED, would_deny=Reason.NOT_ALLOWED),
    ]
    (group,) = group_blocked(records)
    assert group.destination == "example.com:443"
    assert group.reasons == (("not_allowed", 1),)


def test_summary_states_backend_enforcement_attestation_and_hash() -> None:
    info = SessionInfo(
        backend="linux", enforcement=Enforcement.ENFORCED, policy_hash="sha256:abc",
        attestation=(Check(name="direct_dial_fails", passed=True, detail=""),
                     Check(name="proxy_answers", passed=True, detail="")),
    )
    records = [
        record("attest.firstrun.invalid", 80, Verdict.ALLOW, Reason.ATTESTATION),
        record("pypi.org", 443, Verdict.ALLOW, Reason.ALLOWED_BY_LIST),
        record("example.com", 80, Verdict.DENY, Reason.NOT_ALLOWED),
    ]
    text = "\n".join(summary_lines(info, records, report_only=False))
    assert "backend linux" in text
    assert "enforcement enforced" in text
    assert "attestation 2/2 passed" in text
    assert "sha256:abc" in text
    assert "egress: 1 allowed, 1 blocked" in text
    assert "example.com:80" in text and "not_allowed x1" in text
    assert "egress: 0 allowed, 0 blocked" in "\n".join(summary_lines(info, (), report_only=False))
