"""How ``firstrun show`` tells a permission decision: refusals stand out with their rule
and where it is written; allowed calls are quiet but present."""

from __future__ import annotations

import pytest

from firstrun.policy.permissions import PermissionMode, PermissionReason, PermissionVerdict
from firstrun.reports.narrate import Style, narrate
from firstrun.run.events import PermissionDecided

pytestmark = pytest.mark.fast


def told(event: PermissionDecided) -> tuple[str, Style]:
    (line, _trace_cut_short) = narrate([{"seq": 1, "mono": 0.0, **event.to_data()}])
    return line.text.strip().removeprefix("0.00s").strip(), line.style


def decided(verdict: PermissionVerdict, reason: PermissionReason, **fields: str | None) -> PermissionDecided:
    return PermissionDecided(tool="bash", argument="npm publish", verdict=verdict,
                             reason=reason, mode=PermissionMode.UNATTENDED, **fields)


def test_a_deny_names_the_rule_and_where_it_is_written() -> None:
    assert told(decided(PermissionVerdict.DENY, PermissionReason.DENY_RULE, source="task",
                        rule="bash(npm publish*)", origin="t.yaml:9")) == (
        "permission REFUSED: bash 'npm publish': task deny rule bash(npm publish*) (t.yaml:9); "
        "it did not run", Style.BAD)


def test_an_unattended_ask_says_nobody_was_there() -> None:
    assert told(decided(PermissionVerdict.DENY, PermissionReason.ASK_RULE, source="project",
                        rule="bash(npm*)", origin="firstrun.yaml:3")) == (
        "permission REFUSED: bash 'npm publish': project ask rule bash(npm*) (firstrun.yaml:3), "
        "and nobody is there to ask (unattended); it did not run", Style.BAD)


def test_a_call_off_the_allow_list_names_the_list() -> None:
    text, style = told(decided(PermissionVerdict.DENY, PermissionReason.NOT_ALLOWED, source="task"))
    assert text.startswith("permission REFUSED: bash 'npm publish': not on the task allow list")
    assert style is Style.BAD


def test_allowed_calls_are_told_quietly() -> None:
    assert told(decided(PermissionVerdict.ALLOW, PermissionReason.NO_RULE)) == (
        "permission: bash 'npm publish' allowed, no rule covers it", Style.DIM)
    assert told(decided(PermissionVerdict.ALLOW, PermissionReason.ALLOW_RULE, source="task", rule="bash",
                        origin="t.yaml:4")) == (
        "permission: bash 'npm publish' allowed, task allow rule bash (t.yaml:4)", Style.DIM)
