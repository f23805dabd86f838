"""Route walks and blocked-egress grouping, on hand-built runs whose answers are known."""

from __future__ import annotations

import pytest
from report_support import ROUTE, page, record

from firstrun.reports.analysis import (
    blocked_by_destination,
    destination,
    route_report,
    run_route,
)
from firstrun.results.model import Classification

pytestmark = pytest.mark.fast


def test_a_run_that_starts_off_the_route_left_before_any_route_page() -> None:
    r = record("t", 1, Classification.DOCS_GAP,
               pages=(page("https://blog.test/"), page(ROUTE[0])), last_page_before_failure=ROUTE[0])
    walk = run_route(r, ROUTE)
    assert walk.left and walk.left_at == 0 and walk.left_after is None
    assert walk.off_route == (True, False)
    report = route_report([r])
    assert (report.left_route, report.left_before_route) == (1, 1)
    assert [p.left_route_after for p in report.pages] == [0, 0, 0, 0]


def test_a_run_that_stays_on_the_route_in_any_order_never_left() -> None:
    r = record("t", 1, Classification.PASSED, pages=(page(ROUTE[2]), page(ROUTE[0]), page(ROUTE[2])))
    walk = run_route(r, ROUTE)
    assert not walk.left and walk.left_at is None
    # A page read twice is one run that read it.
    assert [p.read_by for p in route_report([r]).pages] == [1, 0, 1]


def test_without_a_recorded_route_nothing_is_called_off_route() -> None:
    r = record("t", 1, Classification.DOCS_GAP, docs_route=(), pages=(page("https://x.test/"),),
               last_page_before_failure=None)
    report = route_report([r])
    assert report.route == () and report.left_route == 0
    assert [(p.url, p.position) for p in report.pages] == [("https://x.test/", None)]
    assert (report.failures, report.failures_without_page) == (1, 1)


def test_a_route_that_changed_between_runs_is_flagged_and_the_latest_leads() -> None:
    old = record("t", 1, Classification.PASSED, docs_route=ROUTE[:2])
    new = record("t", 2, Classification.PASSED, docs_route=ROUTE)
    report = route_report([old, new])
    assert report.route_varies and report.route == ROUTE


def test_blocked_egress_by_destination_counts_every_attempt() -> None:
    def b(host: str | None, port: int | None, reason: str) -> dict[str, object]:
        return {"host": host, "port": port, "reason": reason, "channel": "shell"}

    runs = [
        record("t", 1, Classification.DOCS_GAP, blocked_egress=(b("a.test", 443, "not_allowed"),
                                                                  b("::1", 80, "loopback"),
                                                                  b(None, None, "malformed"))),
        record("t", 2, Classification.DOCS_GAP, blocked_egress=(b("a.test", 443, "not_allowed"),
                                                                  b("a.test", 443, "docs_host_on_shell"))),
    ]
    groups = blocked_by_destination(runs)
    assert [(g.destination, g.attempts, g.runs, g.reasons) for g in groups] == [
        ("a.test:443", 3, 2, (("not_allowed", 2), ("docs_host_on_shell", 1))),
        ("(no valid host)", 1, 1, (("malformed", 1),)),
        ("[::1]:80", 1, 1, (("loopback", 1),)),
    ]
    assert destination({"host": "h.test"}) == "h.test"
