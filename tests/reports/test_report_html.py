"""The HTML report, read back with an HTML parser: escaped, self-contained, complete."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_support import HOSTILE, ROUTE, page, record, runs, write_results

from firstrun.errors import UsageError
from firstrun.reports.html import PLOT_COLOUR, render_html
from firstrun.reports.load import load_saved
from firstrun.results.model import Classification

pytestmark = pytest.mark.fast


class Page(HTMLParser):
    """Every element with its attributes, and the page's text as a browser would show it."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.chunks: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def tags(self, name: str) -> list[dict[str, str | None]]:
        return [attrs for tag, attrs in self.elements if tag == name]


def _hostile_results(tmp_path: Path) -> Path:
    evil_url = f"javascript:alert(1)//{HOSTILE}"
    records = [
        record(HOSTILE, 1, Classification.DOCS_GAP, detail=HOSTILE, reason=HOSTILE,
               task_file=HOSTILE, docs_route=(*ROUTE, evil_url),
               pages=(page(ROUTE[0]), page(evil_url), page(f"https://docs.test/{HOSTILE}")),
               last_page_before_failure=evil_url,
               blocked_egress=({"host": HOSTILE, "port": 443, "reason": HOSTILE, "channel": "shell"},)),
        record(HOSTILE, 2, Classification.PASSED, backend=HOSTILE, enforcement=HOSTILE),
    ]
    return write_results(tmp_path / "res", records)


def test_every_string_from_results_is_escaped(tmp_path: Path) -> None:
    out = _hostile_results(tmp_path)
    text = render_html(load_saved(out, label="RESULTS_DIR"))
    parsed = Page(text)
    # Nothing hostile became markup: no script, no image, no event handler, no script URL.
    assert parsed.tags("script") == [] and parsed.tags("img") == []
    assert not [a for _, attrs in parsed.elements for a in attrs if a.startswith("on")]
    assert not [a for a in parsed.tags("a") if (a.get("href") or "").lower().startswith("javascript")]
    # ... and it is all shown, as text, where it belongs.
    assert parsed.text.count(HOSTILE) >= 8
    assert "javascript:alert(1)//" in parsed.text


def test_control_characters_never_reach_the_page(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", [record("t", 1, Classification.DOCS_GAP, detail="a\x1b[31mb\x00c\x07")],
                        traces=False)
    text = render_html(load_saved(out, label="RESULTS_DIR"))
    assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
    assert "a\ufffd[31mb\ufffdc\ufffd" in Page(text).text


def test_self_contained_and_locked_down(tmp_path: Path) -> None:
    text = render_html(load_saved(_hostile_results(tmp_path), label="RESULTS_DIR"))
    parsed = Page(text)
    loaders = [(tag, attrs) for tag, attrs in parsed.elements
               if tag in ("script", "link", "img", "iframe", "object", "embed", "image", "use")
               or "src" in attrs or "srcset" in attrs]
    assert loaders == []
    (style,) = [t for t in text.split("<style>")[1:]]
    assert "@import" not in style and "url(" not in style
    csp = [a for a in parsed.tags("meta") if a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and (csp[0]["content"] or "").startswith("default-src 'none'")


def test_every_run_links_to_its_narrated_trace_in_the_page(tmp_path: Path) -> None:
    records = [*runs("alpha", 2, 1), *runs("beta", 0, 1)]
    out = write_results(tmp_path / "res", records)
    parsed = Page(render_html(load_saved(out, label="RESULTS_DIR")))
    targets = {a["id"] for a in parsed.tags("details") if (a.get("id") or "").startswith("run-")}
    links = [a["href"] for a in parsed.tags("a") if (a.get("href") or "").startswith("#run-")]
    # Each run once from the runs table, and each failed run again from its finding.
    assert len(links) == len(records) + 2 and len(targets) == len(records)
    assert {link[1:] for link in links} == targets
    # The narration itself is there: each run's command and classification, as narrate tells them.
    assert parsed.text.count("[agent] $ pip install tabulate") == len(records)
    assert parsed.text.count("classification: docs_gap (check_failed)") == 2


def test_trace_outside_the_results_directory_is_not_read(tmp_path: Path) -> None:
    canary = tmp_path / "secret.jsonl"
    canary.write_text('{"kind": "run_started", "task": "CANARY-SECRET"}\n')
    out = write_results(tmp_path / "res", [record("t", 1, Classification.PASSED, trace="../secret.jsonl")],
                        traces=False)
    text = Page(render_html(load_saved(out, label="RESULTS_DIR"))).text
    assert "CANARY-SECRET" not in text
    assert "leads outside the results directory" in text


def test_missing_trace_is_said_not_fatal(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", [record("t", 1, Classification.PASSED)], traces=False)
    text = Page(render_html(load_saved(out, label="RESULTS_DIR"))).text
    assert "no such trace" in text


def test_plot_point_and_interval_or_no_evidence_in_words(tmp_path: Path) -> None:
    out = write_results(tmp_path / "res", [*runs("some", 3, 1), record("none", 1, Classification.INFRA_ERROR)],
                        traces=False)
    text = render_html(load_saved(out, label="RESULTS_DIR"))
    parsed = Page(text)
    svgs = parsed.tags("svg")
    assert len(svgs) == 2
    assert len(parsed.tags("circle")) == 1 and parsed.tags("circle")[0]["fill"] == PLOT_COLOUR
    # 3/4 passed: Wilson 95% 30.1%-95.4% (the point at 75%), in the plot's accessible label.
    assert svgs[0]["aria-label"] == "pass rate 75% (3/4), 95% Wilson interval 30% to 95%"
    assert svgs[1]["aria-label"] == "no evidence: no run could judge the docs"
    assert "3/4 passed (75%, 95% CI 30%-95%)" in parsed.text
    assert "1 run could not judge the docs" in parsed.text


def test_route_departures_failures_blocked_egress_and_enforcement(tmp_path: Path) -> None:
    off = "https://elsewhere.test/blog"
    records = [
        record("t", 1, Classification.DOCS_GAP, pages=(page(ROUTE[0]), page(ROUTE[1]), page(off)),
               last_page_before_failure=off,
               blocked_egress=({"host": "evil.test", "port": 443, "reason": "not_allowed", "channel": "shell"},
                               {"host": "evil.test", "port": 443, "reason": "not_allowed", "channel": "shell"},
                               {"host": "169.254.169.254", "port": 80, "reason": "metadata", "channel": "shell"})),
        record("t", 2, Classification.DOCS_GAP, pages=(page(ROUTE[0]), page(ROUTE[1], error="http_error")),
               last_page_before_failure=ROUTE[0],
               route_findings=({"url": ROUTE[1], "error": "http_error", "status": 404, "detail": ""},),
               blocked_egress=({"host": "evil.test", "port": 443, "reason": "not_allowed", "channel": "shell"},)),
        record("t", 3, Classification.PASSED, backend="local", enforcement="unenforced"),
    ]
    out = write_results(tmp_path / "res", records)
    html_text = render_html(load_saved(out, label="RESULTS_DIR"))
    rows = _table_rows(html_text, "routes")
    assert rows == [
        ["route 1", ROUTE[0], "3/3", "", "", "1"],
        ["route 2", ROUTE[1], "3/3", "1", "1", ""],
        ["route 3", ROUTE[2], "1/3", "", "", ""],
        ["off route", off, "1/3", "", "", "1"],
    ]
    assert _table_rows(html_text, "blocked") == [
        ["evil.test:443", "3", "2", "shell", "not_allowed \u00d73"],
        ["169.254.169.254:80", "1", "1", "shell", "metadata \u00d71"],
    ]
    runs_rows = _table_rows(html_text, "runs")
    assert [(r[3], r[4]) for r in runs_rows] == [("linux", "enforced"), ("linux", "enforced"),
                                                ("local", "unenforced")]
    assert "1 of 3 runs left the route" in Page(html_text).text
    # The run that left the route has the page marked where it left.
    parsed = Page(html_text)
    assert [a.get("title") for a in parsed.tags("li") if a.get("class") == "off"] == ["left the documented route here"]


def _table_rows(text: str, cls: str) -> list[list[str]]:
    """The body cells (as text) of the first table of class ``cls``."""

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.depth = 0
            self.in_body = False
            self.rows: list[list[str]] = []
            self.cell: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "table" and dict(attrs).get("class") == cls and not self.rows and self.depth == 0:
                self.depth = 1
            elif self.depth and tag == "table":
                self.depth += 1
            elif self.depth == 1 and tag == "tbody":
                self.in_body = True
            elif self.depth == 1 and self.in_body and tag == "tr":
                self.rows.append([])
            elif self.depth == 1 and self.in_body and tag == "td":
                self.cell = []

        def handle_endtag(self, tag: str) -> None:
            if self.depth and tag == "table":
                self.depth -= 1
                if self.depth == 0:
                    self.in_body = False
            elif self.depth == 1 and tag == "td" and self.cell is not None:
                self.rows[-1].append("".join(self.cell).strip())
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell.append(data)

    parser = Rows()
    parser.feed(text)
    return parser.rows


def test_unreadable_results_are_one_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="RESULTS_DIR: .* holds no results.json"):
        load_saved(tmp_path, label="RESULTS_DIR")
    (tmp_path / "results.json").write_text('{"schema_version": 1, "runs": [{"task": "t"}]}')
    with pytest.raises(UsageError, match="run 1 is not a run record"):
        load_saved(tmp_path / "results.json", label="RESULTS_DIR")
