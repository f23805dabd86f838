"""What the CLI tells a person after a sandboxed command: pure text over recorded data.

Guarantee: the summary is computed only from the session's ``SessionInfo``
and the proxy's records, never from the live run, so what a person reads at
the end is exactly what was recorded. Every blocked attempt is counted: it is
grouped by destination and reason, never sampled or elided.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from firstrun.policy.decision import Reason, Verdict
from firstrun.policy.network import destination_label
from firstrun.proxy.records import EgressRecord
from firstrun.sandbox.base import SessionInfo


@dataclass(frozen=True, kw_only=True)
class BlockedHost:
    """Every blocked (or, in report mode, would-be-blocked) attempt to one destination."""

    destination: str
    reasons: tuple[tuple[str, int], ...]

    @property
    def attempts(self) -> int:
        return sum(n for _, n in self.reasons)


def group_blocked(records: Iterable[EgressRecord]) -> tuple[BlockedHost, ...]:
    """Denied records, and report-mode records that would have been denied, by destination.

    Ordered by attempts (most first), then by name, so the worst offender leads.
    """
    by_dest: dict[str, Counter[str]] = {}
    for record in records:
        if record.decision is Verdict.DENY:
            reason = record.reason.value
        elif record.would_deny is not None:
            reason = record.would_deny.value
        else:
            continue
        dest = destination_label(record.host, record.port, record.reason)
        by_dest.setdefault(dest, Counter())[reason] += 1
    groups = [
        BlockedHost(
            destination=dest,
            reasons=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        )
        for dest, counts in by_dest.items()
    ]
    return tuple(sorted(groups, key=lambda g: (-g.attempts, g.destination)))


def summary_lines(
    info: SessionInfo, records: Sequence[EgressRecord], *, report_only: bool
) -> list[str]:
    """The end-of-run summary, one fact per line, for stderr."""
    blocked = group_blocked(records)
    passed = sum(1 for c in info.attestation if c.passed)
    lines = [
        f"firstrun: backend {info.backend}, enforcement {info.enforcement.value}, "
        f"attestation {passed}/{len(info.attestation)} passed, policy {info.policy_hash}",
    ]
    if info.downgrades:
        lines.append(f"firstrun: downgraded layers: {', '.join(info.downgrades)}")
    total = sum(g.attempts for g in blocked)
    # The attestation probe is the harness's own request, not the command's.
    allowed = sum(1 for r in records if r.reason is not Reason.ATTESTATION) - total
    verb = "would have been blocked (report mode)" if report_only else "blocked"
    lines.append(f"firstrun: egress: {allowed} allowed, {total} {verb}")
    if not blocked:
        return lines
    lines.append(
        f"firstrun: egress {verb}: {total} attempt{'s' if total != 1 else ''} "
        f"to {len(blocked)} destination{'s' if len(blocked) != 1 else ''}"
    )
    width = max(len(g.destination) for g in blocked)
    for group in blocked:
        reasons = ", ".join(f"{reason} x{n}" for reason, n in group.reasons)
        lines.append(f"  {group.destination.ljust(width)}  {reasons}")
    return lines
