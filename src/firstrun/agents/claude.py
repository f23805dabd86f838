"""``--agent claude``: the shared tool-use loop over Anthropic's Messages API.

Guarantee: the ``anthropic`` SDK is imported only when a Claude agent is made;
without it, making one is a one-line ``UsageError`` naming the extra to install.
The loop's retries, held to the run's wall budget, are the only ones. A
transient failure (rate limit, 408/409, any 5xx, connection, timeout) is
``VendorUnavailable``; every other SDK error is ``VendorConfigError``. The key
is handed to the SDK client and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from firstrun.agents.keys import require_key
from firstrun.agents.loop import LoopAgent
from firstrun.agents.spend import FilePrice, price_for
from firstrun.agents.vendor import (
    TokenUsage,
    ToolCall,
    ToolResult,
    ToolSpec,
    Turn,
    TurnStop,
    VendorConfigError,
    VendorUnavailable,
    describe,
    retry_after,
)
from firstrun.errors import UsageError

VENDOR = "anthropic"
# A current model the SDK names in its Model type and genai-prices prices.
DEFAULT_MODEL = "claude-sonnet-5-5"

_STOPS = {
    "end_turn": TurnStop.END,
    "stop_sequence": TurnStop.END,
    "tool_use": TurnStop.TOOL_USE,
    "max_tokens": TurnStop.MAX_OUTPUT,
    "refusal": TurnStop.REFUSAL,
    "model_context_window_exceeded": TurnStop.CONTEXT_FULL,
    "pause_turn": TurnStop.PAUSED,
}


def import_sdk() -> ModuleType:
    try:
        import anthropic
    except ImportError:
        raise UsageError('--agent claude needs the anthropic SDK: pip install "firstrun[claude]"') from None
    return anthropic


class AnthropicClient:
    """A ``VendorClient`` over ``anthropic.Anthropic().messages.create`` (non-streaming)."""

    vendor = VENDOR

    def __init__(self, *, model: str, api_key: str, base_url: str | None = None) -> None:
        sdk = import_sdk()
        self.model = model
        # The SDK's own retries are off: the loop's, held to the wall budget, decide.
        self._client = sdk.Anthropic(api_key=api_key, base_url=base_url, max_retries=0)
        # The SDK's optional classes are looked up, not named, so an SDK
        # version without one still maps the rest.
        self._transient: tuple[type[BaseException], ...] = tuple(
            getattr(sdk, name) for name in
            ("RateLimitError", "InternalServerError", "APIConnectionError",
             "RequestTimeoutError", "ConflictError")
            if hasattr(sdk, name))
        self._config: tuple[type[BaseException], ...] = (sdk.AnthropicError,)

    def user_message(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def send(self, *, system: str, conversation: Sequence[Any], tools: Sequence[ToolSpec],
             max_output_tokens: int, timeout: float) -> Turn:
        try:
            reply = self._client.messages.create(
                model=self.model,
                system=system,
                messages=list(conversation),
                max_tokens=max_output_tokens,
                timeout=timeout,
                # No tools, no field: a one-off call (a suggestion) offers none.
                **({"tools": [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                              for t in tools]} if tools else {}),
            )
        # Mapped once, by type: a rate limit, a 408/409, any 5xx (529 overloaded
        # included) and a connection failure or timeout are transient, with the
        # ``retry-after`` the server sent; every other API error (401, 403, 404, 400,
        # ...) and a credentials error are configuration errors.
        except self._transient as exc:
            raise VendorUnavailable(_describe(exc), who=VENDOR,
                                    retry_after=_retry_after(exc)) from None
        except self._config as exc:
            raise VendorConfigError(_describe(exc), who=VENDOR) from None
        return _turn(reply)

    def tool_results(self, results: Sequence[ToolResult]) -> list[Any]:
        # Every result answers a tool_use of the last reply, all in one user message.
        return [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": r.call_id, "content": r.text,
             **({"is_error": True} if r.is_error else {})}
            for r in results]}]

    def close(self) -> None:
        self._client.close()


def _turn(reply: Any) -> Turn:
    texts: list[str] = []
    calls: list[ToolCall] = []
    content: list[dict[str, Any]] = []
    for block in reply.content:
        if block.type == "text":
            texts.append(block.text)
            content.append({"type": "text", "text": block.text})
        elif block.type == "tool_use":
            arguments = block.input if isinstance(block.input, dict) else None
            calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
            content.append({"type": "tool_use", "id": block.id, "name": block.name,
                            "input": block.input})
        else:
            # Blocks the loop does not read (thinking, say) go back as they came.
            content.append(block.model_dump(mode="json", exclude_none=True))
    usage = reply.usage
    cached = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    detail = ""
    details = getattr(reply, "stop_details", None)
    if details is not None:
        detail = " ".join(str(part) for part in (details.category, details.explanation) if part)
    return Turn(
        text="\n".join(texts),
        tool_calls=tuple(calls),
        stop=_STOPS.get(reply.stop_reason or "", TurnStop.OTHER),
        vendor_stop=reply.stop_reason,
        # Anthropic's input_tokens excludes cache reads and writes; ours includes them.
        usage=TokenUsage(input_tokens=usage.input_tokens + cached + written,
                         output_tokens=usage.output_tokens, cached_tokens=cached,
                         cache_write_tokens=written),
        message={"role": "assistant", "content": content},
        model=reply.model,
        detail=detail,
    )


def _describe(exc: BaseException) -> str:
    return describe(exc, status=getattr(exc, "status_code", None),
                    message=getattr(exc, "message", None))


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    return None if response is None else retry_after(response.headers)


def make_claude(*, model: str | None = None, base_url: str | None = None,
                price_file: Mapping[str, FilePrice] | None = None,
                environ: Mapping[str, str] | None = None, **loop: Any) -> LoopAgent:
    """A Claude agent; refuses (``UsageError``) without the SDK or a key, before any run.

    ``loop`` passes ``retry``, ``sleep``, ``clock`` and ``rng`` to ``LoopAgent``.
    """
    import_sdk()
    key = require_key(VENDOR, agent="claude", environ=environ)
    chosen = model or DEFAULT_MODEL
    return LoopAgent(
        name="claude", model=chosen,
        make_client=lambda: AnthropicClient(model=chosen, api_key=key, base_url=base_url),
        pricing=price_for(VENDOR, chosen, price_file), **loop)
