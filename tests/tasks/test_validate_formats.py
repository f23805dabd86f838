"""``firstrun validate --format``: the same findings as JSON, or as GitHub annotations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from firstrun.tasks.lint import Code, Finding, Severity

FIRSTRUN = Path(sys.executable).parent / "firstrun"


@pytest.mark.parametrize(("finding", "line"), [
    (Finding(severity=Severity.ERROR, code=Code.INVALID_TASK, message="bad: x", file="t.yaml", line=3),
     "::error file=t.yaml,line=3,title=invalid_task::bad: x"),
    (Finding(severity=Severity.WARNING, code=Code.INVALID_TASK, message="50%\nnext", file="a,b:c.yaml",
             line=None),
     "::warning file=a%2Cb%3Ac.yaml,title=invalid_task::50%25%0Anext"),
    (Finding(severity=Severity.NOTE, code=Code.INVALID_TASK, message="says", file="n.yaml", line=1),
     "::notice file=n.yaml,line=1,title=invalid_task::says"),
])
def test_an_annotation_is_one_workflow_command_escaped_as_github_reads_it(finding: Finding,
                                                                          line: str) -> None:
    assert finding.github_annotation() == line


def test_json_and_github_say_what_text_says(tmp_path: Path) -> None:
    task = tmp_path / "broken.yaml"
    task.write_text("name: broken\ngoal: g\nsuccess:\n  script: true\n  nonsense: 1\n")

    def validate(*fmt: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FIRSTRUN), "validate", str(task), *fmt], capture_output=True,
                              text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)

    text, as_json, github = validate(), validate("--format", "json"), validate("--format", "github")
    assert text.returncode == as_json.returncode == github.returncode == 1
    findings = json.loads(as_json.stdout)
    assert len(findings) == len(text.stdout.splitlines()) >= 1
    first = findings[0]
    assert (first["severity"], first["file"]) == ("error", str(task)) and first["line"] >= 1
    assert github.stdout.splitlines()[0].startswith(f"::error file={task},line={first['line']},")
