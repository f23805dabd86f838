"""The Anthropic Messages API wire format, as the scripted server speaks it.

Shapes follow the API's documented JSON: a ``message`` object with
``content`` blocks (``text``, ``tool_use``), ``stop_reason``,
``stop_details`` for a refusal, and ``usage`` with the cache fields; errors
are ``{"type": "error", "error": {"type", "message"}, "request_id"}`` with
the status codes the API uses (429 with ``retry-after``, 500 ``api_error``,
529 ``overloaded_error``, 401 ``authentication_error``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from support.vendor import Reply, Request, Responder, Script

MODEL = "claude-test-1"
_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": arguments}


def bash(command: str) -> dict[str, Any]:
    return tool_use("bash", command=command)


def read_docs(url: str) -> dict[str, Any]:
    return tool_use("read_docs", url=url)


def message(*content: dict[str, Any], stop_reason: str | None = None, tokens: tuple[int, int] = (100, 20),
            cached: int = 0, stop_details: dict[str, Any] | None = None) -> Reply:
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    body = {
        "id": f"msg_{next(_ids):06d}",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1],
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
                  "service_tier": "standard"},
    }
    if stop_details is not None:
        body["stop_details"] = stop_details
    return Reply(body=body, headers={"request-id": f"req_{next(_ids):06d}"})


def refusal(explanation: str) -> Reply:
    return message(text("I can't help with that."), stop_reason="refusal",
                   stop_details={"type": "refusal", "category": "cyber", "explanation": explanation})


def error(status: int, kind: str, detail: str, *, retry_after: str | None = None) -> Reply:
    headers = {"request-id": f"req_{next(_ids):06d}", "x-should-retry": "true"}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return Reply(status=status, headers=headers,
                 body={"type": "error", "error": {"type": kind, "message": detail},
                       "request_id": headers["request-id"]})


def rate_limited(retry_after: str = "7") -> Reply:
    return error(429, "rate_limit_error", "Number of requests has exceeded your rate limit.",
                 retry_after=retry_after)


def overloaded() -> Reply:
    return error(529, "overloaded_error", "Overloaded")


def server_error() -> Reply:
    return error(500, "api_error", "Internal server error")


def unauthorized() -> Reply:
    return error(401, "authentication_error", "invalid x-api-key")


def api_key(request: Request) -> str | None:
    """The key the SDK sent: ``x-api-key``, or a bearer token (newer SDKs send that)."""
    if "x-api-key" in request.headers:
        return request.headers["x-api-key"]
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def model_turns(request: Request) -> int:
    """How many assistant turns the request's conversation already holds."""
    return sum(1 for m in request.body["messages"] if m["role"] == "assistant")


def first_user_text(request: Request) -> str:
    first = request.body["messages"][0]["content"]
    return first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)


def tool_results(request: Request) -> list[dict[str, Any]]:
    """The tool_result blocks of the request's last message."""
    last = request.body["messages"][-1]
    if last["role"] != "user" or isinstance(last["content"], str):
        return []
    return [b for b in last["content"] if b["type"] == "tool_result"]


def script(*steps: Reply | list[Reply]) -> Script:
    return Script(steps, turn_of=model_turns)


def streamed(reply: Reply) -> Reply:
    """``reply`` as the API streams it when asked to (``"stream": true``): its message as
    message_start, one start/delta/stop per content block, message_delta (the output
    tokens and the stop reason) and message_stop. Errors are never streamed."""
    if reply.status != 200:
        return reply
    body = dict(reply.body)
    content, usage = body.pop("content"), body["usage"]
    start = {**body, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[tuple[str, Any]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(content):
        if block["type"] == "text":
            opened, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [("content_block_start", {"type": "content_block_start", "index": index,
                                            "content_block": opened}),
                   ("content_block_delta", {"type": "content_block_delta", "index": index,
                                            "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": index})]
    events += [("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                                  "usage": {"output_tokens": usage["output_tokens"]}}),
               ("message_stop", {"type": "message_stop"})]
    return Reply(status=200, headers=reply.headers, events=events)


def streaming(responder: Responder) -> Responder:
    """``responder``, its replies streamed to a request that asks for a stream."""
    def answer(request: Request) -> Reply:
        reply = responder(request)
        return streamed(reply) if (request.body or {}).get("stream") else reply
    return answer
