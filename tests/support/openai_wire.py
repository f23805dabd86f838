"""The OpenAI Chat Completions wire format, as the scripted server speaks it.

Shapes follow the API's documented JSON: a ``chat.completion`` object with
one choice whose ``message`` carries ``content``, ``tool_calls`` (type
``function``, arguments as a JSON string) and ``refusal``, a
``finish_reason``, and ``usage`` with ``prompt_tokens_details.cached_tokens``.
Errors are ``{"error": {"message", "type", "param", "code"}}`` with the
status codes the API uses (429 ``rate_limit_exceeded`` with ``retry-after``,
500 ``server_error``, 503 overloaded, 401 ``invalid_api_key``). ``local``
replies leave out what a local OpenAI-compatible server may not send:
``usage``, ``refusal``, ``system_fingerprint``.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from support.vendor import Reply, Request, Script

MODEL = "gpt-test-1"
_ids = itertools.count(1)


def tool_call(name: str, arguments: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """A function tool call; ``arguments`` raw (to send a bad one) or built from kwargs."""
    return {"id": f"call_{next(_ids):04d}", "type": "function",
            "function": {"name": name,
                         "arguments": arguments if arguments is not None else json.dumps(kwargs)}}


def bash(command: str) -> dict[str, Any]:
    return tool_call("bash", command=command)


def read_docs(url: str) -> dict[str, Any]:
    return tool_call("read_docs", url=url)


def completion(text: str | None = None, *calls: dict[str, Any], finish_reason: str | None = None,
               tokens: tuple[int, int] | None = (100, 20), cached: int = 0,
               refusal: str | None = None, local: bool = False) -> Reply:
    """One chat.completion; ``tokens=None`` (or ``local``) sends no ``usage`` at all."""
    if finish_reason is None:
        finish_reason = "tool_calls" if calls else "stop"
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    if not local:
        message["refusal"] = refusal
        message["annotations"] = []
    body: dict[str, Any] = {
        "id": f"chatcmpl-{next(_ids):06d}",
        "object": "chat.completion",
        "created": 1_767_225_600,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason}],
    }
    if not local:
        body["service_tier"] = "default"
        body["system_fingerprint"] = "fp_test"
    if tokens is not None and not local:
        body["usage"] = {
            "prompt_tokens": tokens[0], "completion_tokens": tokens[1],
            "total_tokens": tokens[0] + tokens[1],
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0,
                                          "rejected_prediction_tokens": 0},
        }
    return Reply(body=body, headers={"x-request-id": f"req_{next(_ids):06d}"})


def refusal(text: str) -> Reply:
    """A structured refusal: no content, the refusal in its own field, finish "stop"."""
    return completion(None, refusal=text)


def content_filtered() -> Reply:
    return completion(None, finish_reason="content_filter")


def error(status: int, kind: str, detail: str, *, code: str | None = None,
          retry_after: str | None = None) -> Reply:
    headers = {"x-request-id": f"req_{next(_ids):06d}"}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return Reply(status=status, headers=headers,
                 body={"error": {"message": detail, "type": kind, "param": None, "code": code}})


def rate_limited(retry_after: str = "7") -> Reply:
    return error(429, "requests", "Rate limit reached for requests", code="rate_limit_exceeded",
                 retry_after=retry_after)


def server_error() -> Reply:
    return error(500, "server_error",
                 "The server had an error while processing your request. Sorry about that!")


def overloaded() -> Reply:
    return error(503, "server_error", "The engine is currently overloaded, please try again later")


def unauthorized() -> Reply:
    return error(401, "invalid_request_error", "Incorrect API key provided: sk-tes***key.",
                 code="invalid_api_key")


def api_key(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def model_turns(request: Request) -> int:
    """How many assistant turns the request's conversation already holds."""
    return sum(1 for m in request.body["messages"] if m["role"] == "assistant")


def first_user_text(request: Request) -> str:
    return next(m["content"] for m in request.body["messages"] if m["role"] == "user")


def tool_results(request: Request) -> list[dict[str, Any]]:
    """The tool messages that end the request's conversation."""
    found: list[dict[str, Any]] = []
    for m in reversed(request.body["messages"]):
        if m["role"] != "tool":
            break
        found.insert(0, m)
    return found


def script(*steps: Reply | list[Reply]) -> Script:
    return Script(steps, turn_of=model_turns)
