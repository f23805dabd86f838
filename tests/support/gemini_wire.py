"""The Gemini API generateContent wire format, as the scripted server speaks it.

Shapes follow the API's documented JSON: a ``GenerateContentResponse`` with
``candidates`` (``content.parts`` of ``text`` and ``functionCall``, with a
``thoughtSignature`` on a call as thinking models send, a ``finishReason``),
``promptFeedback.blockReason`` for a blocked prompt, ``usageMetadata`` (zero
counts left out, as proto3 JSON does) and ``modelVersion``. Errors are
``{"error": {"code", "message", "status", "details"}}`` with the statuses
the API uses: 429 ``RESOURCE_EXHAUSTED`` with a ``RetryInfo`` detail, 500
``INTERNAL``, 503 ``UNAVAILABLE``, and 400 ``INVALID_ARGUMENT`` with
``API_KEY_INVALID`` for a bad key. ``streaming`` serves streamGenerateContent
(``alt=sse``): data-only server-sent events, one response chunk each.
"""

from __future__ import annotations

import base64
import itertools
from typing import Any

from support.vendor import Reply, Request, Responder, Script

MODEL = "gemini-test-1"
_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"text": value}


def call(name: str, *, with_id: bool = True, **args: Any) -> dict[str, Any]:
    """A functionCall part, signed as a thinking model signs it."""
    n = next(_ids)
    function: dict[str, Any] = {"name": name, "args": args}
    if with_id:
        function["id"] = f"fc_{n:04d}"
    return {"functionCall": function,
            "thoughtSignature": base64.b64encode(f"signature-{n}".encode()).decode()}


def bash(command: str, **kwargs: Any) -> dict[str, Any]:
    return call("bash", command=command, **kwargs)


def read_docs(url: str, **kwargs: Any) -> dict[str, Any]:
    return call("read_docs", url=url, **kwargs)


def response(*parts: dict[str, Any], finish_reason: str = "STOP",
             tokens: tuple[int, int] | None = (100, 20), cached: int = 0,
             thoughts: int = 0) -> Reply:
    candidate: dict[str, Any] = {"finishReason": finish_reason, "index": 0}
    if parts:
        candidate["content"] = {"role": "model", "parts": list(parts)}
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL,
                            "responseId": f"resp-{next(_ids):06d}"}
    if tokens is not None:
        body["usageMetadata"] = _usage(tokens, cached, thoughts)
    return Reply(body=body)


def _usage(tokens: tuple[int, int], cached: int, thoughts: int) -> dict[str, Any]:
    usage: dict[str, Any] = {"promptTokenCount": tokens[0],
                             "totalTokenCount": tokens[0] + tokens[1] + thoughts,
                             "promptTokensDetails": [{"modality": "TEXT",
                                                      "tokenCount": tokens[0]}]}
    # proto3 JSON leaves zero counts out.
    for key, value in (("candidatesTokenCount", tokens[1]), ("cachedContentTokenCount", cached),
                       ("thoughtsTokenCount", thoughts)):
        if value:
            usage[key] = value
    return usage


def blocked_prompt(reason: str = "PROHIBITED_CONTENT") -> Reply:
    """A prompt the API refused to answer: feedback, usage, and no candidate."""
    return Reply(body={"promptFeedback": {"blockReason": reason},
                       "usageMetadata": _usage((120, 0), 0, 0), "modelVersion": MODEL,
                       "responseId": f"resp-{next(_ids):06d}"})


def safety_stop() -> Reply:
    """A candidate stopped for safety: no content, the ratings that stopped it."""
    body = response(finish_reason="SAFETY", tokens=(150, 0)).body
    body["candidates"][0]["safetyRatings"] = [
        {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}]
    return Reply(body=body)


def error(code: int, status: str, message: str,
          details: list[dict[str, Any]] | None = None) -> Reply:
    error_body: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details is not None:
        error_body["details"] = details
    return Reply(status=code, body={"error": error_body})


def rate_limited(delay: str = "7s") -> Reply:
    return error(429, "RESOURCE_EXHAUSTED",
                 "You exceeded your current quota, please check your plan and billing details.",
                 [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}])


def server_error() -> Reply:
    return error(500, "INTERNAL", "An internal error has occurred. Please retry.")


def unavailable() -> Reply:
    return error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")


def bad_key() -> Reply:
    return error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.",
                 [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                   "domain": "googleapis.com",
                   "metadata": {"service": "generativelanguage.googleapis.com"}}])


def api_key(request: Request) -> str | None:
    return request.headers.get("x-goog-api-key")


def model_turns(request: Request) -> int:
    return sum(1 for c in request.body["contents"] if c.get("role") == "model")


def first_user_text(request: Request) -> str:
    return request.body["contents"][0]["parts"][0]["text"]


def function_responses(request: Request) -> list[dict[str, Any]]:
    """The functionResponse parts of the request's last content."""
    last = request.body["contents"][-1]
    return [p["functionResponse"] for p in last.get("parts", ()) if "functionResponse" in p]


def script(*steps: Reply | list[Reply]) -> Script:
    return Script(steps, turn_of=model_turns)


def streamed(reply: Reply) -> Reply:
    """``reply`` as streamGenerateContent sends it: each part in its own chunk, the
    finish reason and the usage on the last. Errors are never streamed."""
    if reply.status != 200:
        return reply
    body = reply.body
    candidate = body["candidates"][0]
    parts = candidate.get("content", {}).get("parts", [])
    head = {k: v for k, v in body.items() if k not in ("candidates", "usageMetadata")}
    chunks = [{**head, "candidates": [{"content": {"role": "model", "parts": [part]},
                                       "index": 0}]} for part in parts[:-1]]
    chunks.append({**body, "candidates": [{**candidate, "content": {
        "role": "model", "parts": parts[-1:]}}]})
    return Reply(status=200, headers=reply.headers, events=[("", chunk) for chunk in chunks])


def streaming(responder: Responder) -> Responder:
    """``responder``, its replies streamed to streamGenerateContent."""
    def answer(request: Request) -> Reply:
        reply = responder(request)
        return streamed(reply) if ":streamGenerateContent" in request.path else reply
    return answer
