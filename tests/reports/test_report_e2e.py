"""A real sweep of a bundled example, then its step summary and its HTML report in Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chromium_support import plot_pixels, render
from report_support import firstrun


@pytest.mark.e2e
def test_real_run_summary_and_report(tmp_path: Path) -> None:
    out, summary = tmp_path / "results", tmp_path / "step_summary"
    run = firstrun("run", "--example", "python-tabulate", "--out", str(out), "--github-summary-file", str(summary))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| python-tabulate | 1 | 1 | 0 | 0 | 1/1 (100%; 95% CI 21%\u2013100%) |" in summary.read_text()
    assert "## Findings" in summary.read_text()
    (saved,) = json.loads((out / "results.json").read_text())["runs"]
    route = saved["docs_route"]
    assert route and [p["url_requested"] for p in saved["pages"]] == route

    page = tmp_path / "report.html"
    report = firstrun("report", str(out), "--out", str(page))
    assert report.returncode == 0, report.stderr
    text = page.read_text()
    for position, url in enumerate(route, start=1):
        assert f"route {position}</span></td><td><a href=\"{url}\"" in text
    assert "classification: passed (passed)" in text and 'id="run-0"' in text
    image, console = render(page, tmp_path)
    assert console == []
    assert plot_pixels(image) > 100
