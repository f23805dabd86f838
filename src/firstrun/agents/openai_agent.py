"""``--agent openai``: the shared tool-use loop over Chat Completions, for OpenAI and
any OpenAI-compatible server (vLLM, Ollama, llama.cpp's server) given with ``--base-url``.

Guarantee: the ``openai`` SDK is imported only when an OpenAI agent is made (else
a one-line ``UsageError`` names the extra); the key goes to its client alone, and
only the loop retries. A request uses only what every compatible server reads, and
a reply without ``usage`` leaves the turn's tokens and spend unknown, never zero.
A rate limit, 5xx or lost connection is ``VendorUnavailable``, others ``VendorConfigError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from firstrun.agents.keys import read_key, require_key
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

VENDOR = "openai"
# The model the SDK's own documentation uses, which its ChatModel type names
# and genai-prices prices.
DEFAULT_MODEL = "gpt-5.5"
# Sent as the bearer token to a --base-url server when no key is set. The SDK
# insists on some key; a local server started without one (Ollama, llama.cpp's
# server, vLLM without --api-key) ignores the header, and one that wants a key
# answers 401, which is a harness error naming the variables to set.
NO_KEY = "firstrun-no-key"

_STOPS = {
    "stop": TurnStop.END,
    "tool_calls": TurnStop.TOOL_USE,
    "function_call": TurnStop.TOOL_USE,
    "length": TurnStop.MAX_OUTPUT,
    "content_filter": TurnStop.REFUSAL,
}


def import_sdk() -> ModuleType:
    try:
        import openai
    except ImportError:
        raise UsageError('--agent openai needs the openai SDK: pip install "firstrun[openai]"') from None
    return openai


class OpenAIClient:
    """A ``VendorClient`` over ``openai.OpenAI().chat.completions.create`` (non-streaming).

    ``limit_field`` names the output limit: OpenAI's own API wants
    ``max_completion_tokens`` (its reasoning models refuse ``max_tokens``),
    while compatible servers all know ``max_tokens`` and not all know the
    newer name.
    """

    vendor = VENDOR

    def __init__(self, *, model: str, api_key: str, base_url: str | None = None) -> None:
        sdk = import_sdk()
        self.model = model
        # The SDK's own retries are off: the loop's, held to the wall budget, decide.
        self._client = sdk.OpenAI(api_key=api_key, base_url=base_url, max_retries=0)
        self._limit_field = "max_completion_tokens" if base_url is None else "max_tokens"
        # APITimeoutError is an APIConnectionError; InternalServerError is any 5xx.
        self._transient: tuple[type[BaseException], ...] = (
            sdk.RateLimitError, sdk.InternalServerError, sdk.APIConnectionError)
        self._config: tuple[type[BaseException], ...] = (sdk.OpenAIError,)

    def user_message(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    # Only what every compatible server understands: ``messages``, ``tools`` of
    # type ``function`` and an output limit.
    def send(self, *, system: str, conversation: Sequence[Any], tools: Sequence[ToolSpec],
             max_output_tokens: int, timeout: float) -> Turn:
        try:
            reply = self._client.chat.completions.create(
                model=self.model,
                messages=[{"role": "system", "content": system}, *conversation],
                timeout=timeout,
                **{self._limit_field: max_output_tokens},
                # OpenAI refuses an empty tools list; a one-off call (a suggestion) offers none.
                **({"tools": [{"type": "function",
                               "function": {"name": t.name, "description": t.description,
                                            "parameters": t.parameters}}
                              for t in tools]} if tools else {}),
            )
        except self._transient as exc:
            # With the ``retry-after`` the server sent; every other API error (401, 403,
            # 404, 400, 422, ...) is a configuration error.
            response = getattr(exc, "response", None)
            raise VendorUnavailable(
                _describe(exc), who=VENDOR,
                retry_after=None if response is None else retry_after(response.headers),
            ) from None
        except self._config as exc:
            raise VendorConfigError(_describe(exc), who=VENDOR) from None
        return _turn(reply)

    def tool_results(self, results: Sequence[ToolResult]) -> list[Any]:
        # Chat Completions has no error flag on a tool message; the loop's
        # result text already says "error:" or gives the exit code.
        return [{"role": "tool", "tool_call_id": r.call_id, "content": r.text} for r in results]

    def close(self) -> None:
        self._client.close()


def _turn(reply: Any) -> Turn:
    if not reply.choices:
        # A compatible server that answered with no choice said nothing.
        return Turn(text="", tool_calls=(), stop=TurnStop.OTHER, vendor_stop=None,
                    usage=_usage(reply.usage), message={"role": "assistant", "content": ""},
                    model=reply.model)
    choice = reply.choices[0]
    message = choice.message
    calls: list[ToolCall] = []
    sent: list[dict[str, Any]] = []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)
        if function is None:
            # A tool type the loop never offered (a custom tool): answered as unknown.
            calls.append(ToolCall(id=call.id, name=str(call.type), arguments=None))
            sent.append(call.model_dump(mode="json", exclude_none=True))
            continue
        calls.append(ToolCall(id=call.id, name=function.name,
                              arguments=_arguments(function.arguments)))
        sent.append({"id": call.id, "type": "function",
                     "function": {"name": function.name, "arguments": function.arguments}})
    stop = _STOPS.get(choice.finish_reason or "", TurnStop.OTHER)
    if calls and stop is TurnStop.END:
        # Some compatible servers (Ollama's, for one) finish a turn that calls tools with "stop".
        stop = TurnStop.TOOL_USE
    detail = ""
    if message.refusal:
        stop, detail = TurnStop.REFUSAL, message.refusal
    elif stop is TurnStop.REFUSAL:
        detail = "the reply was withheld by the content filter"
    assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
    if sent:
        assistant["tool_calls"] = sent
    return Turn(
        text=message.content or "",
        tool_calls=tuple(calls),
        stop=stop,
        vendor_stop=choice.finish_reason,
        usage=_usage(reply.usage),
        message=assistant,
        model=reply.model,
        detail=detail,
    )


def _arguments(raw: str | None) -> dict[str, Any] | None:
    """The call's arguments: a JSON object encoded as a string, or None."""
    try:
        decoded = json.loads(raw or "")
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


def _usage(usage: Any) -> TokenUsage | None:
    """Tokens of the reply; None when the server sent no counts (local servers may not)."""
    if usage is None or usage.prompt_tokens is None or usage.completion_tokens is None:
        return None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    # prompt_tokens already includes cached reads; completion_tokens includes reasoning.
    return TokenUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                      cached_tokens=cached)


def _describe(exc: BaseException) -> str:
    return describe(exc, status=getattr(exc, "status_code", None),
                    message=getattr(exc, "message", None))


def make_openai(*, model: str | None = None, base_url: str | None = None,
                price_file: Mapping[str, FilePrice] | None = None,
                environ: Mapping[str, str] | None = None, **loop: Any) -> LoopAgent:
    """An OpenAI (or OpenAI-compatible) agent; refuses (``UsageError``) without the SDK,
    or without a key when it would talk to OpenAI itself, before any run.

    With ``base_url`` a missing key is allowed and ``NO_KEY`` is sent instead.
    ``loop`` passes ``retry``, ``sleep``, ``clock`` and ``rng`` to ``LoopAgent``.
    """
    import_sdk()
    if base_url is None:
        key = require_key(VENDOR, agent="openai", environ=environ)
    else:
        key = read_key(VENDOR, environ) or NO_KEY
    chosen = model or DEFAULT_MODEL
    return LoopAgent(
        name="openai", model=chosen,
        make_client=lambda: OpenAIClient(model=chosen, api_key=key, base_url=base_url),
        pricing=price_for(VENDOR, chosen, price_file), **loop)
