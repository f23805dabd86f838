"""The end-of-suite summary: per task, runs by classification and an honest pass rate.

Guarantee: the pass rate is taken over evidential runs only (``passed`` and
``docs_gap``), with its Wilson 95% interval; runs that could not judge the docs
are counted and shown, never folded into the rate. When nothing produced
evidence the rate says so in words, never 0%. A mutant's run is left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from firstrun.results.model import Classification, RunRecord
from firstrun.results.mutation import is_mutant
from firstrun.results.stats import wilson_interval

# Column order of the table: evidence first, then what could not judge.
ORDER = (
    Classification.PASSED,
    Classification.DOCS_GAP,
    Classification.BLOCKED,
    Classification.BUDGET_EXHAUSTED,
    Classification.AGENT_REFUSAL,
    Classification.INFRA_ERROR,
    Classification.HARNESS_ERROR,
    Classification.SKIPPED,
)

# Said in words, never 0%: 0% would claim every documented route failed. The
# interval is there because a handful of runs is a sample.
NO_EVIDENCE = "no evidence"


@dataclass(frozen=True, kw_only=True)
class TaskSummary:
    """Every run of one task (or of the whole suite, for the total row)."""

    task: str
    counts: Mapping[Classification, int]

    @property
    def runs(self) -> int:
        return sum(self.counts.values())

    @property
    def passed(self) -> int:
        return self.counts.get(Classification.PASSED, 0)

    @property
    def evidential(self) -> int:
        return self.passed + self.counts.get(Classification.DOCS_GAP, 0)

    @property
    def pass_rate(self) -> float | None:
        """Passed over evidential runs; None when no run produced evidence."""
        return self.passed / self.evidential if self.evidential else None

    def pass_rate_text(self) -> str:
        """``3/4 (75%, 95% CI 30-95%)``: one run is a sample, so the interval is always shown."""
        rate = self.pass_rate
        interval = wilson_interval(self.passed, self.evidential)
        if rate is None or interval is None:
            return NO_EVIDENCE
        return (f"{self.passed}/{self.evidential} ({rate:.0%}, "
                f"{interval.confidence:.0%} CI {interval.low * 100:.0f}-{interval.high:.0%})")


def summarize(records: Sequence[RunRecord]) -> tuple[list[TaskSummary], TaskSummary]:
    """One summary per task, in the order tasks first finished, and the total."""
    per_task: dict[str, Counter[Classification]] = {}
    # A mutant's run (firstrun mutate) judges the task's check, not the docs.
    for record in (r for r in records if not is_mutant(r)):
        per_task.setdefault(record.task, Counter())[record.classification] += 1
    rows = [TaskSummary(task=task, counts=dict(counts)) for task, counts in per_task.items()]
    total: Counter[Classification] = Counter()
    for counts in per_task.values():
        total.update(counts)
    return rows, TaskSummary(task="all tasks", counts=dict(total))


def columns(rows: Sequence[TaskSummary]) -> list[Classification]:
    """The classifications that occurred, in table order (passed and docs_gap always)."""
    seen = {c for row in rows for c, n in row.counts.items() if n}
    return [c for c in ORDER if c in seen or c in (Classification.PASSED, Classification.DOCS_GAP)]


def table_lines(records: Sequence[RunRecord]) -> list[str]:
    """The summary as aligned plain-text lines (for a log, a pipe, a CI console)."""
    rows, total = summarize(records)
    cols = columns([*rows, total])
    header = ["task", "runs", *(c.value for c in cols), "pass rate (evidential runs)"]
    body = [
        [row.task, str(row.runs), *(str(row.counts.get(c, 0)) for c in cols), row.pass_rate_text()]
        for row in [*rows, total]
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return [fmt(header), rule, *(fmt(cells) for cells in body[:-1]), rule, fmt(body[-1])]


def total_line(records: Sequence[RunRecord]) -> str:
    """The whole sweep in one line (``run -q``): runs by classification, then the pass rate.

    ``4 runs: 3 passed, 1 docs_gap; pass rate 3/4 (75%, 95% CI 30-95%)``
    """
    _, total = summarize(records)
    counts = ", ".join(f"{total.counts[c]} {c.value}" for c in ORDER if total.counts.get(c))
    return (f"{total.runs} run{'s' if total.runs != 1 else ''}: {counts}; "
            f"pass rate {total.pass_rate_text()}")


def route_finding_text(finding: Mapping[str, Any]) -> str:
    """One unreadable page of the documented route, as a person reads it."""
    status = f", HTTP {finding['status']}" if finding.get("status") is not None else ""
    detail = f": {finding['detail']}" if finding.get("detail") else ""
    return f"{finding.get('url')} ({finding.get('error')}{status}){detail}"
