"""Mutation scores from saved runs: verdicts, the score, and how the reports show them."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_support import firstrun, record, write_results

from firstrun.reports.html import render_html
from firstrun.reports.junit import junit_document
from firstrun.reports.load import load_saved, read_runs
from firstrun.reports.markdown import render_markdown
from firstrun.reports.summary import table_lines, total_line
from firstrun.results.model import Classification, RunRecord
from firstrun.results.mutation import Verdict, mutation_scores
from firstrun.tasks.mutation import Mutation

pytestmark = pytest.mark.fast


def mutant(step: int, classification: Classification, *, pin: tuple[str, str] | None = None,
           reason: str | None = None) -> RunRecord:
    mutation = Mutation(of="t", step=step, command=f"cmd {step}", where=f"https://d.test/a block {step}",
                        pin=pin, number=1 if pin else 0)
    fields = {"reason": reason} if reason else {}
    return record(mutation.name, 1, classification, extra={"mutation": mutation.to_data()}, **fields)


SWEEP = [
    record("t", 1, Classification.PASSED),
    mutant(1, Classification.DOCS_GAP),
    mutant(1, Classification.DOCS_GAP, pin=("==1.0", "==99999.0")),
    mutant(2, Classification.PASSED),
    mutant(3, Classification.SKIPPED, reason="replay_drift"),
]


def test_a_docs_gap_kills_a_pass_survives_and_no_evidence_is_not_run() -> None:
    [score] = mutation_scores(SWEEP)
    assert [(m.name, m.verdict) for m in score.mutants] == [
        ("t.drop-1", Verdict.KILLED), ("t.pin-1-1", Verdict.KILLED), ("t.drop-2", Verdict.SURVIVED),
        ("t.drop-3", Verdict.NOT_RUN)]
    assert score.score == 2 / 3 and score.score_text() == "2/3 killed (67%)"
    assert score.mutants[3].reason.startswith("skipped (replay_drift)")
    assert score.mutants[1].describe() == "step 1 (https://d.test/a block 1) with ==1.0 made ==99999.0"


def test_a_task_that_did_not_pass_unmutated_has_no_score_and_says_why() -> None:
    [score] = mutation_scores([record("t", 1, Classification.DOCS_GAP)], ["t"])
    assert score.score is None and score.mutants == ()
    assert score.why_none.startswith("the unmutated task did not pass (docs_gap")


def test_the_reports_score_mutants_apart_from_the_pass_rates(tmp_path: Path) -> None:
    out = write_results(tmp_path / "r", SWEEP, meta={"agent": "replay", "mutated": ["t"]})
    text = render_markdown(load_saved(out, label="RESULTS_DIR").records, meta={"mutated": ["t"]})
    assert "| t | 2 | 1 | 1 | 2/3 killed \\(67%\\) |" in text
    assert "- t.drop-2: step 2 \\(https://d.test/a block 2\\) removed" in text
    # Mutants are no runs of the docs: not in the pass-rate table, not "runs that did not pass".
    assert "| t.drop-1 |" not in text and "t.drop-1 \\#1" not in text
    page = render_html(load_saved(out, label="RESULTS_DIR"))
    assert "Mutation scores" in page and "2/3 killed (67%)" in page
    assert page.count('href="#task-') == 1


def test_findings_leave_a_mutant_s_runs_out(tmp_path: Path) -> None:
    # A mutant's docs were broken on purpose: its failure is no finding about the docs.
    write_results(tmp_path, SWEEP)
    assert [run.record.task for run in read_runs(load_saved(tmp_path, label="RESULTS"))] == ["t"]


def test_mutants_are_no_tasks_in_the_summary_junit_or_diff(tmp_path: Path) -> None:
    assert total_line(SWEEP) == "1 run: 1 passed; pass rate 1/1 (100%, 95% CI 21-100%)"
    assert not any("t.drop" in line for line in table_lines(SWEEP))
    suites = junit_document(SWEEP)
    assert [s.get("name") for s in suites.iter("testsuite")] == ["t"] and suites.get("tests") == "1"
    before = write_results(tmp_path / "before", SWEEP, meta={"agent": "replay", "mutated": ["t"]})
    after = write_results(tmp_path / "after", SWEEP[:1], meta={"agent": "replay"})
    proc = firstrun("diff", str(before), str(after))
    assert proc.returncode == 0, proc.stderr
    assert "t.drop" not in proc.stdout and "t.pin" not in proc.stdout
