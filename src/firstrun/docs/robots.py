"""What a host's robots.txt lets firstrun read, per RFC 9309.

Guarantee: a fetched robots.txt is honoured as RFC 9309 reads it, by the groups
that name firstrun's product token, else by its ``*`` groups, Crawl-delay
included. A robots.txt that is absent (4xx) allows everything, and so does one
with no group in it; one that cannot be had (5xx, 429, unreachable, a refused
redirect) disallows everything for now. Only its first 500 KiB are read.
Pure: no I/O; parsing and matching are protego's, through its public interface.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from protego import Protego

# RFC 9309 §2.5: a crawler must parse at least 500 KiB.
MAX_ROBOTS_BYTES = 500 * 1024

# RFC 9309 §2.2.1: a product token is letters, underscores and hyphens.
_PRODUCT_TOKEN = re.compile(r"[A-Za-z_-]*")


# What protego applies: the rules that bind firstrun are those of every group
# naming its product token (the User-Agent's leading letters, ``_`` and ``-``,
# compared case-insensitively), merged into one (§2.2.1); with no such group,
# those of every ``*`` group, merged; with neither, none. Among them the
# longest matching rule wins, Allow on a tie, with ``*`` matching any run of
# characters and a trailing ``$`` anchoring the end of the path and query
# (§2.2.2, §2.2.3); Crawl-delay is read from the same merged group.
@dataclass(frozen=True, kw_only=True)
class RobotsRules:
    """The rules of one origin; ``parser`` is None when the verdict is blanket."""

    allow_all: bool
    parser: Protego | None
    detail: str
    # The origin could not be reached at all: a read is then reported as
    # unreachable, which is what happened, rather than as a robots refusal.
    unreachable: bool = False

    def allows(self, url: str, user_agent: str) -> bool:
        if self.parser is None:
            return self.allow_all
        return self.parser.can_fetch(url, _product_token(user_agent))

    def crawl_delay(self, user_agent: str) -> float | None:
        if self.parser is None:
            return None
        return self.parser.crawl_delay(_product_token(user_agent))


def rules_from_response(status: int, body: bytes) -> RobotsRules:
    """Interpret the final response to a robots.txt request (redirects already followed)."""
    if 200 <= status < 300:
        text = body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace")
        return RobotsRules(allow_all=False, parser=Protego.parse(text), detail=f"robots.txt {status}")
    # A 429 is the server asking for less traffic, not saying it has no rules.
    if 400 <= status < 500 and status != 429:
        return RobotsRules(allow_all=True, parser=None, detail=f"robots.txt {status}: no rules")
    return unavailable(f"robots.txt {status}")


def unavailable(detail: str, *, unreachable: bool = False) -> RobotsRules:
    """RFC 9309 §2.3.1.4: when robots.txt cannot be had, assume complete disallow."""
    return RobotsRules(
        allow_all=False, parser=None, detail=f"{detail}: disallowed for now", unreachable=unreachable
    )


def _product_token(user_agent: str) -> str:
    """The name robots.txt groups address us by: ``firstrun`` of ``firstrun/0.1.0 (+...)``.

    Only the token is handed to protego, never the whole header, which it
    would search for any group's name: a group for ``docs`` or ``tests``
    must not bind us because our User-Agent's comment has those words in it.
    """
    token = _PRODUCT_TOKEN.match(user_agent.strip())
    return token.group() if token else ""
