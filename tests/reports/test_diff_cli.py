"""``firstrun diff`` through the real console script, on results directories built from RunRecords."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_support import firstrun, record, runs, write_results

from firstrun.results.model import Classification

pytestmark = pytest.mark.fast


def _sweeps(tmp_path: Path, before: list, after: list) -> tuple[str, str]:
    return (str(write_results(tmp_path / "before", before, traces=False)),
            str(write_results(tmp_path / "after", after, traces=False)))


def _row(stdout: str, task: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith(task + " ")]
    return line


def test_significant_regression_fails_only_with_the_flag(tmp_path: Path) -> None:
    # Fisher's convictions table as two sweeps: 10/13 passed, then 2/17; p = 0.0005367 (R).
    before, after = _sweeps(tmp_path, runs("quick", 10, 3), runs("quick", 2, 15))
    plain = firstrun("diff", before, after)
    assert plain.returncode == 0, plain.stderr
    row = _row(plain.stdout, "quick")
    assert "10/13 (77%)" in row and "2/17 (12%)" in row and "-65 pts" in row
    assert "0.0005367" in row and "REGRESSED" in row
    assert "Significant regressions: 1 (quick)" in plain.stdout
    ci = firstrun("diff", before, after, "--fail-on-regression")
    assert ci.returncode == 1, ci.stderr
    # A stricter alpha than the p: no regression, and CI passes.
    strict = firstrun("diff", before, after, "--fail-on-regression", "--alpha", "0.0001")
    assert strict.returncode == 0 and "no significant change" in _row(strict.stdout, "quick")


def test_improvement_and_no_change_do_not_fail(tmp_path: Path) -> None:
    before, after = _sweeps(tmp_path, [*runs("up", 2, 15), *runs("tea", 3, 1)],
                            [*runs("up", 10, 3), *runs("tea", 1, 3)])
    result = firstrun("diff", before, after, "--fail-on-regression")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "improved" in _row(result.stdout, "up")
    # The tea-tasting table: two-sided p = 34/70.
    assert "0.4857" in _row(result.stdout, "tea") and "no significant change" in _row(result.stdout, "tea")


def test_too_small_says_so_with_the_sample_that_could(tmp_path: Path) -> None:
    # All passed, then all failed, three each: the most extreme outcome, and still p = 0.1.
    before, after = _sweeps(tmp_path, runs("small", 3, 0), runs("small", 0, 3))
    result = firstrun("diff", before, after, "--fail-on-regression")
    assert result.returncode == 0, result.stderr
    row = _row(result.stdout, "small")
    assert "too small to tell: needs 4+ evidential runs per side" in row
    assert "0.1" not in row and "REGRESSED" not in row
    assert "The smallest sample that can is 4 evidential runs per side (4/4 against 0/4)." in result.stdout
    # At alpha 0.01 the bar is 5 per side.
    stricter = firstrun("diff", before, after, "--alpha", "0.01")
    assert "needs 5+ evidential runs per side" in _row(stricter.stdout, "small")


def test_one_sided_tasks_and_no_evidence_are_listed(tmp_path: Path) -> None:
    before, after = _sweeps(
        tmp_path,
        [*runs("gone", 5, 0), record("broken", 1, Classification.INFRA_ERROR)],
        [*runs("broken", 4, 0), *runs("fresh", 1, 1)],
    )
    result = firstrun("diff", before, after, "--fail-on-regression")
    assert result.returncode == 0, result.stderr
    assert "only in BEFORE" in _row(result.stdout, "gone") and "not run" in _row(result.stdout, "gone")
    assert "only in AFTER" in _row(result.stdout, "fresh")
    assert "no evidence in BEFORE" in _row(result.stdout, "broken")
    assert "no evidence (1 run)" in _row(result.stdout, "broken")


def test_results_json_files_are_accepted_and_task_changes_flagged(tmp_path: Path) -> None:
    before, after = _sweeps(tmp_path, runs("t", 4, 0), runs("t", 0, 4, task_sha256="cd" * 32))
    result = firstrun("diff", f"{before}/results.json", f"{after}/results.json", "--fail-on-regression")
    assert result.returncode == 1
    assert "REGRESSED (task file changed)" in _row(result.stdout, "t")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "0"], "argument --alpha: must be between 0 and 1"),
        (["--alpha", "x"], "argument --alpha: not a number"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_exit_3_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    before, after = _sweeps(tmp_path, runs("t", 1, 0), runs("t", 1, 0))
    result = firstrun("diff", before, after, *args)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_missing_or_bad_results_exit_3_naming_the_argument(tmp_path: Path) -> None:
    before, _ = _sweeps(tmp_path, runs("t", 1, 0), [])
    missing = firstrun("diff", before, str(tmp_path / "nowhere"))
    assert missing.returncode == 3 and missing.stderr.startswith("firstrun: error: AFTER: ")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.json").write_text("{not json")
    junk = firstrun("diff", str(tmp_path / "junk"), before)
    assert junk.returncode == 3 and "BEFORE: " in junk.stderr and "not a readable results file" in junk.stderr
    assert firstrun("diff", before).returncode == 3


def test_sweeps_run_through_different_readers_are_flagged_before_the_table(tmp_path: Path) -> None:
    meta = {"agent": "replay", "model": None, "started_at": "2026-01-01T00:00:00+00:00"}
    before = write_results(tmp_path / "before", runs("quick", 3, 1), traces=False, meta={
        **meta, "versions": {"httpx": "0.28.1", "markdownify": "1.1.0", "beautifulsoup4": "4.13.0"}})
    after = write_results(tmp_path / "after", runs("quick", 3, 1), traces=False, meta={
        **meta, "versions": {"httpx": "0.28.1", "markdownify": "2.0.0", "beautifulsoup4": "4.13.0"}})
    result = firstrun("diff", str(before), str(after))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("firstrun: the sweeps ran with different versions of what shapes the "
                             "agent's view: markdownify 1.1.0 -> 2.0.0\n")
    same = firstrun("diff", str(before), str(before))
    assert same.stderr == ""
