"""``--agent gemini``: the shared tool-use loop over the Gemini API's generateContent.

Guarantee: the ``google-genai`` SDK is imported only when a Gemini agent is made
(without it, a one-line ``UsageError`` names the extra). The client is the Gemini
Developer API, never Vertex AI, and the key goes to it alone; the loop's retries
are the only ones, and every function call comes back to the loop. A 429, 408,
5xx or connection failure is ``VendorUnavailable``, any other API error
``VendorConfigError``; a blocked prompt or a safety stop is ``TurnStop.REFUSAL``.
"""

from __future__ import annotations

import importlib
import itertools
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

# genai-prices files Gemini's prices under "google"; keys.py reads GEMINI_* keys.
VENDOR = "google"
KEYS = "gemini"
# The model the SDK's own documentation uses, which genai-prices prices.
DEFAULT_MODEL = "gemini-3.8-flash"

# Finish reasons that mean the vendor withheld the reply: a refusal.
_REFUSALS = frozenset({
    "SAFETY", "RECITATION", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION", "MODEL_ARMOR",
})
_STOPS = {"STOP": TurnStop.END, "MAX_TOKENS": TurnStop.MAX_OUTPUT}
# Client errors that are transient all the same: a rate limit, a request timeout.
_TRANSIENT_STATUS = frozenset({408, 429})
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def import_sdk() -> ModuleType:
    try:
        # Imported by its full name, so the import system (not an attribute
        # left on the google namespace package) decides whether it is there.
        genai = importlib.import_module("google.genai")
    except ImportError:
        raise UsageError(
            '--agent gemini needs the google-genai SDK: pip install "firstrun[gemini]"') from None
    return genai


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP libraries' network errors; the SDK uses httpx, or httpx2 when installed."""
    import httpx

    found: list[type[BaseException]] = [httpx.TransportError]
    try:
        import httpx2
    except ImportError:
        pass
    else:
        found.append(httpx2.TransportError)
    return tuple(found)


class GeminiClient:
    """A ``VendorClient`` over ``genai.Client().models.generate_content`` (non-streaming)."""

    vendor = VENDOR

    def __init__(self, *, model: str, api_key: str, base_url: str | None = None) -> None:
        genai = import_sdk()
        from google.genai import errors, types

        self.model = model
        self._types = types
        # Never Vertex AI, whatever the environment says; the SDK's retries off, so
        # the loop's, held to the run's wall budget, are the only ones.
        self._client = genai.Client(
            api_key=api_key, vertexai=False,
            http_options=types.HttpOptions(base_url=base_url, retry_options=None))
        self._api_error: type[BaseException] = errors.APIError
        self._server_error: type[BaseException] = errors.ServerError
        self._network = _transport_errors()
        # Ids this client made up for calls the API sent without one; their
        # responses go back by name alone, as the API expects then.
        self._made_up: set[str] = set()
        self._ids = itertools.count(1)

    def user_message(self, text: str) -> Any:
        types = self._types
        return types.Content(role="user", parts=[types.Part(text=text)])

    def send(self, *, system: str, conversation: Sequence[Any], tools: Sequence[ToolSpec],
             max_output_tokens: int, timeout: float) -> Turn:
        types = self._types
        config = types.GenerateContentConfig(
            system_instruction=system,
            # None when no tool is offered (a one-off call, a suggestion).
            tools=[types.Tool(function_declarations=[
                types.FunctionDeclaration(name=t.name, description=t.description,
                                          parameters_json_schema=t.parameters)
                for t in tools])] if tools else None,
            max_output_tokens=max_output_tokens,
            # Off, so every function call comes back to the loop.
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
            # HttpOptions.timeout is in milliseconds.
            http_options=types.HttpOptions(timeout=max(1, int(timeout * 1000))),
        )
        try:
            reply = self._client.models.generate_content(
                model=self.model, contents=list(conversation), config=config)
        except self._network as exc:
            raise VendorUnavailable(describe(exc, status=None, message=None),
                                    who=VENDOR) from None
        except self._api_error as exc:
            code = getattr(exc, "code", None)
            text = describe(exc, status=code, message=_message(exc))
            if isinstance(exc, self._server_error) or code in _TRANSIENT_STATUS:
                # With the wait the server asked for, in a ``retry-after`` header or a
                # ``RetryInfo`` detail.
                raise VendorUnavailable(text, who=VENDOR, retry_after=_wait(exc)) from None
            raise VendorConfigError(text, who=VENDOR) from None
        return self._turn(reply)

    def tool_results(self, results: Sequence[ToolResult]) -> list[Any]:
        # All the answers to one turn's calls go back in one user turn.
        types = self._types
        parts = []
        for r in results:
            call_id = None if r.call_id in self._made_up else r.call_id
            # Gemini's convention: "output" for a result, "error" for a failure.
            response = {"error" if r.is_error else "output": r.text}
            parts.append(types.Part(function_response=types.FunctionResponse(
                id=call_id, name=r.name, response=response)))
        return [types.Content(role="user", parts=parts)]

    def close(self) -> None:
        self._client.close()

    def _turn(self, reply: Any) -> Turn:
        types = self._types
        usage = _usage(reply.usage_metadata)
        feedback = reply.prompt_feedback
        if not reply.candidates:
            blocked = _name(feedback.block_reason) if feedback is not None else None
            detail = " ".join(part for part in (
                blocked, *(_blocked(feedback.safety_ratings) if feedback is not None else ()),
                feedback.block_reason_message if feedback is not None else None) if part)
            return Turn(text="", tool_calls=(), stop=TurnStop.REFUSAL if blocked else TurnStop.OTHER,
                        vendor_stop=blocked, usage=usage,
                        message=types.Content(role="model", parts=[]), model=reply.model_version,
                        detail=detail or ("the prompt was blocked" if blocked else ""))
        candidate = reply.candidates[0]
        content = candidate.content if candidate.content is not None else types.Content(
            role="model", parts=[])
        texts: list[str] = []
        calls: list[ToolCall] = []
        for part in content.parts or ():
            if part.function_call is not None:
                call = part.function_call
                call_id = call.id
                if not call_id:
                    call_id = f"gemini-call-{next(self._ids)}"
                    self._made_up.add(call_id)
                arguments = call.args if isinstance(call.args, dict) else None
                calls.append(ToolCall(id=call_id, name=call.name or "", arguments=arguments))
            elif part.text and not part.thought:
                texts.append(part.text)
        finish = _name(candidate.finish_reason)
        if finish in _REFUSALS:
            stop = TurnStop.REFUSAL
        elif calls and finish == "STOP":
            stop = TurnStop.TOOL_USE
        else:
            stop = _STOPS.get(finish or "", TurnStop.OTHER)
        detail = ""
        if stop is TurnStop.REFUSAL:
            detail = " ".join(p for p in (finish, *_blocked(candidate.safety_ratings)) if p)
        return Turn(
            text="\n".join(texts),
            tool_calls=tuple(calls),
            stop=stop,
            vendor_stop=finish,
            usage=usage,
            # Sent back as it came, thought signatures included: Gemini's thinking models
            # require them.
            message=content,
            model=reply.model_version,
            detail=detail,
        )


def _name(value: Any) -> str | None:
    """An enum's wire name (the SDK gives a plain string for a value it does not know)."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


def _blocked(ratings: Any) -> list[str]:
    """The harm categories whose safety rating blocked the reply."""
    return [str(_name(r.category)) for r in ratings or () if r.blocked and r.category is not None]


def _usage(metadata: Any) -> TokenUsage | None:
    """Tokens of the reply; None when it carried no usageMetadata.

    A zero count is left out of the JSON (proto3), so a missing field is 0.
    promptTokenCount includes cached tokens; thinking is billed as output.
    """
    if metadata is None:
        return None
    return TokenUsage(
        input_tokens=metadata.prompt_token_count or 0,
        output_tokens=(metadata.candidates_token_count or 0) + (metadata.thoughts_token_count or 0),
        cached_tokens=metadata.cached_content_token_count or 0,
    )


def _message(exc: BaseException) -> str | None:
    status = getattr(exc, "status", None)
    message = getattr(exc, "message", None)
    return " ".join(part for part in (status, message) if part) or None


def _wait(exc: BaseException) -> float | None:
    """The wait the server asked for: a retry-after header, else a RetryInfo detail."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is not None:
        waited = retry_after(headers)
        if waited is not None:
            return waited
    body = getattr(exc, "details", None)
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and detail.get("@type") == _RETRY_INFO:
            return _seconds(detail.get("retryDelay"))
    return None


def _seconds(duration: Any) -> float | None:
    """A protobuf Duration in its JSON form ("7s", "0.5s"), as seconds."""
    if not isinstance(duration, str) or not duration.endswith("s"):
        return None
    try:
        return max(0.0, float(duration[:-1]))
    except ValueError:
        return None


def make_gemini(*, model: str | None = None, base_url: str | None = None,
                price_file: Mapping[str, FilePrice] | None = None,
                environ: Mapping[str, str] | None = None, **loop: Any) -> LoopAgent:
    """A Gemini agent; refuses (``UsageError``) without the SDK or a key, before any run.

    ``loop`` passes ``retry``, ``sleep``, ``clock`` and ``rng`` to ``LoopAgent``.
    """
    import_sdk()
    key = require_key(KEYS, agent="gemini", environ=environ)
    chosen = model or DEFAULT_MODEL
    return LoopAgent(
        name="gemini", model=chosen,
        make_client=lambda: GeminiClient(model=chosen, api_key=key, base_url=base_url),
        pricing=price_for(VENDOR, chosen, price_file), **loop)
