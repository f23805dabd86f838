"""The HTML report in a real headless Chromium (Debian's ``chromium``), with no network at all.

The page runs no script, so it must log nothing at all to the console; a
control page that does log proves the scan sees console lines here. The
screenshot is judged by its pixels: the plot's colour and the findings'
edge are each used by nothing else on the page, a control report with no
plot and no finding shows none of either, and the findings are drawn above
the first plot.
"""

from __future__ import annotations

from pathlib import Path

from chromium_support import WINDOW, finding_pixels, plot_pixels, render, top_row
from report_support import HOSTILE, record, runs, write_results

from firstrun.reports.findings_report import build_report
from firstrun.reports.html import FINDING_COLOUR, write_html
from firstrun.reports.load import load_saved, read_runs
from firstrun.reports.suggest import save_suggestions, shown
from firstrun.reports.suggestions import Status, Suggestion
from firstrun.results.model import Classification


def test_console_scan_sees_a_page_that_logs(tmp_path: Path) -> None:
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>c</title></head>'
                       '<body><p>control</p><script>console.error("control-error")</script></body></html>')
    _, console = render(control, tmp_path)
    assert any("control-error" in line for line in console), console


def test_report_renders_without_console_errors_and_shows_the_plot(tmp_path: Path) -> None:
    records = [
        *runs("python-quickstart", 3, 1),
        record(HOSTILE, 1, Classification.DOCS_GAP, detail=HOSTILE,
               blocked_egress=({"host": HOSTILE, "port": 443, "reason": "not_allowed", "channel": "shell"},)),
        record(HOSTILE, 2, Classification.INFRA_ERROR),
    ]
    out = write_results(tmp_path / "res", records)
    # A drafted suggestion is text from a model, as hostile as any run's.
    first = shown(build_report(read_runs(load_saved(out, label="RESULTS_DIR"))))[0]
    save_suggestions(out, {first.key: Suggestion(
        finding=first.key, status=Status.DRAFTED, text=HOSTILE, error=None, agent="claude", model=HOSTILE,
        input_tokens=1, output_tokens=1, spend_usd=None, price_source=None, inputs_sha256="0" * 64,
        drafted_at="2026-01-01T00:00:00+00:00")})
    page = tmp_path / "report.html"
    write_html(page, load_saved(out, label="RESULTS_DIR"))
    assert "suggested change (drafted by" in page.read_text()
    image, console = render(page, tmp_path)
    # The page runs no script and loads nothing: a CSP refusal, an injected
    # script's output or a failed load would each be a console line.
    assert console == []
    assert image.size == WINDOW
    lo, hi = zip(*image.getextrema(), strict=True)
    assert max(hi) - min(lo) > 100, "the screenshot is blank"
    # Two plots (a point and an interval bar each) are in the first screenful.
    assert plot_pixels(image) > 200
    # Findings come first: their edges are drawn above the first plot.
    findings_top, plot_top = top_row(image, FINDING_COLOUR), top_row(image)
    assert findings_top is not None and plot_top is not None and findings_top < plot_top


def test_a_report_without_evidence_draws_no_plot_colour(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", [record("t", 1, Classification.INFRA_ERROR)])
    page = tmp_path / "none.html"
    write_html(page, load_saved(out, label="RESULTS_DIR"))
    image, console = render(page, tmp_path)
    assert console == []
    assert plot_pixels(image) == 0
    # Nor any finding: a run that could not judge the docs is no finding's evidence.
    assert finding_pixels(image) == 0
