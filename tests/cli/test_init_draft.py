"""What ``init`` drafts from a page, as pure functions: loosened output lines and the goal."""

from __future__ import annotations

import subprocess

import pytest

from firstrun.cli.scaffold import drafted_check, goal_from, loosen
from firstrun.docs import Page
from firstrun.docs.blocks import extract


@pytest.mark.parametrize(("documented", "printed"), [
    ("Successfully installed tabulate-0.9.0", "Successfully installed tabulate-0.10.1"),
    ("added 1 package in 452ms", "added 3 package in 2s"),
    ("| Earth  |  6371 |  1 |", "| Earth | 6371 | 1 |"),
    ("Hello from 3.12.1 at /home/me/x.py (commit 3f2a9c1d)", "Hello from 3.11.7 at /work/x.py (commit 0b1e77aa9)"),
    ("Done [1/2] in 12:04:55", "Done [2/2] in 09:00:01"),
])
def test_a_loosened_line_matches_another_runs_version_of_it(documented: str, printed: str) -> None:
    pattern = loosen(documented)
    assert pattern is not None
    grep = subprocess.run(["grep", "-qE", "--", pattern], input=printed + "\n", text=True, check=False)
    assert grep.returncode == 0, pattern
    changed = subprocess.run(["grep", "-qE", "--", pattern], input="Something else entirely\n", text=True,
                             check=False)
    assert changed.returncode == 1


@pytest.mark.parametrize("line", ["+-------+------+", "", "  ", "42", "/usr/lib/python3"])
def test_a_line_with_nothing_lasting_in_it_drafts_nothing(line: str) -> None:
    assert loosen(line) is None


def page(html: str, url: str = "https://d.test/a") -> Page:
    return Page(url_requested=url, url_final=url, status=200, content_type="text/html", bytes=len(html),
                sha256=None, markdown="# Start\n\n## Install it\n\ntext\n\n### Run it ###\n", title="Start",
                links=(), from_cache=False, error=None, detail=None, hops=(url,), truncated=False,
                duration_ms=0, blocks=extract(html, url=url))


def test_the_check_takes_console_output_and_files_and_skips_marked_blocks() -> None:
    html = ('<p>Save this as <code>src/app.py</code>:</p><pre><code class="language-python">print(1)</code></pre>'
            '<pre><code class="language-console">$ python3 src/app.py\nresult: 1 item</code></pre>'
            '<!-- firstrun: skip --><pre><code class="language-console">$ ls\nnot this one</code></pre>')
    check = drafted_check([page(html)])
    assert check.files == ("src/app.py",)
    assert check.outputs == ("result:[[:space:]]+[0-9][0-9.]*[[:alpha:]]*[[:space:]]+item",)


def test_the_goal_names_the_titles_and_headings() -> None:
    assert goal_from([page("")]) == 'Following the docs "Start", do what they show, in order: Install it; Run it.'
