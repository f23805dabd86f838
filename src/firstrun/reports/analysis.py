"""Where readers went and what the sandbox refused, per task, from saved runs only.

Guarantee: pure functions of ``RunRecord``s. A run *leaves the documented
route* at its first read of a page that is not on the route its record
saved; the route page read just before that is where it left (none, when it
left before reading any route page). Every read is counted, every failure's
last page is counted, and every blocked egress attempt is counted under its
destination and reason, never sampled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from firstrun.policy.network import destination_label
from firstrun.results.model import EVIDENTIAL, Classification, RunRecord


@dataclass(frozen=True, kw_only=True)
class RunRoute:
    """One run's reads set against the documented route."""

    pages: tuple[str, ...]
    off_route: tuple[bool, ...]
    left: bool
    left_after: str | None

    @property
    def left_at(self) -> int | None:
        """Index in ``pages`` of the first read off the route."""
        return self.off_route.index(True) if self.left else None


def run_route(record: RunRecord, route: Sequence[str]) -> RunRoute:
    on_route = set(route)
    pages = tuple(p.url_requested for p in record.pages)
    off = tuple(bool(on_route) and url not in on_route for url in pages)
    left = any(off)
    # Every read before the first off-route one is on the route.
    before = pages[: off.index(True)] if left else ()
    left_after = before[-1] if before else None
    return RunRoute(pages=pages, off_route=off, left=left, left_after=left_after)


@dataclass(frozen=True, kw_only=True)
class PageStats:
    """One page as the task's runs met it."""

    url: str
    position: int | None
    read_by: int
    not_read: int
    left_route_after: int
    last_before_failure: int


@dataclass(frozen=True, kw_only=True)
class RouteReport:
    """The documented route (in order), then off-route pages (in first-read order)."""

    route: tuple[str, ...]
    route_varies: bool
    pages: tuple[PageStats, ...]
    runs: int
    left_route: int
    left_before_route: int
    failures: int
    failures_without_page: int


def _failed(record: RunRecord) -> bool:
    return record.classification is not Classification.PASSED and record.classification in EVIDENTIAL


def route_report(records: Sequence[RunRecord]) -> RouteReport:
    """The task's route against the pages its runs read. ``records`` are one task's runs."""
    routes = [r.docs_route for r in records if r.docs_route]
    # The latest run's route leads; a route that changed across runs is flagged.
    route = routes[-1] if routes else ()
    per_run = [(r, run_route(r, route)) for r in records]
    read_by: Counter[str] = Counter()
    not_read: Counter[str] = Counter()
    left_after: Counter[str] = Counter()
    last: Counter[str] = Counter()
    order: list[str] = list(route)
    for record, walk in per_run:
        for page in record.pages:
            if page.url_requested not in order:
                order.append(page.url_requested)
        for url in set(walk.pages):
            read_by[url] += 1
        for url in {p.url_requested for p in record.pages if p.error is not None}:
            not_read[url] += 1
        if walk.left and walk.left_after is not None:
            left_after[walk.left_after] += 1
        if _failed(record) and record.last_page_before_failure:
            last[record.last_page_before_failure] += 1
            if record.last_page_before_failure not in order:
                order.append(record.last_page_before_failure)
    positions = {url: i for i, url in enumerate(route, start=1)}
    failures = [r for r in records if _failed(r)]
    return RouteReport(
        route=route,
        route_varies=len(set(routes)) > 1,
        pages=tuple(
            PageStats(url=url, position=positions.get(url), read_by=read_by[url], not_read=not_read[url],
                      left_route_after=left_after[url], last_before_failure=last[url])
            for url in order
        ),
        runs=len(records),
        left_route=sum(1 for _, w in per_run if w.left),
        left_before_route=sum(1 for _, w in per_run if w.left and w.left_after is None),
        failures=len(failures),
        failures_without_page=sum(1 for r in failures if not r.last_page_before_failure),
    )


@dataclass(frozen=True, kw_only=True)
class BlockedDestination:
    """Every blocked attempt at one destination, across a task's runs."""

    destination: str
    reasons: tuple[tuple[str, int], ...]
    channels: tuple[str, ...]
    runs: int

    @property
    def attempts(self) -> int:
        return sum(n for _, n in self.reasons)


def destination(blocked: Mapping[str, Any]) -> str:
    host = blocked.get("host")
    return destination_label(str(host) if host else None, blocked.get("port"),
                             blocked.get("reason"))


def blocked_by_destination(records: Sequence[RunRecord]) -> tuple[BlockedDestination, ...]:
    """Blocked egress grouped by destination, the most attempts first, then by name."""
    reasons: dict[str, Counter[str]] = {}
    channels: dict[str, set[str]] = {}
    runs: dict[str, set[int]] = {}
    for i, record in enumerate(records):
        for blocked in record.blocked_egress:
            dest = destination(blocked)
            reasons.setdefault(dest, Counter())[str(blocked.get("reason") or "unknown")] += 1
            channels.setdefault(dest, set()).add(str(blocked.get("channel") or "unknown"))
            runs.setdefault(dest, set()).add(i)
    groups = [
        BlockedDestination(destination=dest,
                           reasons=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
                           channels=tuple(sorted(channels[dest])), runs=len(runs[dest]))
        for dest, counts in reasons.items()
    ]
    return tuple(sorted(groups, key=lambda g: (-g.attempts, g.destination)))
