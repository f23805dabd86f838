from __future__ import annotations

from pathlib import Path

from firstrun.tasks.cli_support import EXIT_INVALID, EXIT_OK, EXIT_USAGE, validate_paths
from firstrun.tasks.lint import Code, Severity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def test_valid_fixtures_validate_clean() -> None:
    assert validate_paths([FIXTURES / "valid"]) == ([], EXIT_OK)


def test_every_invalid_file_is_one_located_finding() -> None:
    findings, code = validate_paths([FIXTURES / "invalid"])
    assert code == EXIT_INVALID
    files = sorted(str(p) for p in (FIXTURES / "invalid").glob("*.yaml"))
    assert sorted(f.file for f in findings) == files
    for f in findings:
        assert f.severity is Severity.ERROR and f.code is Code.INVALID_TASK
        assert f.line is not None and "\n" not in str(f)


def test_nothing_to_validate_is_a_usage_error(tmp_path: Path) -> None:
    findings, code = validate_paths([tmp_path])
    assert code == EXIT_USAGE
    assert [(f.code, f.file) for f in findings] == [(Code.NO_SUCH_PATH, str(tmp_path))]


def test_a_missing_path_beside_real_tasks_is_an_error(tmp_path: Path) -> None:
    findings, code = validate_paths(
        [FIXTURES / "valid" / "node-quickstart.yaml", tmp_path / "x.yaml"]
    )
    assert code == EXIT_INVALID
    assert [f.code for f in findings] == [Code.NO_SUCH_PATH]


def test_lint_errors_and_duplicate_names_fail_validation(write_task) -> None:
    a = write_task(
        "name: same\ngoal: g\ndocs: {entrypoint: https://d.example.org/}\n"
        "success: {script: echo ok}\n",
        name="a.yaml",
    )
    b = write_task(
        "name: same\ngoal: g\ndocs: {entrypoint: https://d.example.org/}\n"
        "success: {script: test -f x}\n",
        name="b.yaml",
    )
    findings, code = validate_paths([a, b])
    assert code == EXIT_INVALID
    assert [(f.code, f.file, f.line) for f in findings] == [
        (Code.CHECK_ALWAYS_PASSES, str(a), 4),
        (Code.DUPLICATE_NAME, str(b), 1),
    ]
