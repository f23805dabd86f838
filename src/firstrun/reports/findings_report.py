"""Findings and the field's figures as JSON, text and markdown, and two sweeps' findings compared.

Guarantee: pure renderings of ``reports.findings`` results. The JSON validates
against ``FINDINGS_SCHEMA`` (``firstrun schema --findings``); unknown figures
are null, never 0. The markdown is inert: run text passes through ``markdown.md``
or a fence longer than any backtick run in it. A saved suggestion is shown
beside its finding, marked drafted or stale, and counts in no figure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from firstrun.reports.findings import (
    ArmPair,
    ArmsMatrix,
    Evidence,
    Figures,
    Finding,
    RunTrace,
    Spread,
    TaskFindings,
    figures,
    findings,
    sweep_figures,
)
from firstrun.reports.markdown import md
from firstrun.reports.suggestions import SUGGESTION_SCHEMA, Key, Status, Suggestion, suggestion_data
from firstrun.results.stats import ComparisonVerdict, PassRate
from firstrun.tasks.lint import gh_data, gh_property

SCHEMA_ID = "firstrun.findings/1"
# Findings shown per task in text and markdown, and runs named per gap; the JSON has every one.
SHOWN = 10
GAP_RUNS = 5


@dataclass(frozen=True, kw_only=True)
class Report:
    """A sweep's findings per task, each task's figures, and the sweep's; ``suggestions``
    are the saved drafts by finding (``--suggest``), shown beside them and read by no figure."""

    tasks: tuple[TaskFindings, ...]
    figures: tuple[Figures, ...]
    sweep: Figures
    suggestions: Mapping[Key, Suggestion] = field(default_factory=dict)


def build_report(runs: Sequence[RunTrace], suggestions: Mapping[Key, Suggestion] | None = None) -> Report:
    tasks = findings(runs)
    return Report(tasks=tasks,
                  figures=tuple(figures(t.task, [r for r in runs if r.record.task == t.task]) for t in tasks),
                  sweep=sweep_figures(runs), suggestions=dict(suggestions or {}))


# --- JSON -------------------------------------------------------------------------

def _spread(s: Spread) -> dict[str, float | None]:
    return {"median": s.median, "p90": s.p90}


def figures_data(f: Figures) -> dict[str, Any]:
    return {
        "task": f.task, "evidential": f.evidential, "passed": f.passed,
        "pass_hat_k": [{"k": k, "value": v} for k, v in f.pass_hat],
        "pass_at_k": [{"k": k, "value": v} for k, v in f.pass_at],
        "wall_s": _spread(f.wall_s), "agent_s": _spread(f.agent_s),
        "tokens_per_success": f.tokens_per_success,
        "spend_per_success_usd": None if f.spend_per_success is None else str(f.spend_per_success),
        "commands_per_run": f.commands_per_run,
        "failed_command_share": f.failed_command_share,
    }


def _evidence(e: Evidence) -> dict[str, Any]:
    return {"run": e.run, "trace": e.trace, "command": e.command, "exit_code": e.exit_code,
            "output_tail": e.output_tail}


def finding_data(f: Finding, suggestion: Suggestion | None = None) -> dict[str, Any]:
    data = {
        "kind": f.kind.value, "task": f.task, "task_file": f.task_file, "headline": f.headline(),
        "what": f.what, "page": f.page, "block": f.block, "block_text": f.block_text, "at_check": f.at_check,
        "runs": list(f.runs), "of": f.of, "evidence": [_evidence(e) for e in f.evidence],
        "claims": list(f.claims),
    }
    if suggestion is not None:
        data["suggestion"] = {k: v for k, v in suggestion_data(suggestion).items() if k != "finding"} | {
            "current": suggestion.current(f)}
    return data


def report_data(report: Report) -> dict[str, Any]:
    per_task = {f.task: f for f in report.figures}
    return {
        "schema": SCHEMA_ID,
        "sweep": figures_data(report.sweep),
        "tasks": [
            {"task": t.task, "evidential": t.evidential,
             "figures": figures_data(per_task[t.task]),
             "gaps": [{"run": run, "gap": gap} for run, gap in t.gaps],
             "findings": [finding_data(f, report.suggestions.get(f.key)) for f in t.findings]}
            for t in report.tasks
        ],
    }


_NUMBER_OR_NULL = {"type": ["number", "null"]}
_SPREAD = {"type": "object", "additionalProperties": False, "required": ["median", "p90"],
           "properties": {"median": _NUMBER_OR_NULL, "p90": _NUMBER_OR_NULL}}
_KS = {"type": "array", "items": {
    "type": "object", "additionalProperties": False, "required": ["k", "value"],
    "properties": {"k": {"type": "integer", "minimum": 1}, "value": {"type": "number", "minimum": 0, "maximum": 1}}}}
_FIGURES = {
    "type": "object", "additionalProperties": False,
    "required": ["task", "evidential", "passed", "pass_hat_k", "pass_at_k", "wall_s", "agent_s",
                 "tokens_per_success", "spend_per_success_usd", "commands_per_run", "failed_command_share"],
    "properties": {
        "task": {"type": "string"}, "evidential": {"type": "integer", "minimum": 0},
        "passed": {"type": "integer", "minimum": 0}, "pass_hat_k": _KS, "pass_at_k": _KS,
        "wall_s": _SPREAD, "agent_s": _SPREAD,
        "tokens_per_success": _NUMBER_OR_NULL,
        "spend_per_success_usd": {"type": ["string", "null"], "pattern": r"^-?\d+(\.\d+)?(E[-+]?\d+)?$",
                                  "description": "a decimal in USD; null when any run's spend is unknown"},
        "commands_per_run": _NUMBER_OR_NULL,
        "failed_command_share": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    },
}
_STRING_OR_NULL = {"type": ["string", "null"]}
_FINDING = {
    "type": "object", "additionalProperties": False,
    "required": ["kind", "task", "task_file", "headline", "what", "page", "block", "block_text", "at_check",
                 "runs", "of",
                 "evidence", "claims"],
    "properties": {
        "kind": {"enum": ["break", "improvised"]}, "task": {"type": "string"}, "task_file": {"type": "string"},
        "headline": {"type": "string"},
        "what": {"type": "string", "description": "the error signature (break) or the command (improvised)"},
        "page": _STRING_OR_NULL, "block": {"type": ["integer", "null"], "minimum": 0},
        "block_text": _STRING_OR_NULL,
        "at_check": {"type": "boolean", "description": "the run broke at the success check, every failed "
                     "command overcome"},
        "runs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "of": {"type": "integer", "minimum": 1},
        "evidence": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["run", "trace", "command", "exit_code", "output_tail"],
            "properties": {"run": {"type": "string"}, "trace": {"type": "string"}, "command": {"type": "string"},
                           "exit_code": {"type": ["integer", "null"]}, "output_tail": {"type": "string"}}}},
        "claims": {"type": "array", "items": {"type": "string"}},
        "suggestion": SUGGESTION_SCHEMA,
    },
}
FINDINGS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "firstrun findings",
    "type": "object", "additionalProperties": False, "required": ["schema", "sweep", "tasks"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "sweep": _FIGURES,
        "tasks": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["task", "evidential", "figures", "gaps", "findings"],
            "properties": {
                "task": {"type": "string"}, "evidential": {"type": "integer", "minimum": 0},
                "figures": _FIGURES,
                "gaps": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "required": ["run", "gap"],
                    "properties": {"run": {"type": "string"},
                                   "gap": {"enum": ["no_trace", "unreadable", "no_blocks"]}}}},
                "findings": {"type": "array", "items": _FINDING},
            }}},
    },
}


# --- text and markdown -------------------------------------------------------------

GAP_TEXT = {"no_trace": "no trace saved", "unreadable": "trace unreadable",
         "no_blocks": "pages saved without their code blocks (an older run): no step is called improvised"}


def gap_lines(t: TaskFindings) -> list[str]:
    """One line per kind of gap, naming its runs."""
    runs: dict[str, list[str]] = {}
    for run, gap in t.gaps:
        runs.setdefault(gap, []).append(run)
    def named(ids: list[str]) -> str:
        shown = ", ".join(ids[:GAP_RUNS])
        return shown + (f", and {len(ids) - GAP_RUNS} more" if len(ids) > GAP_RUNS else "")

    return [f"gap: {len(ids)} run{'s' if len(ids) != 1 else ''} ({named(ids)}): {GAP_TEXT.get(gap, gap)}"
            for gap, ids in runs.items()]


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def _secs(s: Spread) -> str:
    return "unknown" if s.median is None or s.p90 is None else f"median {s.median:.1f}s, p90 {s.p90:.1f}s"


def figures_lines(f: Figures) -> list[str]:
    hats = ", ".join(f"pass^{k} {v:.0%}" for k, v in f.pass_hat) or "pass^k: no evidence"
    ats = ", ".join(f"pass@{k} {v:.0%}" for k, v in f.pass_at)
    spend = "unknown" if f.spend_per_success is None else f"${f.spend_per_success:.4f}"
    tokens = "unknown" if f.tokens_per_success is None else f"{f.tokens_per_success:,.0f}"
    per_run = "unknown" if f.commands_per_run is None else f"{f.commands_per_run:.1f}"
    # No passing run leaves nothing to time or divide by: said so, not called unknown.
    none = f.passed == 0
    return [
        f"{f.passed}/{f.evidential} evidential runs passed; {hats}" + (f"; {ats}" if ats else ""),
        "time to success: no run passed" if none
        else f"time to success: {_secs(f.wall_s)} (agent phase: {_secs(f.agent_s)})",
        "per success: no run passed" if none else f"per success: {tokens} tokens, spend {spend}",
        f"commands per run: {per_run}, failed: {_pct(f.failed_command_share)}",
    ]


def suggestion_head(f: Finding, s: Suggestion) -> str:
    """What a finding's saved suggestion is: a draft and by whom, or why there is none."""
    if s.status is Status.BUDGET_SPENT:
        return "no suggested change: the --max-spend budget was spent before this finding"
    if s.status is not Status.DRAFTED:
        return f"no suggested change: {s.error}"
    stale = "" if s.current(f) else "; its evidence has changed since: run --suggest again"
    return f"suggested change (drafted by {s.model}, a suggestion, not a measurement{stale}):"


def suggestions_line(report: Report) -> str | None:
    """What the drafts shown cost, in one line; None when there are none."""
    shown = [s for t in report.tasks for f in t.findings[:SHOWN] if (s := report.suggestions.get(f.key))]
    if not shown:
        return None
    drafted = sum(1 for s in shown if s.status is Status.DRAFTED)
    models = ", ".join(sorted({s.model for s in shown}))
    spends = [s.spend_usd for s in shown]
    spend = "unknown" if None in spends else f"${sum((x for x in spends if x is not None), Decimal(0)):.4f}"
    return (f"suggested changes: {drafted} of {len(shown)} findings drafted by {models}, spend {spend} "
            "(in no figure above)")


def render_text(report: Report) -> str:
    lines = ["sweep:", *(f"  {line}" for line in figures_lines(report.sweep))]
    if (said := suggestions_line(report)) is not None:
        lines.append(f"  {said}")
    per_task = {f.task: f for f in report.figures}
    for t in report.tasks:
        lines += ["", f"task {t.task}:", *(f"  {line}" for line in figures_lines(per_task[t.task]))]
        if not t.findings:
            lines.append("  no findings")
        for i, f in enumerate(t.findings[:SHOWN], start=1):
            lines.append(f"  {i}. {f.headline()}")
            if f.block_text:
                lines += [f"       | {line}" for line in f.block_text.splitlines()[:6]]
            lines.append(f"     runs: {', '.join(f.runs)}")
            for e in f.evidence[:1]:
                lines.append(f"     {e.run}: {e.command} (exit {e.exit_code})")
                lines += [f"       > {line}" for line in e.output_tail.splitlines()]
            lines += [f"     said: {claim}" for claim in f.claims]
            if (s := report.suggestions.get(f.key)) is not None:
                lines.append(f"     {suggestion_head(f, s)}")
                lines += [f"       ~ {line}" for line in (s.text or "").splitlines()]
        if len(t.findings) > SHOWN:
            lines.append(f"  ... and {len(t.findings) - SHOWN} more (--format json has all)")
        lines += [f"  {line}" for line in gap_lines(t)]
    return "\n".join(lines) + "\n"


def _fence(text: str) -> list[str]:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *text.splitlines(), fence]


def render_markdown(report: Report, *, arm: str | None = None) -> str:
    """A ``## Findings`` section (of ``arm``, when given): the sweep's figures, then each
    task's findings, ranked."""
    title = "## Findings" + (f": {md(arm)}" if arm is not None else "")
    said = suggestions_line(report)
    out = [title, "", *(f"- {md(line)}" for line in [*figures_lines(report.sweep), *([said] if said else [])]), ""]
    for t in report.tasks:
        out += [f"### {md(t.task)}", ""]
        if not t.findings:
            out += ["No findings.", ""]
        for i, f in enumerate(t.findings[:SHOWN], start=1):
            out += [f"{i}. **{md(f.headline())}**", ""]
            body: list[str] = []
            if f.block_text:
                body += [f"Block {f.block} of {md(f.page)}:", "", *_fence(f.block_text), ""]
            body += [f"Runs: {md(', '.join(f.runs))}", ""]
            for e in f.evidence[:1]:
                body += [f"{md(e.run)} ran (exit {e.exit_code}):", "",
                         *_fence(f"$ {e.command}\n{e.output_tail}".rstrip("\n")), ""]
            body += [f"> {md(claim)}" for claim in f.claims]
            if (s := report.suggestions.get(f.key)) is not None:
                body += ["", f"*{md(suggestion_head(f, s))}*", *(["", *_fence(s.text)] if s.text else [])]
            out += [f"   {line}" if line else "" for line in body] + [""]
        out += [f"- {md(line)}" for line in gap_lines(t)]
        if t.gaps:
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def render_github(report: Report) -> str:
    """One GitHub Actions warning per finding, on its task file, naming the page and block."""
    lines = []
    for t in report.tasks:
        for f in t.findings[:SHOWN]:
            detail = f"; runs: {', '.join(f.runs)}"
            if f.evidence:
                detail += f"; {f.evidence[0].run} ran: {f.evidence[0].command}"
            lines.append(f"::warning file={gh_property(f.task_file)},title={gh_property(f'firstrun {f.kind.value}')}"
                         f"::{gh_data(f.headline() + detail)}")
    return "".join(line + "\n" for line in lines)


# --- arms -------------------------------------------------------------------------

def _cell(rate: PassRate | None) -> str:
    if rate is None:
        return "not run"
    if rate.rate is None or rate.interval is None:
        return "no evidence"
    return f"{rate.passed}/{rate.evidential} ({rate.rate:.0%}, CI {rate.interval.low:.0%}-{rate.interval.high:.0%})"


def pair_text(pair: ArmPair, matrix: ArmsMatrix) -> str:
    c = pair.comparison
    p = f" (p {c.p_value:.4g})" if c.p_value is not None else ""
    said = {
        ComparisonVerdict.REGRESSED: f"{pair.first} higher{p}",
        ComparisonVerdict.IMPROVED: f"{pair.second} higher{p}",
        ComparisonVerdict.NO_SIGNIFICANT_CHANGE: f"no significant difference{p}",
        ComparisonVerdict.TOO_SMALL: f"too small to tell: needs {matrix.smallest_sample}+ evidential runs per side",
    }
    return f"{pair.first} vs {pair.second}, {c.task}: {said.get(c.verdict, 'no evidence on one side')}"


def matrix_rows(matrix: ArmsMatrix) -> list[list[str]]:
    """The header, then one row per arm: its cell per task, then all tasks."""
    return [["arm", *matrix.tasks, "all tasks"],
            *([arm, *(_cell(r) for r in rates), _cell(total)]
              for arm, rates, total in zip(matrix.arms, matrix.rates, matrix.totals, strict=True))]


def matrix_text(matrix: ArmsMatrix) -> str:
    rows = matrix_rows(matrix)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["arms (pass rate over evidential runs, 95% Wilson CI):",
             *("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
               for row in rows),
             "Fisher's exact test per task between each pair of arms:",
             *(f"  {pair_text(pair, matrix)}" for pair in matrix.pairs)]
    return "\n".join(lines) + "\n"


def matrix_markdown(matrix: ArmsMatrix) -> str:
    header, *rows = matrix_rows(matrix)
    out = ["## Arms", "", "| " + " | ".join(md(h) for h in header) + " |",
           "|" + "---|" * len(header), *("| " + " | ".join(md(c) for c in row) + " |" for row in rows), "",
           "Fisher's exact test per task between each pair of arms:", "",
           *(f"- {md(pair_text(pair, matrix))}" for pair in matrix.pairs)]
    return "\n".join(out) + "\n"


# --- two sweeps -------------------------------------------------------------------

class Change(StrEnum):
    APPEARED = "appeared"
    GREW = "grew"
    SHRANK = "shrank"
    DISAPPEARED = "disappeared"


@dataclass(frozen=True, kw_only=True)
class FindingChange:
    change: Change
    finding: Finding
    before: tuple[int, int] | None
    after: tuple[int, int] | None

    def text(self) -> str:
        def share(runs: tuple[int, int] | None) -> str:
            return "none" if runs is None else f"{runs[0]}/{runs[1]} runs"
        return (f"{self.change.value.upper()}: {self.finding.task}: {self.finding.headline()} "
                f"({share(self.before)} -> {share(self.after)})")


def compare_findings(before: Sequence[TaskFindings], after: Sequence[TaskFindings]) -> tuple[FindingChange, ...]:
    """What changed between two sweeps' findings; a finding whose share held is not listed."""
    # A finding is the same one in two sweeps when its kind, task, signature or
    # command, page and block are (Finding.key); it grew or shrank with its share
    # of evidential runs.
    old = {f.key: f for t in before for f in t.findings}
    new = {f.key: f for t in after for f in t.findings}
    changes = []
    for key, f in new.items():
        if key not in old:
            changes.append(FindingChange(change=Change.APPEARED, finding=f, before=None,
                                         after=(len(f.runs), f.of)))
            continue
        was = old[key]
        # Shares compared by cross-multiplying, so the direction is decided on whole numbers.
        grew = len(f.runs) * was.of - len(was.runs) * f.of
        if grew:
            changes.append(FindingChange(change=Change.GREW if grew > 0 else Change.SHRANK, finding=f,
                                         before=(len(was.runs), was.of), after=(len(f.runs), f.of)))
    changes += [FindingChange(change=Change.DISAPPEARED, finding=f, before=(len(f.runs), f.of), after=None)
                for key, f in old.items() if key not in new]
    order = list(Change)
    return tuple(sorted(changes, key=lambda c: (order.index(c.change), c.finding.task, -len(c.finding.runs))))
