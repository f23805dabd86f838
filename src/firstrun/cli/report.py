"""``firstrun diff``, ``firstrun report`` and ``firstrun findings``, and where a GitHub step summary goes.

Guarantee: they read saved results only, and every bad input is refused in one
line naming the flag or argument before anything is written, an output that is
the results file itself included. ``diff`` exits 0, or 1 with
``--fail-on-regression`` when some task's pass rate dropped significantly.
``findings --suggest`` refuses what it cannot do before its first vendor call.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal

from firstrun.cli.color import colors, rich_console
from firstrun.cli.flags import summary_target, writable_file
from firstrun.errors import UsageError
from firstrun.reports.diff import HEADER, diff_lines, diff_notes, diff_rows
from firstrun.reports.findings import arms_matrix, findings
from firstrun.reports.findings_report import (
    FINDINGS_SCHEMA,
    Report,
    build_report,
    compare_findings,
    matrix_markdown,
    matrix_text,
    render_github,
    render_text,
    report_data,
)
from firstrun.reports.findings_report import render_markdown as findings_markdown
from firstrun.reports.html import write_html
from firstrun.reports.load import SavedResults, load_saved, load_sweep, read_runs, read_suggestions
from firstrun.reports.markdown import render_markdown
from firstrun.reports.output import append_text, write_text_atomic
from firstrun.reports.suggest import choose_model, draft, drafted_lines, save_suggestions
from firstrun.reports.suggestions import FILE as SUGGESTIONS_FILE
from firstrun.results.stats import compare
from firstrun.results.versions import version_changes


def diff_command(before: str, after: str, *, alpha: float, fail_on_regression: bool,
                 color: str = "auto") -> int:
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha: must be between 0 and 1 (exclusive), got {alpha}")
    old = load_saved(before, label="BEFORE")
    new = load_saved(after, label="AFTER")
    comparison = compare(old.docs_records, new.docs_records, alpha=alpha)
    changed = version_changes(old.meta.get("versions") or {}, new.meta.get("versions") or {})
    if changed:
        # Said first: a change here may be what moved the pass rates, not the docs.
        print("firstrun: the sweeps ran with different versions of what shapes the agent's "
              f"view: {', '.join(changed)}", file=sys.stderr)
    if colors(color, sys.stdout) and comparison.tasks:
        from rich.table import Table

        table = Table(title=f"firstrun diff (alpha {alpha:g})", title_justify="left")
        for name in HEADER:
            table.add_column(name)
        for row in diff_rows(comparison):
            table.add_row(*row, style="bold red" if row[-1].startswith("REGRESSED") else None)
        console = rich_console(sys.stdout, color=True, highlight=False)
        console.print(table)
        for note in diff_notes(comparison):
            console.print(note, markup=False)
    else:
        print("\n".join(diff_lines(comparison)))
    # Which findings appeared, grew, shrank or disappeared: said, never counted in
    # the exit status.
    changes = compare_findings(findings(read_runs(old)), findings(read_runs(new)))
    print("\nFindings: " + ("no change." if not changes else f"{len(changes)} changed."))
    for change in changes:
        print(f"  {change.text()}")
    # A task whose samples are too small to show anything is never a regression:
    # it is shown as too small to tell.
    # Findings that changed never change the exit status; only a regression can.
    return 1 if fail_on_regression and comparison.regressions else 0


def report_command(results: str, *, out: str | None, markdown: str | None, github_summary: bool,
                   github_summary_file: str | None) -> int:
    summary = summary_target(github_summary, github_summary_file)
    if out is None and markdown is None and summary is None:
        raise UsageError("report: say what to write: --out FILE.html, --markdown FILE, --github-summary "
                         "or --github-summary-file FILE")
    html_path = writable_file("--out", out) if out is not None else None
    md_path = writable_file("--markdown", markdown) if markdown not in (None, "-") else None
    sweeps = load_sweep(results, label="RESULTS_DIR")
    outputs = [("--out", html_path), ("--markdown", md_path)]
    if summary is not None:
        outputs.append((summary.flag, summary.path))
    for flag, target in outputs:
        # Writing the report over the results it is made from would lose them.
        if target is not None and any(os.path.realpath(target) == os.path.realpath(s.path)
                                      for s in sweeps):
            raise UsageError(f"{flag}: {os.fspath(target)!r} is the results file being reported")
    text = summary_markdown(sweeps)
    # With the markdown on stdout, where things went is said on stderr.
    status = sys.stderr if markdown == "-" else sys.stdout
    if html_path is not None:
        write_html(html_path, sweeps[0] if len(sweeps) == 1
                   else list(zip(arm_names(sweeps), sweeps, strict=True)))
        print(f"report: {html_path}", file=status)
    if markdown == "-":
        sys.stdout.write(text)
    elif md_path is not None:
        write_text_atomic(md_path, text)
        print(f"markdown: {md_path}", file=status)
    if summary is not None:
        append_text(summary.path, text)
    return 0


def findings_command(results: Sequence[str], *, fmt: str, suggest: bool = False, agent: str | None = None,
                     model: str | None = None, base_url: str | None = None, max_spend: Decimal | None = None,
                     price_file: str | None = None) -> int:
    if not suggest:
        for flag, value in (("--agent", agent), ("--model", model), ("--base-url", base_url),
                            ("--max-spend", max_spend), ("--price-file", price_file)):
            if value is not None:
                raise UsageError(f"{flag}: only with --suggest, which is what calls a model")
    saved = [s for r in results for s in load_sweep(r, label="RESULTS_DIR")]
    if len(saved) > 1 and fmt == "json":
        raise UsageError("--format json: takes one RESULTS_DIR (one arm); run it once per arm "
                         "(OUT/ARM for each arm of a sweep of several)")
    if suggest and len(saved) > 1:
        raise UsageError("--suggest: takes one RESULTS_DIR (one arm); run it once per arm "
                         "(OUT/ARM for each arm of a sweep of several)")
    names = arm_names(saved)
    # A sweep of several arms is read as its arms: the arm x task matrix, with
    # Fisher's test between each pair, comes first.
    if len(saved) > 1:
        matrix = arms_matrix([(name, s.docs_records) for name, s in zip(names, saved, strict=True)])
        sys.stdout.write(matrix_markdown(matrix) + "\n" if fmt == "markdown" else
                         matrix_text(matrix) + "\n" if fmt == "text" else "")
    for name, one in zip(names, saved, strict=True):
        report = build_report(read_runs(one), read_suggestions(one))
        if suggest:
            report = _suggest(one, report, agent=agent, model=model, base_url=base_url, max_spend=max_spend,
                              price_file=price_file)
        arm = name if len(saved) > 1 else None
        if fmt == "json":
            sys.stdout.write(json.dumps(report_data(report), indent=2) + "\n")
        elif fmt == "markdown":
            sys.stdout.write(findings_markdown(report, arm=arm))
        elif fmt == "github":
            sys.stdout.write(render_github(report))
        else:
            sys.stdout.write((f"== arm {arm} ==\n" if arm is not None else "") + render_text(report))
    return 0


def _suggest(saved: SavedResults, report: Report, *, agent: str | None, model: str | None,
             base_url: str | None, max_spend: Decimal | None, price_file: str | None) -> Report:
    """``report`` with a draft asked for each shown finding that has no current one, saved as it comes."""
    from firstrun.agents import make_agent
    from firstrun.agents.loop import LoopAgent
    from firstrun.agents.spend import SpendGovernor, load_price_file

    name, chosen = choose_model(saved.meta, [r.model for r in saved.records], agent=agent, model=model)
    drafter = make_agent(name, model=chosen, base_url=base_url,
                         price_file=load_price_file(price_file) if price_file is not None else None)
    assert isinstance(drafter, LoopAgent) and drafter.model is not None
    governor = None
    if max_spend is not None:
        if drafter.pricing is None:
            raise UsageError(f"--max-spend: no price is known for model {drafter.model!r}; "
                             "give one with --price-file")
        governor = SpendGovernor(cap=max_spend, pricing=drafter.pricing)
    if not os.access(saved.root, os.W_OK):
        raise UsageError(f"--suggest: cannot write the drafts to {saved.root / SUGGESTIONS_FILE}")
    client = drafter.new_client()
    try:
        done = draft(report, report.suggestions, agent=name, model=drafter.model, client=client,
                     pricing=drafter.pricing, governor=governor,
                     keep=lambda drafts: save_suggestions(saved.root, drafts))
    finally:
        client.close()
    for line in drafted_lines(done, model=drafter.model, cap=max_spend, path=saved.root / SUGGESTIONS_FILE):
        print(f"suggest: {line}", file=sys.stderr)
    return replace(report, suggestions=done.saved)


def arm_names(saved: Sequence[SavedResults]) -> list[str]:
    """Each sweep named by its arm, else by its agent, model and affordances; by its path too
    where two are alike."""
    names = []
    for s in saved:
        if s.arm is not None:
            names.append(s.arm)
            continue
        sweep = s.meta.get("sweep") if isinstance(s.meta.get("sweep"), dict) else {}
        parts = [s.meta.get("agent") or sweep.get("agent"), s.meta.get("model") or sweep.get("model")]
        affordances = sweep.get("affordances")
        if affordances not in (None, "none"):
            parts.append(f"affordances={affordances}")
        names.append(" ".join(str(p) for p in parts if p) or "unknown")
    return [f"{n} ({s.root})" if names.count(n) > 1 else n for n, s in zip(names, saved, strict=True)]


def findings_schema_text() -> str:
    """``firstrun schema --findings``: stable key order, newline-terminated."""
    return json.dumps(FINDINGS_SCHEMA, indent=2, sort_keys=True) + "\n"


def summary_markdown(sweeps: Sequence[SavedResults]) -> str:
    """The markdown summary (``--markdown``, ``--github-summary``): pass rates, then findings;
    of several arms, the arms matrix first, then each arm's."""
    if len(sweeps) == 1:
        saved = sweeps[0]
        return render_markdown(saved.records, meta=saved.meta) + "\n" \
            + findings_markdown(build_report(read_runs(saved), read_suggestions(saved)))
    names = arm_names(sweeps)
    parts = [matrix_markdown(arms_matrix([(n, s.records) for n, s in zip(names, sweeps, strict=True)]))]
    for name, saved in zip(names, sweeps, strict=True):
        parts += [render_markdown(saved.records, meta=saved.meta, title=f"firstrun: arm {name}"),
                  findings_markdown(build_report(read_runs(saved), read_suggestions(saved)), arm=name)]
    return "\n".join(parts)
