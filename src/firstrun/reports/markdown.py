"""A markdown summary of saved runs, for ``$GITHUB_STEP_SUMMARY`` or any markdown viewer.

Guarantee: rendered from saved ``RunRecord``s only. Pass rates are over
evidential runs with their Wilson interval, and "no evidence" is said in
words, never 0%. Text from results is inert: it can neither break a table nor
become a link, an image or a heading. Every run that did not pass is listed
with why, its last page before the failure, and its blocked egress.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from firstrun.reports.analysis import destination
from firstrun.reports.summary import route_finding_text
from firstrun.results.model import Classification, RunRecord
from firstrun.results.mutation import TaskScore, Verdict, is_mutant, mutation_scores
from firstrun.results.stats import PassRate, pass_rate, pass_rates
from firstrun.tasks.allowlist import AllowEntries, allow_snippet

# Inline syntax only: md() output never starts a line, so block markers
# (#, -, +, 1.) cannot take effect and are left readable.
# HTML is escaped (GitHub renders raw HTML in summaries) and markdown punctuation
# backslash-escaped, so text from results cannot break a table or become a link.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]()!|~])")


def md(text: object) -> str:
    """``text`` as inert inline markdown: one line, HTML escaped, punctuation escaped."""
    flat = " ".join(str(text).split())
    return _MD_SPECIAL.sub(r"\\\1", html.escape(flat, quote=False))


def _rate(rate: PassRate) -> str:
    if rate.rate is None or rate.interval is None:
        return "**no evidence**"
    ci = rate.interval
    return (f"{rate.passed}/{rate.evidential} ({rate.rate:.0%}; {ci.confidence:.0%} CI "
            f"{ci.low:.0%}\u2013{ci.high:.0%})")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _not_evidential(rate: PassRate) -> str:
    if not rate.not_evidential:
        return "0"
    parts = ", ".join(f"{md(c.value)} {n}" for c, n in sorted(rate.not_evidential.items()))
    return f"{rate.not_evidential_runs} ({parts})"


def mutation_lines(scores: Sequence[TaskScore]) -> list[str]:
    """``firstrun mutate``'s scores: a row per task, then each mutant that survived."""
    if not scores:
        return []
    lines = ["", "### Mutation scores", "",
             "Each mutant replays the task with one documented step removed, or one version pin "
             "made impossible; a mutant the check lets pass survived.", "",
             _row(["task", "killed", "survived", "not run", "score"]), _row(["---", "---:", "---:", "---:", "---"])]
    for score in scores:
        lines.append(_row([md(score.task), str(score.count(Verdict.KILLED)), str(score.count(Verdict.SURVIVED)),
                           str(score.count(Verdict.NOT_RUN)),
                           md(score.score_text() + (f": {score.why_none}" if score.why_none else ""))]))
    survivors = [(s, m) for s in scores for m in s.mutants if m.verdict is Verdict.SURVIVED]
    if survivors:
        lines += ["", "Survivors (the step is not needed, or the check does not verify its effect):", ""]
        lines += [f"- {md(m.name)}: {md(m.describe())}" for _, m in survivors]
    return lines


def render_markdown(records: Sequence[RunRecord], *, meta: Mapping[str, Any] | None = None,
                    title: str = "firstrun") -> str:
    """The summary: one table row per task, a total, then every run that did not pass."""
    meta = meta or {}
    scores = mutation_scores(records, meta.get("mutated") or ())
    # A mutant's run judges the task's check, not the docs: scored apart, never a pass rate.
    records = [r for r in records if not is_mutant(r)]
    lines = [f"## {md(title)}", ""]
    if not records:
        return "\n".join([*lines, "No run finished: there is nothing to report.", ""])
    agent = " ".join(str(v) for v in (meta.get("agent"), meta.get("model")) if v)
    backends = sorted({f"{r.backend or 'none'} ({r.enforcement or 'none'})" for r in records})
    lines += [
        f"{len(records)} run{'s' if len(records) != 1 else ''}"
        + (f", agent {md(agent)}" if agent else "")
        + f"; backend (enforcement): {md(', '.join(backends))}. "
        "Pass rates are over evidential runs (passed, docs\\_gap) with a Wilson 95% interval; "
        "runs that could not judge the docs are counted apart.",
        "",
        _row(["task", "runs", "passed", "docs\\_gap", "could not judge", "pass rate"]),
        _row(["---", "---:", "---:", "---:", "---:", "---"]),
    ]
    for rate in [*pass_rates(records), pass_rate(records)]:
        name = md(rate.task) if rate.task != "all tasks" else "**all tasks**"
        lines.append(_row([name, str(rate.runs), str(rate.passed), str(rate.docs_gap),
                           _not_evidential(rate), _rate(rate)]))
    lines += mutation_lines(scores)
    shared = [r for r in records if r.check_isolation == "shared"]
    if shared:
        runs = ", ".join(f"{md(r.task)} \\#{r.attempt}" for r in shared)
        lines += ["", f"**Shared checks:** {len(shared)} run{'s' if len(shared) != 1 else ''} "
                      f"({runs}) checked a server the agent left running (`wait_http` with no "
                      "`serve`), beside the agent's processes, which could forge the result."]
    trouble = [r for r in records if r.classification is not Classification.PASSED]
    if trouble:
        lines += ["", "### Runs that did not pass", ""]
        for r in trouble:
            detail = f": {md(r.detail)}" if r.detail else ""
            lines.append(f"- {md(r.task)} \\#{r.attempt}: **{md(r.classification.value)}** "
                         f"({md(r.reason)}){detail}")
            if r.last_page_before_failure:
                lines.append(f"  - last page read before the failure: {md(r.last_page_before_failure)}")
            lines.extend(f"  - route page not read: {md(route_finding_text(f))}" for f in r.route_findings)
            if r.blocked_egress:
                hosts = sorted({destination(b) for b in r.blocked_egress})
                lines.append(f"  - blocked egress ({len(r.blocked_egress)}): {md(', '.join(hosts))}")
            if r.classification is Classification.BLOCKED and r.allow_fix:
                snippet = allow_snippet(AllowEntries.from_data(r.allow_fix)).rstrip("\n")
                lines += ["  - the task lines that would allow it:", "", "    ```yaml",
                          *(f"    {line}" for line in snippet.splitlines()), "    ```", ""]
            if r.trace:
                lines.append(f"  - trace: {md(r.trace)}")
    return "\n".join([*lines, ""])
