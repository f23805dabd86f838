"""The docs channel end to end: a redirect off the allow-list refused, the docs host refused on the shell.

The docs are served by real HTTP servers on loopback behind ``--docs-mirror``,
and every request they receive is recorded, so the evidence is what the
servers saw, beside what the run saved.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_support import (
    DOCS_HOST,
    Answer,
    DocsServer,
    Run,
    events,
    runs_by_task,
    site_answers,
    task,
    trace_of,
)

pytestmark = pytest.mark.e2e

Start = Callable[[dict[str, Answer]], DocsServer]


def test_a_redirect_to_a_host_off_the_allow_list_is_refused_and_recorded(
    firstrun: Run, docs_server: Start, tmp_path: Path
) -> None:
    # The second server stands for the host the redirect points at: if the
    # reader followed the hop, this is where the request would land.
    canary = docs_server(site_answers())
    moved = docs_server({
        "/index.html": site_answers()["/index.html"],
        "/guide.html": Answer(status=302, headers={"Location": f"{canary.origin}/guide.html"}),
    })
    out = tmp_path / "out"
    done = firstrun("run", task("docs-redirect"), "--docs-mirror",
                    f"moved.docs.example={moved.origin}", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr

    assert canary.seen == []
    assert [r.path for r in moved.seen if r.path != "/robots.txt"] == ["/index.html", "/guide.html"]

    (run,) = runs_by_task(out).values()
    # The check alone decides: an unreadable route page is a finding, not a verdict.
    assert (run["classification"], run["reason"]) == ("passed", "passed")
    first, second = run["pages"]
    assert first["status"] == 200 and first["error"] is None
    assert second["url_requested"] == "https://moved.docs.example/guide.html"
    assert second["error"] == "redirect_not_allowed"
    assert [(f["url"], f["error"]) for f in run["route_findings"]] == [
        ("https://moved.docs.example/guide.html", "redirect_not_allowed")
    ]
    (read,) = [e for e in events(trace_of(out, run), "docs_read")
               if e["page"]["url_requested"].endswith("/guide.html")]
    assert read["route"] and read["page"]["hops"][-1] == f"{canary.origin}/guide.html"


def test_the_docs_host_is_refused_on_the_shell_and_the_attempt_recorded(
    firstrun: Run, docs_server: Start, tmp_path: Path
) -> None:
    site = docs_server(site_answers())
    out = tmp_path / "out"
    done = firstrun("run", task("docs-on-shell"), "--docs-mirror", f"{DOCS_HOST}={site.origin}",
                    "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr

    (run,) = runs_by_task(out).values()
    trace = trace_of(out, run)
    curl = events(trace, "command", source="agent")[0]
    assert "the proxy answered 403" in curl["stdout"]
    denied = [e["record"] for e in events(trace, "egress") if e["record"]["host"] == DOCS_HOST]
    assert denied and all(
        (r["channel"], r["decision"], r["reason"], r["status"])
        == ("shell", "deny", "docs_host_on_shell", 403)
        for r in denied
    )
    assert [b["reason"] for b in run["blocked_egress"]] == ["docs_host_on_shell"] * len(denied)
    # The server saw the harness's reads of the route, and nothing from the shell.
    readers = {r.user_agent for r in site.seen}
    assert len(readers) == 1 and readers.pop().startswith("firstrun/")
    assert [r.path for r in site.seen if r.path != "/robots.txt"] == ["/index.html", "/guide.html"]
