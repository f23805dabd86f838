"""What a vendor adapter must provide to the shared tool-use loop, and nothing more.

Guarantee: the loop (``firstrun.agents.loop``) talks to every vendor through
``VendorClient`` alone and sees only the normalized ``Turn``; the vendor's own
message shapes pass through it opaque. Each adapter maps its SDK's exceptions
once, by type, into the two errors below, so the loop decides retries the same
way for every vendor; an SDK exception that is neither reaches the runner as a
firstrun bug (``harness_error`` with its traceback), never as a guess.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from firstrun.errors import FirstrunError


class TurnStop(StrEnum):
    """Why the model's turn ended, normalized across vendors."""

    END = "end"  # a natural stop (or a stop sequence): the model is done
    TOOL_USE = "tool_use"
    MAX_OUTPUT = "max_output"  # the reply hit the per-reply output limit
    REFUSAL = "refusal"  # the vendor's refusal stop reason
    CONTEXT_FULL = "context_full"  # the conversation outgrew the model's context
    PAUSED = "paused"  # the vendor paused a long turn; sending again resumes it
    OTHER = "other"  # a stop reason this build does not know


@dataclass(frozen=True, kw_only=True)
class TokenUsage:
    """Tokens of one model call. ``input_tokens`` counts all input, cached reads
    and cache writes included; ``cached_tokens`` and ``cache_write_tokens`` are
    the parts of it read from and written to the vendor's prompt cache."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_data(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_tokens": self.cached_tokens,
                "cache_write_tokens": self.cache_write_tokens}


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call as the model made it. ``arguments`` is the decoded JSON
    object, or None when the vendor's arguments did not decode to an object."""

    id: str
    name: str
    arguments: dict[str, Any] | None


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One model reply, normalized. ``message`` is the reply in the vendor's
    own shape, appended to the conversation as it is. ``vendor_stop`` is the
    vendor's stop reason verbatim and ``detail`` any explanation it gave
    (a refusal's, say): both for people, never decided on. ``usage`` is None
    when the server reported none (a local OpenAI-compatible server may not):
    the turn's tokens, and so its cost, are unknown, never taken as zero."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    stop: TurnStop
    vendor_stop: str | None
    usage: TokenUsage | None
    message: Any
    model: str | None = None
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool offered to the model: its name, what it does, and one JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    """What a tool call returned, as text for the model."""

    call_id: str
    name: str
    text: str
    is_error: bool = False


class VendorError(FirstrunError):
    """The model vendor's API failed; which kind decides what the loop does."""

    who = "vendor"


class VendorUnavailable(VendorError):
    """Transient: a rate limit, a 5xx, an overload, a network failure or timeout.

    The loop retries it with backoff within the wall budget. ``retry_after``
    is the wait the vendor asked for, in seconds, when it said.
    """

    def __init__(self, message: str, *, who: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, who=who)
        self.retry_after = retry_after


class VendorConfigError(VendorError):
    """Not transient: a bad or missing key, no access, an unknown model, a
    request the API rejects. Retrying cannot help; the run is a harness error."""


# ``Turn.message`` and what ``user_message``/``tool_results`` return are
# appended to the conversation as they are; the loop never looks inside.
class VendorClient(Protocol):
    """One conversation's connection to a model. A fresh client per run.

    ``vendor`` is the provider id prices are looked up under (genai-prices'
    ``provider_id``: ``anthropic``, ``openai``, ``google``, ...) and ``model``
    the model id requested.
    """

    vendor: str
    model: str

    def user_message(self, text: str) -> Any:
        """A user message holding ``text``, in the vendor's shape."""
        ...

    def send(self, *, system: str, conversation: Sequence[Any], tools: Sequence[ToolSpec],
             max_output_tokens: int, timeout: float) -> Turn:
        """One model call over the whole conversation so far.

        Raises ``VendorUnavailable`` or ``VendorConfigError``, mapped from the
        SDK's exception types; ``timeout`` (seconds) bounds the call.
        """
        ...

    def tool_results(self, results: Sequence[ToolResult]) -> list[Any]:
        """The messages that answer the last turn's tool calls, in the vendor's shape."""
        ...

    def close(self) -> None:
        """Release the connection pool; the client is not used again."""
        ...


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a server asked to wait: ``retry-after-ms``, else ``retry-after`` in
    seconds or as an HTTP date; None when it did not say or said nonsense."""
    try:
        if "retry-after-ms" in headers:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        if "retry-after" in headers:
            value = headers["retry-after"]
            try:
                return max(0.0, float(value))
            except ValueError:
                when = email.utils.parsedate_to_datetime(value)
                return max(0.0, when.timestamp() - time.time())
    except (ValueError, TypeError):
        return None
    return None


def describe(exc: BaseException, *, status: int | None, message: str | None) -> str:
    """An SDK exception for people: its type, the HTTP status when there was one,
    and the SDK's message on one line. Headers (and so keys) are never in it."""
    text = message or str(exc)
    return f"{type(exc).__name__}{f' (HTTP {status})' if status else ''}: {' '.join(text.split())}"
