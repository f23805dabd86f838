"""``validate`` reports a check as firstrun init drafted it, until someone edits it."""

from __future__ import annotations

from pathlib import Path

from firstrun.tasks.lint import Code, drafted_digest, lint_task
from firstrun.tasks.load import load_tasks

TASK = """name: t
goal: g
docs: {{entrypoint: 'https://d.test/'}}
replay: docs
success:
  script: |
    # drafted by firstrun init ({digest}): read it
    test -e app.py || qs_fail 'no app.py'
"""


def load(tmp_path: Path, digest: str, script_tail: str = "") -> list:
    path = tmp_path / "t.yaml"
    path.write_text(TASK.format(digest=digest) + script_tail)
    return load_tasks([str(path)])


def test_a_check_as_drafted_is_reported_at_its_line_and_an_edited_one_is_not(tmp_path: Path) -> None:
    [task] = load(tmp_path, "0" * 16)
    digest = drafted_digest(task.spec.success)
    [drafted] = load(tmp_path, digest)
    [finding] = [f for f in lint_task(drafted) if f.code is Code.CHECK_DRAFTED]
    assert (finding.file, finding.line) == (str(tmp_path / "t.yaml"), 7)
    [edited] = load(tmp_path, digest, "    test -s app.py || qs_fail 'app.py is empty'\n")
    assert not [f for f in lint_task(edited) if f.code is Code.CHECK_DRAFTED]
