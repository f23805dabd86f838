"""Documentation affordances for machine readers: ``llms.txt``, ``llms-full.txt`` and
``.md`` page variants (llmstxt.org), hidden from ``read_docs`` or probed for.

Guarantee: whether a URL is an affordance is decided by its path alone, so a
hiding run hides the same URLs whatever a server answers, and the task's own
route pages are never hidden; two runs that differ only in ``--affordances``
measure the affordance itself. Probing reads through the run's own reader but
hands nothing to the agent, so it changes nothing the agent can read.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Protocol

import httpx

from .convert import HTML_TYPES
from .page import Page


class Prober(Protocol):
    """What probing needs of a docs reader: one read with no affordance hidden."""

    def probe(self, url: str) -> Page: ...

LLMS_FILES = ("llms.txt", "llms-full.txt")
MD_SUFFIX = ".md"


class Affordances(StrEnum):
    """``--affordances``: what ``read_docs`` may read of the affordances."""

    ALL = "all"
    NONE = "none"


def is_affordance(path: str) -> bool:
    """Whether a URL path names an affordance (by its path alone, case-insensitively)."""
    lowered = path.lower()
    return lowered.rsplit("/", 1)[-1] in LLMS_FILES or lowered.endswith(MD_SUFFIX)


def _key(url: str | httpx.URL) -> str:
    """A URL as the reader requests it (parsed once, no fragment), for comparing."""
    return str(httpx.URL(url).copy_with(fragment=None))


# The route's pages are the docs under test, not an affordance, even when one is
# a ``.md`` file. The reader refuses every other affordance URL, on the first
# hop or any redirect, as ``ReadFailure.AFFORDANCE_HIDDEN``.
@dataclass(frozen=True, kw_only=True)
class AffordanceFilter:
    """Hides affordance URLs from the reader, except the pages in ``keep`` (the route)."""

    keep: frozenset[str]

    @classmethod
    def for_route(cls, route: Iterable[str]) -> AffordanceFilter:
        return cls(keep=frozenset(_key(url) for url in route))

    def hides(self, url: httpx.URL) -> bool:
        return is_affordance(url.path) and _key(url) not in self.keep


def markdown_variant(url: str) -> str | None:
    """The ``.md`` variant llmstxt.org proposes for a page (the URL with ``.md``
    appended, ``index.html.md`` for a directory); None for a page already in markdown."""
    parsed = httpx.URL(url).copy_with(query=None, fragment=None)
    path = parsed.path or "/"
    if path.lower().endswith(MD_SUFFIX):
        return None
    variant = f"{path}index.html{MD_SUFFIX}" if path.endswith("/") else f"{path}{MD_SUFFIX}"
    return str(parsed.copy_with(path=variant))


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """One candidate probed: ``kind`` is ``llms.txt``, ``llms-full.txt`` or ``md``;
    ``page`` the route page an ``md`` variant belongs to."""

    kind: str
    url: str
    exists: bool
    status: int | None
    bytes: int
    content_type: str | None
    error: str | None
    page: str | None = None


@dataclass(frozen=True, kw_only=True)
class AffordanceProbe:
    """What the probe found: a summary, and every candidate as checked."""

    checked: tuple[ProbeResult, ...]

    def summary(self) -> dict[str, Any]:
        found = [r for r in self.checked if r.exists]
        md = [r for r in self.checked if r.kind == "md"]
        summary: dict[str, Any] = {}
        for name in LLMS_FILES:
            hits = [r for r in found if r.kind == name]
            summary[name] = {"exists": bool(hits), "bytes": max((r.bytes for r in hits), default=0),
                             "urls": [r.url for r in hits]}
        summary["md"] = {"pages": len(md), "exist": sum(1 for r in md if r.exists),
                         "bytes": sum(r.bytes for r in md if r.exists)}
        return summary

    def to_data(self) -> dict[str, Any]:
        return {"summary": self.summary(), "checked": [asdict(r) for r in self.checked]}


def candidates(route: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """``(kind, url, page)`` to probe for ``route``, each once, in route order."""
    seen: set[str] = set()
    found: list[tuple[str, str, str | None]] = []

    def add(kind: str, url: str, page: str | None) -> None:
        if url not in seen:
            seen.add(url)
            found.append((kind, url, page))

    for page in route:
        parsed = httpx.URL(page).copy_with(query=None, fragment=None)
        directory = posixpath.dirname(parsed.path or "/")
        for base in ("/", directory.rstrip("/") + "/"):
            for name in LLMS_FILES:
                add(name, str(parsed.copy_with(path=base + name)), None)
    for page in route:
        variant = markdown_variant(page)
        if variant is not None:
            add("md", variant, page)
    return found


# Each candidate (``/llms.txt`` and ``/llms-full.txt`` at each docs origin of the
# route and in each route page's directory, and each route page's ``.md``
# variant) is read through the run's own reader, so allow-list, robots.txt,
# politeness and the proxy apply as for any read, but with hiding off. A
# candidate exists when it answered 2xx with a body that is not HTML (a
# catch-all HTML page is not an affordance); the record says how large it is,
# never what it says.
def probe_affordances(reader: Prober, route: Sequence[str]) -> AffordanceProbe:
    """Probe ``route``'s affordances through ``reader``, hiding off."""
    results = []
    for kind, url, page in candidates(route):
        read = reader.probe(url)
        media = (read.content_type or "").split(";", 1)[0].strip().lower()
        exists = read.ok and media not in HTML_TYPES
        results.append(ProbeResult(
            kind=kind, url=url, exists=exists, status=read.status,
            bytes=read.bytes if read.ok else 0, content_type=read.content_type,
            error=read.error.value if read.error is not None else None, page=page))
    return AffordanceProbe(checked=tuple(results))
