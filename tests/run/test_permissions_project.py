"""Permission rules in ``firstrun.yaml``: loaded with file:line, part of the sweep's identity,
and combined with each task's rules so that a deny from either holds. The last test is
a whole ``firstrun run`` on the linux backend, judged by the kept workspace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from firstrun.errors import TaskError
from firstrun.policy.permissions import PermissionMode, PermissionVerdict, decide
from firstrun.run.project import CONFIG_FILE, load_project_config
from firstrun.tasks.load import load_task

FIRSTRUN = Path(sys.executable).parent / "firstrun"
CLI_FIXTURES = Path(__file__).resolve().parents[1] / "cli" / "run_fixtures"
PASS = CLI_FIXTURES / "tasks" / "greet-pass.yaml"


def write(directory: Path, text: str, name: str = CONFIG_FILE) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_project_rules_load_with_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "workers: 1\npermissions:\n  deny:\n    - bash(git push*)\n"
                           "  allow:\n    - bash\n")
    rules = load_project_config(path).permissions
    assert rules.source == "project"
    assert [(r.verdict, r.text, r.origin) for r in rules.rules] == [
        (PermissionVerdict.DENY, "bash(git push*)", f"{path}:4"),
        (PermissionVerdict.ALLOW, "bash", f"{path}:6"),
    ]


def test_a_bad_project_rule_is_one_line_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "permissions:\n  ask:\n    - bash(npm publish*)\n    - npm(publish)\n")
    with pytest.raises(TaskError) as caught:
        load_project_config(path)
    assert (caught.value.path, caught.value.line) == (str(path), 4)
    assert "ask rule 'npm(publish)' names unknown tool 'npm'" in caught.value.detail


def test_rules_are_part_of_the_sweeps_identity(tmp_path: Path) -> None:
    plain = load_project_config(write(tmp_path, "workers: 1\n", name="a.yaml"))
    empty = load_project_config(write(tmp_path, "workers: 1\npermissions: {}\n", name="b.yaml"))
    ruled = load_project_config(write(tmp_path, "workers: 1\npermissions:\n  deny: [bash(curl*)]\n",
                                      name="c.yaml"))
    other = load_project_config(write(tmp_path, "workers: 1\npermissions:\n  deny: [bash(wget*)]\n",
                                      name="d.yaml"))
    assert plain.task_defaults_sha256() == empty.task_defaults_sha256()
    assert len({plain.task_defaults_sha256(), ruled.task_defaults_sha256(),
                other.task_defaults_sha256()}) == 3


def test_a_project_deny_holds_whatever_the_task_allows(tmp_path: Path) -> None:
    project = load_project_config(write(tmp_path, "permissions:\n  deny: [bash(touch*)]\n"))
    task_file = tmp_path / "t.yaml"
    task_file.write_text(PASS.read_text() + "firstrun:\n  permissions:\n    allow: [bash]\n")
    task = load_task(task_file)
    decision = decide([project.permissions, task.permissions], tool="bash",
                      argument="touch x", mode=PermissionMode.UNATTENDED)
    assert (decision.verdict, decision.source) == (PermissionVerdict.DENY, "project")


def test_a_run_applies_the_project_rules(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    write(project, f"""backend: linux
docs_mirrors:
  greeter.docs.example: {CLI_FIXTURES / 'docs'}
permissions:
  deny:
    - bash(printf*)
""")
    done = subprocess.run([str(FIRSTRUN), "run", str(PASS), "--out", "out", "--keep-sandbox"],
                          cwd=project, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=300)
    # A skipped run is not a failure of the docs; the sweep's exit says so.
    (run,) = json.loads((project / "out" / "results.json").read_text())["runs"]
    assert (run["classification"], run["reason"]) == ("skipped", "permission_denied"), (
        done.stdout + done.stderr)
    workspace = project / "out" / "runs" / "greet-pass" / "1" / "workspace"
    assert workspace.is_dir() and not (workspace / "greeting.txt").exists()
    (refusal,) = run["extra"]["permissions"]["refusals"]
    assert refusal == {"tool": "bash", "argument": "printf 'hello\\n' > greeting.txt",
                       "reason": "deny_rule", "rule": "bash(printf*)",
                       "origin": f"{CONFIG_FILE}:6"}  # named as it was found
