"""What one ``read_docs`` call returns, and what the trace records of it.

Guarantee: a read always yields a ``Page``. A page that could not be read
carries one ``ReadFailure`` from a closed set, because results and statistics
key on it; the human detail travels beside it in ``detail`` and is never
matched on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .blocks import Block


class ReadFailure(enum.StrEnum):
    """Why a page could not be read. Values are stable: results key on them."""

    NOT_ALLOWED = "not_allowed"
    ROBOTS_DISALLOWED = "robots_disallowed"
    HTTP_ERROR = "http_error"
    UNREACHABLE = "unreachable"
    TOO_LARGE = "too_large"
    NOT_TEXT = "not_text"
    REDIRECT_NOT_ALLOWED = "redirect_not_allowed"
    TOO_MANY_REDIRECTS = "too_many_redirects"
    # An llms.txt, llms-full.txt or .md variant, hidden by --affordances none.
    AFFORDANCE_HIDDEN = "affordance_hidden"


@dataclass(frozen=True, kw_only=True)
class Page:
    """One documentation page as the agent saw it.

    ``hops`` is every URL in the order it was reached, starting with
    ``url_requested``; when a redirect is refused, its refused target is the
    last hop, so the chain that led off the allow-list is on record.
    ``url_final`` is the last URL requested and ``status`` its status (None
    when no response came, or when nothing was requested at all).
    ``bytes`` and ``sha256`` describe the body of that last response as
    received (decoded from any transfer compression), before conversion.
    ``from_cache`` is true only when no hop touched the network.
    ``blocks`` are the body's code blocks (``firstrun.docs.blocks``), each
    filed under ``url_requested``; none for a page that could not be read.
    """

    url_requested: str
    url_final: str
    status: int | None
    content_type: str | None
    bytes: int
    sha256: str | None
    markdown: str
    title: str | None
    links: tuple[str, ...]
    from_cache: bool
    error: ReadFailure | None
    detail: str | None
    hops: tuple[str, ...]
    truncated: bool
    duration_ms: int
    blocks: tuple[Block, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_record(self) -> dict[str, Any]:
        """The trace record of this read.

        The markdown itself is left out: ``sha256`` identifies the body that
        produced it and the cache holds that body, so the record stays small
        enough to write once per read. The code blocks are kept
        (``Block.to_data``), so what replay ran, and what drifted from it, can
        be judged from the trace alone.
        """
        return {
            "url_requested": self.url_requested,
            "url_final": self.url_final,
            "status": self.status,
            "content_type": self.content_type,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "title": self.title,
            "links": len(self.links),
            "markdown_chars": len(self.markdown),
            "truncated": self.truncated,
            "from_cache": self.from_cache,
            "error": None if self.error is None else self.error.value,
            "detail": self.detail,
            "hops": list(self.hops),
            "duration_ms": self.duration_ms,
            "blocks": [block.to_data() for block in self.blocks],
        }
