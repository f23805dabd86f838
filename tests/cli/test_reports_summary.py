"""The summary's pass rate is over evidential runs only, and says 'no evidence' rather than 0%."""

from __future__ import annotations

from cli_records import record

from firstrun.reports.summary import NO_EVIDENCE, summarize, table_lines
from firstrun.results.model import Classification as C


def test_rate_ignores_runs_that_could_not_judge() -> None:
    rows, total = summarize([
        record("a", 1, C.PASSED), record("a", 2, C.DOCS_GAP), record("a", 3, C.INFRA_ERROR),
        record("b", 1, C.PASSED), record("b", 2, C.BUDGET_EXHAUSTED),
    ])
    assert [r.task for r in rows] == ["a", "b"]
    assert rows[0].runs == 3 and rows[0].evidential == 2
    # Wilson 95% score intervals: 1/2 -> 0.0945-0.9055, 1/1 -> 0.2065-1,
    # 2/3 -> 0.2077-0.9385 (the interval's closed form; tests/results checks
    # the implementation against Newcombe 1998's published table).
    assert rows[0].pass_rate_text() == "1/2 (50%, 95% CI 9-91%)"
    assert rows[1].pass_rate_text() == "1/1 (100%, 95% CI 21-100%)"
    assert total.runs == 5 and total.pass_rate_text() == "2/3 (67%, 95% CI 21-94%)"


def test_no_evidence_is_said_in_words_never_zero_percent() -> None:
    lines = table_lines([record("a", 1, C.SKIPPED), record("b", 1, C.INFRA_ERROR)])
    text = "\n".join(lines)
    assert NO_EVIDENCE in lines[2] and NO_EVIDENCE in lines[-1]
    assert "0%" not in text
    # Columns that occurred are shown; passed and docs_gap always are.
    assert lines[0].split()[:6] == ["task", "runs", "passed", "docs_gap", "infra_error", "skipped"]


def test_all_docs_gaps_is_a_real_zero() -> None:
    _, total = summarize([record("a", 1, C.DOCS_GAP)])
    assert total.pass_rate == 0.0 and total.pass_rate_text() == "0/1 (0%, 95% CI 0-79%)"
