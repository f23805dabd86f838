"""The markdown summary: inert hostile text, honest rates, and where ``--github-summary`` writes."""

from __future__ import annotations

import os
from pathlib import Path

from report_support import HOSTILE, firstrun, record, runs, write_results

from firstrun.reports.markdown import md, render_markdown
from firstrun.results.model import Classification


def test_hostile_text_cannot_become_markup_or_break_the_table() -> None:
    records = [record(f"{HOSTILE} | [x](javascript:y) ![i](https://t.test/i.png) *b* `c`", 1,
                      Classification.DOCS_GAP, detail=f"{HOSTILE}\nsecond | line",
                      last_page_before_failure="https://docs.test/a_b*c")]
    text = render_markdown(records)
    assert "<" not in text and ">" not in text.replace("&gt;", "")
    assert "](" not in text and "![" not in text
    task_rows = [line for line in text.splitlines() if line.startswith("| ") and "alert" in line]
    # One row, and exactly the table's six cells: every | from results is escaped.
    (row,) = task_rows
    assert row.replace("\\|", "").count("|") == 7
    assert md("a_b*c") == "a\\_b\\*c"
    assert "second \\| line" in text


def test_rates_over_evidence_and_no_evidence_in_words() -> None:
    text = render_markdown([*runs("ok", 3, 1), record("down", 1, Classification.INFRA_ERROR)])
    assert "| ok | 4 | 3 | 1 | 0 | 3/4 (75%; 95% CI 30%\u201395%) |" in text
    assert "| down | 1 | 0 | 0 | 1 (infra\\_error 1) | **no evidence** |" in text
    assert "- down \\#1: **infra\\_error** (sandbox\\_failed)" in text


def test_report_markdown_file_and_stdout(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", runs("t", 1, 1), traces=False)
    result = firstrun("report", str(out), "--markdown", str(tmp_path / "s.md"), "--out", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    assert "| t | 2 | 1 | 1 | 0 |" in (tmp_path / "s.md").read_text()
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    piped = firstrun("report", str(out), "--markdown", "-")
    assert piped.returncode == 0 and piped.stdout.startswith("## firstrun")


def test_github_summary_appends_to_the_file_the_environment_names(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", runs("t", 2, 0), traces=False)
    summary = tmp_path / "step_summary"
    summary.write_text("earlier step\n")
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary)}
    result = firstrun("report", str(out), "--github-summary", env=env)
    assert result.returncode == 0, result.stderr
    text = summary.read_text()
    assert text.startswith("earlier step\n## firstrun") and "| t | 2 | 2 | 0 | 0 |" in text
    # The findings follow the pass rates, their gaps named: these runs saved no trace.
    assert text.index("## Findings") > text.index("| t | 2 |")
    assert "gap: 2 runs \\(t #1, t #2\\): no trace saved" in text


def test_github_summary_file_appends_to_the_file_it_names(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", runs("t", 1, 0), traces=False)
    summary = tmp_path / "mine.md"
    summary.write_text("mine\n")
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    result = firstrun("report", str(out), "--github-summary-file", str(summary), env=env)
    assert result.returncode == 0, result.stderr
    text = summary.read_text()
    assert text.startswith("mine\n## firstrun") and "| t | 1 | 1 | 0 | 0 |" in text


def test_github_summary_without_the_variable_is_one_line_exit_3(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", runs("t", 1, 0), traces=False)
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    result = firstrun("report", str(out), "--github-summary", env=env)
    assert result.returncode == 3
    assert result.stderr == ("firstrun: error: --github-summary: $GITHUB_STEP_SUMMARY is not set "
                             "(it is in GitHub Actions); to name the file, use --github-summary-file FILE\n")
    nothing = firstrun("report", str(out))
    assert nothing.returncode == 3 and "say what to write" in nothing.stderr


def test_both_summary_flags_are_refused_in_one_line(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", runs("t", 1, 0), traces=False)
    summary, mine = tmp_path / "step_summary", tmp_path / "mine.md"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary)}
    result = firstrun("report", str(out), "--github-summary", "--github-summary-file", str(mine), env=env)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("firstrun: error: --github-summary and --github-summary-file: ")
    assert not summary.exists() and not mine.exists()


def test_a_path_after_github_summary_is_read_as_the_commands_argument(tmp_path: Path) -> None:
    summary = tmp_path / "step_summary"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary)}
    out = write_results(tmp_path / "res", runs("t", 1, 0), traces=False)
    report = firstrun("report", "--github-summary", str(out), env=env)
    assert report.returncode == 0, report.stderr
    assert "| t | 1 | 1 | 0 | 0 |" in summary.read_text()
    # A task that does not load: the refusal names it as a task, before any run.
    task = tmp_path / "task.yaml"
    task.write_text("name: t\n")
    summary.write_text("earlier step\n")
    run = firstrun("run", "--github-summary", str(task), "--out", str(tmp_path / "out"), env=env)
    assert run.returncode == 3
    assert run.stderr == f"firstrun: error: {task}:1: missing required key 'goal'\n"
    assert task.read_text() == "name: t\n" and summary.read_text() == "earlier step\n"
    assert not (tmp_path / "out").exists()
