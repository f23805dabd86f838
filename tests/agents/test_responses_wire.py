"""The scripted Responses API server, held to the official ``openai`` SDK: what the SDK
makes of its streamed events and its errors is what the API's own would give, so a
CLI driven by it (Codex) sees the vendor's wire format."""

from __future__ import annotations

import json

import openai
import pytest

import support.responses_wire as wire
from support.vendor import VendorServer

pytestmark = pytest.mark.fast


def client(server: VendorServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)


def test_a_streamed_response_is_its_items_and_usage_to_the_sdk() -> None:
    transcript = wire.script(
        wire.response(wire.text("Reading."), wire.call("read_docs", namespace="mcp__firstrun",
                                                        url="https://docs.example/"),
                      tokens=(120, 30), cached=20),
        wire.response(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        stream = client(server).responses.create(model=wire.MODEL, input="go", stream=True)
        events = list(stream)
        first = events[-1].response
        # The call comes back, as Codex sends it, in the next request's input.
        follow = [*[item.model_dump(exclude_none=True) for item in first.output],
                  {"type": "function_call_output", "call_id": first.output[1].call_id,
                   "output": "page"}]
        second = list(client(server).responses.create(model=wire.MODEL, input=follow,
                                                      stream=True))[-1].response
        seen = server.seen()
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    message, fn = first.output
    assert message.type == "message" and first.output_text == "Reading."
    assert (fn.type, fn.name, fn.namespace) == ("function_call", "read_docs", "mcp__firstrun")
    assert json.loads(fn.arguments) == {"url": "https://docs.example/"}
    usage = first.usage
    assert (usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens) \
        == (120, 30, 20)
    # The script answered the second request with its second step.
    assert second.output_text == "Done."
    assert [wire.model_turns(r) for r in seen] == [0, 1]
    assert wire.api_key(seen[0]) == "sk-test" and seen[0].path == "/v1/responses"
    assert wire.function_outputs(seen[1])[0]["output"] == "page"


def test_an_error_is_the_sdks_own_exception() -> None:
    with VendorServer(wire.script(wire.unauthorized())) as server:
        with pytest.raises(openai.AuthenticationError) as raised:
            list(client(server).responses.create(model=wire.MODEL, input="go", stream=True))
    assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"
