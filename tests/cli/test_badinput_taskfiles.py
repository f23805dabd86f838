"""Hostile task files and project configs end in one ``file:line`` error and exit 3.

Each case once ended in a traceback, a hang, or a check read from outside
the task's directory. The task is named to ``firstrun run``, which loads
every task before any sandbox starts, so nothing here runs a command.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.badinput import HEAD, SCRIPT, Run, one_error


def _laughs() -> str:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n" + HEAD + SCRIPT


def _deep() -> str:
    text = "x:\n"
    for i in range(1, 200):
        text += "  " * i + "k:\n"
    return text


# (name, file text, line the error names, text the error holds)
CASES = [
    ("alias-cycle", "a: &a [*a]\n" + HEAD + SCRIPT, 1, "cycle"),
    ("billion-laughs", _laughs(), 5, "expands to more than"),
    ("deep-flow", "a: " + "[" * 5000 + "]" * 5000 + "\n", 1, "nested more than"),
    ("deep-block", _deep(), 65, "nested more than"),
    ("control-char", HEAD + 'success:\n  script: "\x01"\n', 8, "U+0001"),
    ("nul-escape", HEAD + 'success:\n  file: "a\\0b"\n', 8, "NUL"),
    ("int-key", HEAD + "1: x\n" + SCRIPT, 7, "key '1' is not a name"),
    ("null-key", HEAD + "~: x\n" + SCRIPT, 7, "key '~' is not a name"),
    ("file-escapes", HEAD + "success:\n  file: ../outside.sh\n", 8, "the task's project"),
    ("file-symlink-out", HEAD + "success:\n  file: checks/link.sh\n", 8, "the task's project"),
    ("file-fifo", HEAD + "success:\n  file: checks/fifo\n", 8, "not a regular file"),
    ("file-dir", HEAD + "success:\n  file: checks\n", 8, "is a directory"),
    ("file-huge", HEAD + "success:\n  file: checks/huge.sh\n", 8, "larger than 1 MiB"),
    # Past a week a supervisor's wait overflows; the check would fail as a sandbox error.
    ("command-seconds", HEAD + "budgets:\n  max_command_seconds: 99999999\n" + SCRIPT, 8,
     "must be at most 604800"),
]


def _setup(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks"
    checks = tasks / "checks"
    checks.mkdir(parents=True)
    (tmp_path / "outside.sh").write_text("test -f x || qs_fail no\n")
    (checks / "link.sh").symlink_to(tmp_path / "outside.sh")
    os.mkfifo(checks / "fifo")
    (checks / "huge.sh").write_text("test -f x || qs_fail no\n" + "#" * (2 << 20) + "\n")
    return tasks


@pytest.mark.parametrize(("case", "text", "line", "says"), CASES, ids=[c[0] for c in CASES])
def test_hostile_task_file_is_one_located_error(firstrun: Run, tmp_path: Path, case: str,
                                                text: str, line: int, says: str) -> None:
    tasks = _setup(tmp_path)
    task = tasks / f"{case}.yaml"
    task.write_text(text)
    # The FIFO has no writer: a loader that opened it would wait here forever.
    err = one_error(firstrun("run", str(task), cwd=str(tmp_path), timeout=60))
    assert f"{task}:{line}: " in err
    assert says in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_task_path_that_is_no_regular_file_is_refused(firstrun: Run, tmp_path: Path, special: str) -> None:
    path = special if special.startswith("/") else os.fspath(tmp_path / special)
    if not special.startswith("/"):
        os.mkfifo(path)
    err = one_error(firstrun("run", path, cwd=str(tmp_path), timeout=60))
    assert f"{path}: cannot read: not a regular file" in err


CONFIG_CASES = [
    ("alias-cycle", "a: &a [*a]\n", 1, "cycle"),
    ("nul-out", 'out: "a\\0b"\n', 1, "NUL"),
    ("control-char", 'out: "\x07"\n', 1, "U+0007"),
    ("out-is-a-file", "backend: linux\nout: outside.sh\n", 2, "out: 'outside.sh' exists and is not a directory"),
    ("cache-is-a-file", "cache_dir: outside.sh\n", 1, "cache_dir: 'outside.sh' exists and is not a directory"),
    ("mirror-unsplittable", "docs_mirrors:\n  a.example: 'http://[::1'\n", 2, "docs_mirrors.a.example"),
    ("name-too-long", "cache_dir: '" + "c" * 300 + "'\nworkers: 0\n", 2, "workers"),
]


@pytest.mark.parametrize(("case", "text", "line", "says"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_hostile_project_config_is_one_located_error(firstrun: Run, tmp_path: Path, case: str,
                                                     text: str, line: int, says: str) -> None:
    tasks = _setup(tmp_path)
    (tasks / "t.yaml").write_text(HEAD + SCRIPT)
    config = tmp_path / "firstrun.yaml"
    config.write_text(text)
    err = one_error(firstrun("run", "tasks/t.yaml", cwd=str(tmp_path), timeout=60))
    assert f"firstrun.yaml:{line}: " in err
    assert says in err
    assert (tmp_path / "outside.sh").read_text() == "test -f x || qs_fail no\n"


def test_project_config_that_is_a_directory_is_refused(firstrun: Run, tmp_path: Path) -> None:
    tasks = _setup(tmp_path)
    (tasks / "t.yaml").write_text(HEAD + SCRIPT)
    (tmp_path / "firstrun.yaml").mkdir()
    err = one_error(firstrun("run", "tasks/t.yaml", cwd=str(tmp_path), timeout=60))
    assert "firstrun.yaml is not a file" in err


@pytest.mark.parametrize("marker", [".git", "firstrun.yaml"])
def test_a_check_shared_across_the_tasks_project_is_read(firstrun: Run, tmp_path: Path,
                                                         marker: str) -> None:
    # tasks/python/x.yaml naming ../shared/check.sh: inside the project the
    # marker names, so read; a symlink from there to outside it still is not.
    project = tmp_path / "project"
    (project / "tasks" / "python").mkdir(parents=True)
    (project / "tasks" / "shared").mkdir()
    if marker == ".git":
        (project / ".git").mkdir()
    else:
        (project / "firstrun.yaml").write_text("backend: linux\n")
    (project / "tasks" / "shared" / "check.sh").write_text("test -f x || qs_fail no\n")
    (tmp_path / "secret.sh").write_text("test -f y || qs_fail no\n")
    (project / "tasks" / "shared" / "out.sh").symlink_to(tmp_path / "secret.sh")
    ok = project / "tasks" / "python" / "ok.yaml"
    ok.write_text(HEAD + "success:\n  file: ../shared/check.sh\n")
    proc = firstrun("validate", str(ok), cwd=str(project), timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = project / "tasks" / "python" / "out.yaml"
    out.write_text(HEAD + "success:\n  file: ../shared/out.sh\n")
    err = one_error(firstrun("run", str(out), cwd=str(project), timeout=60))
    assert f"leads outside '{project}', the task's project" in err
