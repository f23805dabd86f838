"""Permission rules in a task file: where they sit, how a bad one is located, and the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.errors import TaskError
from firstrun.policy.permissions import PermissionMode, PermissionReason, PermissionVerdict, decide
from firstrun.tasks.lint import Code, Severity, lint_task
from firstrun.tasks.load import read_task
from firstrun.tasks.schema import task_json_schema

HEAD = """\
name: perm
goal: Print a greeting.
docs:
  entrypoint: http://docs.example.test/
success:
  script: test -f done
"""


def task_file(tmp_path: Path, block: str) -> Path:
    path = tmp_path / "perm.yaml"
    path.write_text(HEAD + block, encoding="utf-8")
    return path


def test_rules_load_with_the_file_and_line_each_is_written_on(tmp_path: Path) -> None:
    path = task_file(tmp_path, """\
firstrun:
  permissions:
    allow:
      - read_docs(https://docs.example.test/*)
    deny:
      - bash(git push*)
      - bash(npm   publish*)
    ask:
      - bash(rm -rf*)
""")
    rules = read_task(path).permissions
    assert rules.source == "task"
    assert [(r.verdict, r.text, r.origin) for r in rules.rules] == [
        (PermissionVerdict.DENY, "bash(git push*)", f"{path}:12"),
        (PermissionVerdict.DENY, "bash(npm publish*)", f"{path}:13"),
        (PermissionVerdict.ASK, "bash(rm -rf*)", f"{path}:15"),
        (PermissionVerdict.ALLOW, "read_docs(https://docs.example.test/*)", f"{path}:10"),
    ]
    decision = decide([rules], tool="bash", argument="npm publish --access public",
                      mode=PermissionMode.UNATTENDED)
    assert decision.rule is not None and decision.rule.origin == f"{path}:13"


def test_a_task_without_rules_has_an_empty_set(tmp_path: Path) -> None:
    rules = read_task(task_file(tmp_path, "")).permissions
    assert rules.rules == ()
    assert decide([rules], tool="bash", argument="curl x", mode=PermissionMode.UNATTENDED).reason \
        is PermissionReason.NO_RULE


@pytest.mark.parametrize(("block", "line", "words"), [
    ("firstrun:\n  permissions:\n    deny:\n      - bash(git push*)\n      - Bash(curl*)\n",
     11, "firstrun.permissions.deny[1]: deny rule 'Bash(curl*)' names unknown tool 'Bash'"),
    ("firstrun:\n  permissions:\n    ask:\n      - bash()\n",
     10, "ask rule 'bash()' has an empty pattern"),
    ("firstrun:\n  permissions:\n    allow:\n      - bash(ls\n",
     10, "allow rule 'bash(ls' is not TOOL or TOOL(PATTERN)"),
    ("firstrun:\n  permissions:\n    deny: bash(curl*)\n", 9, "firstrun.permissions.deny"),
    ("firstrun:\n  permissions:\n    refuse:\n      - bash\n", 9, "unknown key 'refuse'"),
])
def test_a_bad_rule_is_one_line_naming_file_line_and_the_rule(tmp_path: Path, block: str,
                                                             line: int, words: str) -> None:
    path = task_file(tmp_path, block)
    with pytest.raises(TaskError) as caught:
        read_task(path)
    assert (caught.value.path, caught.value.line) == (str(path), line)
    assert words in caught.value.detail
    assert "\n" not in str(caught.value)


def test_the_schema_describes_the_rules() -> None:
    schema = task_json_schema()
    extensions = schema["$defs"]["Extensions"]["properties"]
    assert extensions["permissions"]["$ref"] == "#/$defs/Permissions"
    permissions = schema["$defs"]["Permissions"]
    assert permissions["additionalProperties"] is False
    assert set(permissions["properties"]) == {"allow", "deny", "ask"}
    for verdict in ("allow", "deny", "ask"):
        items = permissions["properties"][verdict]["items"]
        assert items["type"] == "string" and "bash|read_docs" in items["pattern"]


def test_lint_warns_of_replay_steps_and_route_pages_the_rules_refuse(tmp_path: Path) -> None:
    path = task_file(tmp_path, """\
replay:
  - echo hi > done
  - curl -s http://example.test/ > out
firstrun:
  permissions:
    deny:
      - bash(curl*)
    allow:
      - read_docs(https://docs.example.test/*)
""")
    findings = [f for f in lint_task(read_task(path)) if f.code is Code.REPLAY_REFUSED]
    assert [(f.severity, f.line) for f in findings] == [(Severity.WARNING, 4),
                                                        (Severity.WARNING, 9)]
    page, step = findings
    assert "route page http://docs.example.test/" in page.message
    assert "not on the task permission rules' allow list" in page.message
    assert "replay step 2" in step.message and "deny rule bash(curl*)" in step.message


def test_lint_is_silent_when_the_rules_allow_the_whole_replay(tmp_path: Path) -> None:
    path = task_file(tmp_path, """\
replay:
  - echo hi > done
firstrun:
  permissions:
    deny:
      - bash(curl*)
""")
    assert not [f for f in lint_task(read_task(path)) if f.code is Code.REPLAY_REFUSED]
