"""A results directory holding a sweep of several arms, as reports read it: the arm x task
matrix with Fisher's test between each pair first, then each arm (Fisher's p worked by hand),
one HTML page whose every anchor is its own, and a one-line refusal where one sweep is needed.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from chromium_support import render
from report_support import firstrun, runs, write_results

from firstrun.cli.report import summary_markdown
from firstrun.errors import UsageError
from firstrun.reports.html import render_arms_html
from firstrun.reports.load import load_saved, load_sweep
from firstrun.results.arms import Arm, write_arms

# 5/5 against 1/5 (6 passes in 10 runs, 5 a side): the tables as likely or less as the one
# seen are 5 passes on one side or the other, C(6,5)C(4,0) = C(6,1)C(4,4) = 6 of C(10,5) =
# 252 each, so p = 12/252 = 0.04762, below alpha 0.05. 5/5 against 5/5: p = 1.
P_SIGNIFICANT = "0.04762"


def _sweep(out: Path) -> Path:
    """Three arms (a 5/5, b 1/5, c 5/5) on one task, written as a sweep of several arms."""
    arms = [Arm(name=n, agent="openai", model=n, affordances="all") for n in ("a", "b", "c")]
    for arm, (passed, gaps) in zip(arms, [(5, 0), (1, 4), (5, 0)], strict=True):
        write_results(out / arm.name, runs("quickstart", passed, gaps, agent="openai", model=arm.model),
                      meta={"agent": "openai", "model": arm.model, "arm": arm.name})
    write_arms(out, arms)
    return out


def test_findings_of_a_sweep_of_arms_put_the_matrix_and_each_pair_first(tmp_path: Path) -> None:
    out = _sweep(tmp_path / "out")
    done = firstrun("findings", str(out))
    assert done.returncode == 0, done.stderr
    head = done.stdout[:done.stdout.index("== arm a ==")]
    assert head.startswith("arms (pass rate")
    assert "  a    5/5 (100%, CI 57%-100%)" in head and "  b    1/5 (20%, CI 4%-62%)" in head
    assert f"a vs b, quickstart: a higher (p {P_SIGNIFICANT})" in head
    assert "a vs c, quickstart: no significant difference (p 1)" in head
    assert f"b vs c, quickstart: c higher (p {P_SIGNIFICANT})" in head
    assert [line for line in done.stdout.splitlines() if line.startswith("== arm ")] == \
        ["== arm a ==", "== arm b ==", "== arm c =="]


def test_the_markdown_summary_opens_with_the_matrix_then_each_arm(tmp_path: Path) -> None:
    text = summary_markdown(load_sweep(_sweep(tmp_path / "out"), label="RESULTS_DIR"))
    assert text.startswith("## Arms\n")
    assert text.index("## Arms") < text.index("## firstrun: arm a") < text.index("## firstrun: arm b")
    assert f"a vs b, quickstart: a higher \\(p {P_SIGNIFICANT}\\)" in text  # markdown-escaped


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(str(found["id"]))
        if (found.get("href") or "").startswith("#"):
            self.links.append(str(found["href"])[1:])


def test_one_page_holds_every_arm_with_the_matrix_first_and_anchors_its_own(tmp_path: Path) -> None:
    sweeps = load_sweep(_sweep(tmp_path / "out"), label="RESULTS_DIR")
    assert [s.arm for s in sweeps] == ["a", "b", "c"]
    page = render_arms_html([(s.arm or "", s) for s in sweeps])
    anchors = _Anchors()
    anchors.feed(page)
    assert len(anchors.ids) == len(set(anchors.ids))
    assert set(anchors.links) <= set(anchors.ids)
    assert anchors.ids.index("arms") < anchors.ids.index("arm-1") < anchors.ids.index("arm-1-findings") \
        < anchors.ids.index("arm-2") < anchors.ids.index("arm-3-traces")
    assert f"a higher (p {P_SIGNIFICANT})" in page
    html_path = tmp_path / "arms.html"
    assert firstrun("report", str(tmp_path / "out"), "--out", str(html_path)).returncode == 0
    _, console = render(html_path, tmp_path)
    assert console == []


def test_a_command_that_needs_one_sweep_names_an_arm_to_give(tmp_path: Path) -> None:
    out = _sweep(tmp_path / "out")
    with pytest.raises(UsageError) as caught:
        load_saved(out, label="BEFORE")
    assert caught.value.args[0] == (f"BEFORE: {out} holds a sweep of several arms (a, b, c): "
                                    f"give one arm's directory, {out / 'a'}")
    done = firstrun("diff", str(out / "a"), str(out / "b"))
    assert done.returncode == 0 and "REGRESSED" in done.stdout
