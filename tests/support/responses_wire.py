"""The OpenAI Responses API wire format, streamed, as the scripted server speaks it.

Shapes follow the API's documented streaming events: ``response.created``,
then per output item ``response.output_item.added``, its content or argument
deltas and ``response.output_item.done``, then ``response.completed`` whose
``response`` carries every output item and ``usage`` (``input_tokens``,
``input_tokens_details.cached_tokens``, ``output_tokens``,
``output_tokens_details.reasoning_tokens``). Output items are ``message``
(``output_text`` content) and ``function_call`` (``call_id``, ``name``,
``arguments`` as a JSON string, and ``namespace`` for a tool in one, as an MCP
server's tools are). Errors are ``{"error": {"message", "type", "param",
"code"}}`` with the API's status codes, never streamed.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from support.vendor import Reply, Request, Script

MODEL = "gpt-test-1"
_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": value, "annotations": []}]}


def call(name: str, *, namespace: str | None = None, **arguments: Any) -> dict[str, Any]:
    item = {"type": "function_call", "status": "completed", "call_id": f"call_{next(_ids):04d}",
            "name": name, "arguments": json.dumps(arguments)}
    if namespace is not None:
        item["namespace"] = namespace
    return item


def response(*output: dict[str, Any], tokens: tuple[int, int] = (100, 20),
             cached: int = 0) -> Reply:
    """One streamed response holding ``output``; its items' ids name the response, so a
    later request's input says which responses the conversation already holds."""
    rid = f"resp_{next(_ids):06d}"
    items = [{**item, "id": f"{'msg' if item['type'] == 'message' else 'fc'}_{rid}_{i}"}
             for i, item in enumerate(output)]
    base = {"id": rid, "object": "response", "created_at": 1_767_225_600, "model": MODEL,
            "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str, Any]] = [("response.created",
                                      {"type": "response.created", "response": base})]
    for index, item in enumerate(items):
        if item["type"] == "message":
            opened = {**item, "status": "in_progress", "content": []}
            value = item["content"][0]["text"]
            deltas = [("response.content_part.added",
                       {"type": "response.content_part.added", "item_id": item["id"],
                        "output_index": index, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}}),
                      ("response.output_text.delta",
                       {"type": "response.output_text.delta", "item_id": item["id"],
                        "output_index": index, "content_index": 0, "delta": value}),
                      ("response.output_text.done",
                       {"type": "response.output_text.done", "item_id": item["id"],
                        "output_index": index, "content_index": 0, "text": value}),
                      ("response.content_part.done",
                       {"type": "response.content_part.done", "item_id": item["id"],
                        "output_index": index, "content_index": 0,
                        "part": item["content"][0]})]
        else:
            opened = {**item, "status": "in_progress", "arguments": ""}
            deltas = [("response.function_call_arguments.delta",
                       {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                        "output_index": index, "delta": item["arguments"]}),
                      ("response.function_call_arguments.done",
                       {"type": "response.function_call_arguments.done", "item_id": item["id"],
                        "output_index": index, "arguments": item["arguments"]})]
        events += [("response.output_item.added", {"type": "response.output_item.added",
                                                    "output_index": index, "item": opened}),
                   *deltas,
                   ("response.output_item.done", {"type": "response.output_item.done",
                                                   "output_index": index, "item": item})]
    usage = {"input_tokens": tokens[0], "input_tokens_details": {"cached_tokens": cached},
             "output_tokens": tokens[1], "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": tokens[0] + tokens[1]}
    events.append(("response.completed", {"type": "response.completed", "response": {
        **base, "status": "completed", "output": items, "usage": usage}}))
    seq = [(name, {**data, "sequence_number": n}) for n, (name, data) in enumerate(events)]
    return Reply(status=200, headers={"x-request-id": f"req_{next(_ids):06d}"}, events=seq)


def error(status: int, kind: str, code: str | None, detail: str) -> Reply:
    return Reply(status=status, headers={"x-request-id": f"req_{next(_ids):06d}"},
                 body={"error": {"message": detail, "type": kind, "param": None, "code": code}})


def unauthorized() -> Reply:
    return error(401, "invalid_request_error", "invalid_api_key", "Incorrect API key provided.")


def server_error() -> Reply:
    return error(500, "server_error", None, "The server had an error processing your request.")


def api_key(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def model_turns(request: Request) -> int:
    """How many of this server's responses the request's input already holds (their
    output items come back with the ids ``response`` gave them)."""
    given = (request.body or {}).get("input", [])
    items = given if isinstance(given, list) else []
    seen = {str(item.get("id", "")).split("_", 1)[1].rsplit("_", 1)[0] for item in items
            if str(item.get("id", "")).startswith(("fc_resp_", "msg_resp_"))}
    return len(seen)


def function_outputs(request: Request) -> list[dict[str, Any]]:
    """The function_call_output items of the request's input, in order."""
    given = (request.body or {}).get("input", [])
    return [item for item in (given if isinstance(given, list) else [])
            if item.get("type") == "function_call_output"]


def script(*steps: Reply | list[Reply]) -> Script:
    return Script(steps, turn_of=model_turns)
