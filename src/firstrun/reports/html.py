"""``firstrun report``: one self-contained HTML page about a sweep, from saved results only.

Guarantee: the page needs no network and runs no code: CSS and SVG plots are
inline, it loads no font, script, image or frame, and its Content-Security-Policy
makes the browser refuse anything that would. Every string from results or traces
is escaped, characters HTML cannot carry are replaced, and only ``http``/``https``
URLs become links. Each run's narrated trace is in the page under an anchor, so a
run's link works offline.
"""

from __future__ import annotations

import html
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from firstrun import __version__
from firstrun.errors import UsageError
from firstrun.reports.analysis import (
    RouteReport,
    blocked_by_destination,
    route_report,
    run_route,
)
from firstrun.reports.findings import ArmsMatrix, Finding, arms_matrix
from firstrun.reports.findings_report import (
    Report,
    build_report,
    figures_lines,
    gap_lines,
    matrix_rows,
    pair_text,
    suggestion_head,
    suggestions_line,
)
from firstrun.reports.load import SavedResults, read_runs, read_suggestions
from firstrun.reports.narrate import Line, Style, narrate_file
from firstrun.reports.output import write_text_atomic
from firstrun.reports.suggestions import Suggestion
from firstrun.reports.summary import ORDER
from firstrun.results.model import EVIDENTIAL, Classification, RunRecord
from firstrun.results.mutation import TaskScore, Verdict, is_mutant, mutation_scores
from firstrun.results.stats import PassRate, pass_rate
from firstrun.tasks.allowlist import AllowEntries, allow_snippet

# The plot's own colour, and the findings' edge: each used by nothing else on
# the page, so a screenshot can find the plot and the findings.
PLOT_COLOUR = "#1f6feb"
FINDING_COLOUR = "#8250df"

_NOT_HTML = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff]")

# default-src 'none' (inline styles only): the browser refuses any load the page
# would make.
CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


# The one escaping path: markup is built only by _el from constant tag and
# attribute names, and text reaches it only as str, which is always escaped;
# characters HTML cannot carry are replaced, never written raw.
class Markup(str):
    """HTML this module built; the only ``str`` that ``_el`` does not escape."""


Child = Markup | str | int | float | None | Iterable["Child"]


def _text(value: object) -> Markup:
    return Markup(html.escape(_NOT_HTML.sub("\ufffd", str(value)), quote=True))


def _children(children: Iterable[Child]) -> str:
    out = []
    for child in children:
        if child is None:
            continue
        if isinstance(child, Markup):
            out.append(child)
        elif isinstance(child, str | int | float):
            out.append(_text(child))
        else:
            out.append(_children(child))
    return "".join(out)


def _el(tag: str, attrs: Mapping[str, object] | None = None, *children: Child) -> Markup:
    attributes = "".join(
        f' {name}="{_text(value)}"' for name, value in (attrs or {}).items() if value is not None
    )
    return Markup(f"<{tag}{attributes}>{_children(children)}</{tag}>")


# Only http/https URLs become links; anything else is shown as code.
def _link(url: str | None) -> Markup:
    if not url:
        return _text("")
    if urlsplit(url).scheme in ("http", "https"):
        return _el("a", {"href": url, "rel": "noreferrer"}, url)
    return _el("code", None, url)


def _pct(value: float) -> str:
    return f"{value:.0%}"


# --- the plot ---------------------------------------------------------------

_W, _H, _PAD = 360, 58, 18


def _x(value: float) -> float:
    return round(_PAD + value * (_W - 2 * _PAD), 2)


def rate_plot(rate: PassRate) -> Markup:
    """The pass rate as a point with its Wilson interval as a bar, on a 0-100% axis."""
    axis_y = 40
    parts: list[Markup] = [
        _el("line", {"x1": _x(0), "y1": axis_y, "x2": _x(1), "y2": axis_y, "class": "axis"}),
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1):
        parts.append(_el("line", {"x1": _x(tick), "y1": axis_y, "x2": _x(tick), "y2": axis_y + 4,
                                  "class": "axis"}))
        parts.append(_el("text", {"x": _x(tick), "y": axis_y + 15, "text-anchor": "middle",
                                  "class": "tick"}, _pct(tick)))
    if rate.rate is None or rate.interval is None:
        label = "no evidence: no run could judge the docs"
        parts.append(_el("text", {"x": _x(0.5), "y": 22, "text-anchor": "middle", "class": "none"}, label))
    else:
        ci, y = rate.interval, 20
        label = (f"pass rate {_pct(rate.rate)} ({rate.passed}/{rate.evidential}), "
                 f"{_pct(ci.confidence)} Wilson interval {_pct(ci.low)} to {_pct(ci.high)}")
        parts += [
            _el("line", {"x1": _x(ci.low), "y1": y, "x2": _x(ci.high), "y2": y, "stroke": PLOT_COLOUR,
                         "stroke-width": 3}),
            _el("line", {"x1": _x(ci.low), "y1": y - 7, "x2": _x(ci.low), "y2": y + 7, "stroke": PLOT_COLOUR,
                         "stroke-width": 2}),
            _el("line", {"x1": _x(ci.high), "y1": y - 7, "x2": _x(ci.high), "y2": y + 7,
                         "stroke": PLOT_COLOUR, "stroke-width": 2}),
            _el("circle", {"cx": _x(rate.rate), "cy": y, "r": 6, "fill": PLOT_COLOUR}),
        ]
    return _el("svg", {"xmlns": "http://www.w3.org/2000/svg", "class": "plot", "width": _W, "height": _H,
                       "viewBox": f"0 0 {_W} {_H}", "role": "img", "aria-label": label},
               _el("title", None, label), parts)


# --- sections ---------------------------------------------------------------

def _badge(classification: Classification) -> Markup:
    return _el("span", {"class": f"badge {classification.value}"}, classification.value)


def _table(head: Sequence[str], rows: Iterable[Sequence[Child]], *, cls: str | None = None) -> Markup:
    return _el("table", {"class": cls},
               _el("thead", None, _el("tr", None, [_el("th", None, h) for h in head])),
               _el("tbody", None, [_el("tr", None, [_el("td", None, c) for c in row]) for row in rows]))


def _rate_cell(rate: PassRate) -> Markup:
    if rate.rate is None or rate.interval is None:
        return _el("span", {"class": "none"}, "no evidence")
    return _text(rate.text())


def _classification_table(rate: PassRate) -> Markup:
    counts = {Classification.PASSED: rate.passed, Classification.DOCS_GAP: rate.docs_gap, **rate.not_evidential}
    rows = [
        [_badge(c), counts[c], "evidence about the docs" if c in EVIDENTIAL else "could not judge the docs"]
        for c in ORDER if counts.get(c)
    ]
    return _table(["classification", "runs", ""], rows, cls="counts")


def _route_section(report: RouteReport) -> Markup:
    if not report.pages:
        return _el("p", {"class": "dim"}, "No run read any docs page.")
    intro: list[Child] = []
    if not report.route:
        intro.append(_el("p", {"class": "dim"},
                         "The documented route was not recorded with these runs (results from an older "
                         "firstrun): pages read are listed, but not set against the route."))
    elif report.route_varies:
        intro.append(_el("p", {"class": "warn"},
                         "The documented route changed between these runs; the latest run's route is shown."))
    summary = [f"{report.left_route} of {report.runs} run{'s' if report.runs != 1 else ''} left the route"]
    if report.left_before_route:
        summary.append(f"{report.left_before_route} before reading any route page")
    if report.failures:
        summary.append(f"{report.failures} docs gap{'s' if report.failures != 1 else ''}")
    if report.failures_without_page:
        summary.append(f"{report.failures_without_page} with no page read before the failure")
    intro.append(_el("p", None, "; ".join(summary) + "."))
    rows = []
    for page in report.pages:
        where = (_el("span", {"class": "route"}, f"route {page.position}") if page.position is not None
                 else _el("span", {"class": "off"}, "off route" if report.route else "page"))
        rows.append([
            where, _link(page.url), f"{page.read_by}/{report.runs}",
            page.not_read or "", page.left_route_after or "",
            _el("strong", None, page.last_before_failure) if page.last_before_failure else "",
        ])
    return _el("div", None, intro, _table(
        ["", "page", "read by", "could not be read", "left the route after it", "last page before a docs gap"],
        rows, cls="routes"))


def _blocked_section(records: Sequence[RunRecord]) -> Markup:
    groups = blocked_by_destination(records)
    if not groups:
        return _el("p", {"class": "dim"}, "No egress was blocked.")
    rows = [
        [_el("code", None, g.destination), g.attempts, g.runs, ", ".join(g.channels),
         ", ".join(f"{reason} \u00d7{n}" for reason, n in g.reasons)]
        for g in groups
    ]
    return _table(["destination", "attempts", "runs", "channel", "reasons"], rows, cls="blocked")


def _pages_cell(record: RunRecord, route: Sequence[str]) -> Markup:
    walk = run_route(record, route)
    items = []
    for i, (url, off) in enumerate(zip(walk.pages, walk.off_route, strict=True)):
        cls = "off" if off else None
        title = "left the documented route here" if walk.left_at == i else None
        items.append(_el("li", {"class": cls, "title": title}, url))
    return _el("ol", {"class": "pages"}, items) if items else _el("span", {"class": "dim"}, "none")


def _detail_cell(record: RunRecord) -> Markup | str:
    if record.classification is not Classification.BLOCKED or not record.allow_fix:
        return record.detail
    snippet = allow_snippet(AllowEntries.from_data(record.allow_fix))
    return _el("div", None, [record.detail, _el("div", {"class": "dim"},
                                                "the task lines that would allow it:"),
                             _el("pre", None, snippet)])


def _runs_table(records: Sequence[tuple[int, RunRecord]], route: Sequence[str],
                prefix: str = "") -> Markup:
    rows = []
    for index, r in records:
        agent = r.agent + (f" ({r.model})" if r.model else "")
        enforcement = _el("span", {"class": "warn" if r.enforcement != "enforced" else None},
                          r.enforcement or "none")
        check = _el("span", {"class": "warn", "title": "the agent's processes ran beside the "
                             "check (wait_http with no serve), so it could be forged"}, "shared") \
            if r.check_isolation == "shared" else (r.check_isolation or "")
        rows.append([
            _el("a", {"href": f"#{prefix}run-{index}"}, f"#{r.attempt}"), _badge(r.classification), r.reason,
            r.backend or "none", enforcement, check, agent, f"{r.duration_s:.1f}s",
            _pages_cell(r, route),
            _link(r.last_page_before_failure) if r.last_page_before_failure else "",
            _detail_cell(r),
        ])
    return _table(["run", "classification", "reason", "backend", "enforcement", "check", "agent",
                   "time",
                   "pages read (in order; off the route marked)", "last page before the failure", "detail"],
                  rows, cls="runs")


def _task_section(number: int, task: str, runs: Sequence[tuple[int, RunRecord]],
                  prefix: str = "") -> Markup:
    records = [r for _, r in runs]
    rate = pass_rate(records, task=task)
    route = route_report(records)
    files = sorted({r.task_file for r in records})
    return _el(
        "section", {"id": f"{prefix}task-{number}", "class": "task"},
        _el("h2", None, task),
        _el("p", {"class": "dim"}, "task file: ", ", ".join(files)),
        _el("div", {"class": "rate"}, rate_plot(rate),
            _el("div", None, _el("p", {"class": "big"}, _rate_cell(rate)),
                _el("p", {"class": "dim"},
                    "Over evidential runs only (passed, docs_gap); ",
                    f"{rate.not_evidential_runs} run{'s' if rate.not_evidential_runs != 1 else ''} "
                    "could not judge the docs and are counted apart."))),
        _el("h3", None, "Runs by classification"), _classification_table(rate),
        _el("h3", None, "Documented route against the pages read"), _route_section(route),
        _el("h3", None, "Blocked egress"), _blocked_section(records),
        _el("h3", None, "Runs"), _runs_table(runs, route.route, prefix),
    )


_LINE_CLASSES = {Style.HEADING: "h", Style.OK: "ok", Style.BAD: "bad", Style.DIM: "dim", Style.PLAIN: None}


def _narration(saved: SavedResults, record: RunRecord) -> Markup:
    path = saved.trace_path(record)
    if path is None:
        why = ("this run has no trace" if not record.trace
               else f"trace path {record.trace!r} leads outside the results directory; not read")
        return _el("p", {"class": "warn"}, why)
    try:
        lines: list[Line] = narrate_file(path)
    except UsageError as exc:
        return _el("p", {"class": "warn"}, exc.args[0])
    return _el("pre", {"class": "trace"},
               [_el("span", {"class": _LINE_CLASSES[line.style]}, line.text, "\n") for line in lines])


def _trace_section(saved: SavedResults, runs: Sequence[tuple[int, RunRecord]],
                   prefix: str = "") -> Markup:
    items = []
    for index, r in runs:
        items.append(_el(
            "details", {"id": f"{prefix}run-{index}"},
            _el("summary", None, f"{r.task} #{r.attempt} ", _badge(r.classification), f" {r.reason}"),
            _el("p", {"class": "dim"}, "trace: ", r.trace or "none"),
            _narration(saved, r),
        ))
    return _el("section", {"id": f"{prefix}traces"}, _el("h2", None, "Narrated traces"), items)


def _finding(f: Finding, anchors: Mapping[str, int], suggestion: Suggestion | None,
             prefix: str = "") -> Markup:
    runs = [[_el("a", {"href": f"#{prefix}run-{anchors[run]}"}, run) if run in anchors else run, " "] for run in f.runs]
    body: list[Child] = []
    if f.block_text:
        body += [_el("p", None, f"block {f.block} of ", _link(f.page)),
                 _el("pre", {"class": "trace"}, f.block_text)]
    body.append(_el("p", None, "runs: ", runs))
    for e in f.evidence:
        body.append(_el("pre", {"class": "trace"}, f"{e.run} (exit {e.exit_code}): $ {e.command}\n",
                        _el("span", {"class": "dim"}, e.output_tail)))
    if f.claims:
        body.append(_el("p", {"class": "dim"}, "what the agents said:"))
        body.append(_el("ul", {"class": "claims"}, [_el("li", None, _el("q", None, c)) for c in f.claims]))
    if suggestion is not None:
        body.append(_el("div", {"class": "suggestion"}, _el("p", None, suggestion_head(f, suggestion)),
                        _el("pre", {"class": "trace"}, suggestion.text) if suggestion.text else ""))
    return _el("details", {"class": f"finding {f.kind.value}"}, _el("summary", None, f.headline()), body)


# Findings come first, ranked, each a details element holding its evidence (and a
# saved suggested change, as text like any other) and linking its runs.
def _findings_section(report: Report, records: Sequence[RunRecord], prefix: str = "") -> Markup:
    anchors: dict[str, int] = {}
    for index, r in enumerate(records):
        anchors.setdefault(f"{r.task} #{r.attempt}", index)
    items: list[Child] = [_el("ul", {"class": "figures"}, [_el("li", None, line)
                                                            for line in figures_lines(report.sweep)])]
    if (said := suggestions_line(report)) is not None:
        items.append(_el("p", {"class": "dim"}, said))
    for t in report.tasks:
        items.append(_el("h3", None, t.task))
        ranked = [_finding(f, anchors, report.suggestions.get(f.key), prefix) for f in t.findings]
        items.append(_el("ol", {"class": "findings"}, [_el("li", None, f) for f in ranked])
                     if ranked else _el("p", {"class": "none"}, "No findings."))
        items += [_el("p", {"class": "warn"}, line) for line in gap_lines(t)]
    return _el("section", {"id": f"{prefix}findings"}, _el("h2", None, "Findings"), items)


def _overview(tasks: Sequence[tuple[int, str, list[tuple[int, RunRecord]]]],
              records: Sequence[RunRecord], prefix: str = "") -> Markup:
    rows = []
    for number, task, runs in tasks:
        rate = pass_rate([r for _, r in runs], task=task)
        rows.append([_el("a", {"href": f"#{prefix}task-{number}"}, task), rate.runs, rate.passed, rate.docs_gap,
                     rate.not_evidential_runs, _rate_cell(rate)])
    total = pass_rate(records)
    rows.append([_el("strong", None, "all tasks"), total.runs, total.passed, total.docs_gap,
                 total.not_evidential_runs, _rate_cell(total)])
    return _table(["task", "runs", "passed", "docs_gap", "could not judge", "pass rate (evidential runs)"],
                  rows, cls="overview")


def _mutation_section(scores: Sequence[TaskScore]) -> Markup | str:
    """``firstrun mutate``'s scores, and each mutant with its verdict and why."""
    if not scores:
        return ""
    rows = [[score.task, score.count(Verdict.KILLED), score.count(Verdict.SURVIVED),
             score.count(Verdict.NOT_RUN), score.score_text() + (f": {score.why_none}" if score.why_none else "")]
            for score in scores]
    mutants = [[m.name, m.verdict.value, m.describe(), m.reason] for s in scores for m in s.mutants]
    return Markup("").join([
        _el("h2", None, "Mutation scores"),
        _el("p", {"class": "dim"}, "Each mutant replays the task with one documented step removed, or one "
            "version pin made impossible; a mutant the check lets pass survived."),
        _table(["task", "killed", "survived", "not run", "score"], rows, cls="overview"),
        _table(["mutant", "verdict", "change", "why"], mutants, cls="runs") if mutants else "",
    ])


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1f2328;margin:24px auto;
max-width:1200px;padding:0 16px;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:4px 0 8px}th,td{border:1px solid #d0d7de;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f6f8fa;font-weight:600}
td{overflow-wrap:anywhere}.runs td{max-width:360px}
.dim{color:#656d76}.warn{color:#9a6700}.none{color:#9a6700;font-style:italic}
.big{font-size:16px;font-weight:600;margin:4px 0}
.rate{display:flex;gap:16px;align-items:center}.plot .axis{stroke:#8c959f;stroke-width:1}
.plot .tick{font-size:10px;fill:#656d76}.plot .none{font-size:12px;fill:#9a6700}
.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px;background:#eaeef2}
.badge.passed{background:#dafbe1;color:#116329}.badge.docs_gap{background:#ffebe9;color:#a40e26}
.route{color:#116329}.off{color:#a40e26;font-weight:600}
ol.pages{margin:0;padding-left:20px}ol.pages li.off::after{content:" (off route)";font-weight:400}
details{border:1px solid #d0d7de;border-radius:4px;margin:6px 0;padding:4px 8px}
details:target{outline:2px solid #9a6700}summary{cursor:pointer}
pre.trace{font:12px/1.35 ui-monospace,"DejaVu Sans Mono",monospace;white-space:pre-wrap;
overflow-wrap:anywhere;margin:6px 0}
ol.findings{padding-left:20px}div.suggestion{border-left:2px dashed #656d76;padding-left:8px}
details.finding{border-left:4px solid """ + FINDING_COLOUR + """}
pre .h{font-weight:700}pre .ok{color:#116329}pre .bad{color:#a40e26;font-weight:600}pre .dim{color:#656d76}
"""


def _grouped(saved: SavedResults) -> list[tuple[int, str, list[tuple[int, RunRecord]]]]:
    """The sweep's tasks, numbered, each with its (index, record) runs."""
    grouped: dict[str, list[tuple[int, RunRecord]]] = {}
    for index, record in enumerate(saved.records):
        # A mutant's run judges the task's check, not the docs: scored apart, never a pass rate.
        if not is_mutant(record):
            grouped.setdefault(record.task, []).append((index, record))
    return [(n, task, runs) for n, (task, runs) in enumerate(grouped.items(), start=1)]


def _sweep_body(saved: SavedResults, prefix: str = "") -> list[Child]:
    """Findings first, then the overview, mutation scores, each task and every narrated trace."""
    if not saved.records:
        return [_el("p", {"class": "none"}, "No run finished: there is nothing to report.")]
    tasks = _grouped(saved)
    return [_findings_section(build_report(read_runs(saved), read_suggestions(saved)), saved.records, prefix),
            _el("h2", None, "Overview"),
            _overview(tasks, [r for _, _, runs in tasks for _, r in runs], prefix),
            _mutation_section(mutation_scores(saved.records, saved.meta.get("mutated") or ())),
            [_task_section(n, task, runs, prefix) for n, task, runs in tasks],
            _trace_section(saved, list(enumerate(saved.records)), prefix)]


def _arms_section(matrix: ArmsMatrix) -> Markup:
    """The arm x task matrix of pass rates (Wilson intervals), and Fisher's test per pair."""
    header, *rows = matrix_rows(matrix)
    return _el("section", {"id": "arms"}, _el("h2", None, "Arms"),
               _el("p", {"class": "dim"}, "Pass rate over evidential runs, with a 95% Wilson interval."),
               _table(header, [[_el("a", {"href": f"#arm-{i}"}, row[0]), *row[1:]]
                               for i, row in enumerate(rows, start=1)], cls="overview"),
               _el("h3", None, "Fisher's exact test per task between each pair of arms"),
               _el("ul", None, [_el("li", None, pair_text(pair, matrix)) for pair in matrix.pairs]))


def _page(header: Markup, body: Sequence[Child]) -> str:
    head = Markup(
        '<meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_text(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
    )
    page = _el("html", {"lang": "en"},
               _el("head", None, head, _el("title", None, "firstrun report"), _el("style", None, Markup(_CSS))),
               _el("body", None, header, body))
    return "<!DOCTYPE html>\n" + page + "\n"


def _rendered(when: str, paths: Sequence[Path]) -> Markup:
    return _el("p", {"class": "dim"}, f"Rendered {when} by firstrun {__version__} from ",
               [[_el("code", None, os.fspath(p)), " "] for p in paths], "only.")


def render_html(saved: SavedResults, *, generated_at: datetime | None = None) -> str:
    """The whole page for ``saved``."""
    tasks = _grouped(saved)
    meta = saved.meta
    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    agent = " ".join(str(v) for v in (meta.get("agent"), meta.get("model")) if v) or "unknown"
    backends = Counter(f"{r.backend or 'none'} ({r.enforcement or 'none'})" for r in saved.records)
    header = _el(
        "header", None,
        _el("h1", None, "firstrun report"),
        _el("p", {"class": "dim"},
            f"{len(saved.records)} run{'s' if len(saved.records) != 1 else ''} of {len(tasks)} "
            f"task{'s' if len(tasks) != 1 else ''}; agent {agent}; started {meta.get('started_at') or 'unknown'}; "
            f"backend (enforcement): {', '.join(f'{k} x{n}' for k, n in backends.items()) or 'none'}"),
        _rendered(when, [saved.path]),
    )
    return _page(header, _sweep_body(saved))


def render_arms_html(arms: Sequence[tuple[str, SavedResults]], *,
                     generated_at: datetime | None = None) -> str:
    """One page for a sweep of several arms: the arms matrix, then each arm's report."""
    # The matrix has Fisher's test between each pair of arms; each arm's anchors
    # are prefixed so no two arms share one.
    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    runs = sum(len(s.records) for _, s in arms)
    header = _el("header", None, _el("h1", None, "firstrun report"),
                 _el("p", {"class": "dim"}, f"{len(arms)} arms, {runs} run{'s' if runs != 1 else ''}."),
                 _rendered(when, [s.path for _, s in arms]))
    body: list[Child] = [_arms_section(arms_matrix([(name, s.records) for name, s in arms]))]
    for i, (name, saved) in enumerate(arms, start=1):
        agent = " ".join(str(v) for v in (saved.meta.get("agent"), saved.meta.get("model")) if v)
        body.append(_el("section", {"id": f"arm-{i}", "class": "arm"},
                        _el("h1", None, f"Arm {name}"),
                        _el("p", {"class": "dim"}, f"agent {agent or 'unknown'}; started "
                            f"{saved.meta.get('started_at') or 'unknown'}; results ",
                            _el("code", None, os.fspath(saved.path))),
                        _sweep_body(saved, prefix=f"arm-{i}-")))
    return _page(header, body)


def write_html(path: str | os.PathLike[str],
               saved: SavedResults | Sequence[tuple[str, SavedResults]]) -> None:
    """Write the page (of one sweep, or of several named arms) to ``path``, atomically."""
    write_text_atomic(Path(path), render_html(saved) if isinstance(saved, SavedResults)
                      else render_arms_html(saved))
