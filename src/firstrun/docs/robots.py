"""What a host's robots.txt lets firstrun read, per RFC 9309.

Guarantee: a fetched robots.txt is honoured with RFC 9309's matching (the
longest matching rule wins, Allow on a tie, ``*`` and a trailing ``$`` as
wildcards); a robots.txt that is absent (4xx) allows everything; one that
cannot be had (5xx, 429, unreachable, a refused redirect) disallows
everything for now. Parsing of groups and Crawl-delay is the stdlib's
``urllib.robotparser``; matching is done here because the stdlib applies the
first matching rule and takes ``*`` literally, which would read pages a site
asked robots to leave alone. Pure: no I/O.
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.robotparser
from dataclasses import dataclass
from typing import Any

# RFC 9309 §2.5: a crawler must parse at least 500 KiB.
MAX_ROBOTS_BYTES = 500 * 1024


@dataclass(frozen=True, kw_only=True)
class RobotsRules:
    """The rules of one origin; ``parser`` is None when the verdict is blanket."""

    allow_all: bool
    parser: urllib.robotparser.RobotFileParser | None
    detail: str
    # The origin could not be reached at all: a read is then reported as
    # unreachable, which is what happened, rather than as a robots refusal.
    unreachable: bool = False

    def allows(self, url: str, user_agent: str) -> bool:
        if self.parser is None:
            return self.allow_all
        entry = _entry_for(self.parser, user_agent)
        if entry is None:
            return True
        path = _normalise(url)
        best: tuple[int, bool] | None = None
        for rule in entry.rulelines:
            if _pattern(rule.path).match(path):
                key = (len(rule.path), bool(rule.allowance))
                if best is None or key > best:
                    best = key
        return True if best is None else best[1]

    def crawl_delay(self, user_agent: str) -> float | None:
        if self.parser is None:
            return None
        delay = self.parser.crawl_delay(user_agent)
        return None if delay is None else float(delay)


def rules_from_response(status: int, body: bytes) -> RobotsRules:
    """Interpret the final response to a robots.txt request (redirects already followed)."""
    if 200 <= status < 300:
        parser = urllib.robotparser.RobotFileParser()
        parser.parse(body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace").splitlines())
        return RobotsRules(allow_all=False, parser=parser, detail=f"robots.txt {status}")
    # A 429 is the server asking for less traffic, not saying it has no rules.
    if 400 <= status < 500 and status != 429:
        return RobotsRules(allow_all=True, parser=None, detail=f"robots.txt {status}: no rules")
    return unavailable(f"robots.txt {status}")


def unavailable(detail: str, *, unreachable: bool = False) -> RobotsRules:
    """RFC 9309 §2.3.1.4: when robots.txt cannot be had, assume complete disallow."""
    return RobotsRules(
        allow_all=False, parser=None, detail=f"{detail}: disallowed for now", unreachable=unreachable
    )


def _entry_for(parser: urllib.robotparser.RobotFileParser, user_agent: str) -> Any:
    for entry in parser.entries:
        if entry.applies_to(user_agent):
            return entry
    return parser.default_entry


def _normalise(url: str) -> str:
    """The URL's path and query in the quoted form robotparser stores rule paths in."""
    parts = urllib.parse.urlsplit(urllib.parse.unquote(url))
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return urllib.parse.quote(path)


def _pattern(rule_path: str) -> re.Pattern[str]:
    # robotparser stores rule paths quoted, so '*' is '%2A' and '$' is '%24'.
    anchored = rule_path.endswith("%24")
    if anchored:
        rule_path = rule_path[: -len("%24")]
    body = ".*".join(re.escape(piece) for piece in rule_path.split("%2A"))
    return re.compile(body + ("$" if anchored else ""))
