"""The scripted server's streamGenerateContent, held to the official google-genai SDK:
what the SDK makes of a streamed reply is what the unstreamed one says."""

from __future__ import annotations

from typing import Any

import pytest

import support.gemini_wire as wire
from support.vendor import VendorServer

genai = pytest.importorskip("google.genai")


def client(url: str) -> Any:
    from google.genai import types

    return genai.Client(api_key="firstrun-test-key",
                        http_options=types.HttpOptions(base_url=url, retry_options=None))


def test_a_streamed_reply_is_its_parts_in_chunks_with_usage_on_the_last() -> None:
    served = wire.streaming(wire.script(
        wire.response(wire.text("Reading."), wire.bash("ls"), tokens=(120, 30), cached=40)))
    with VendorServer(served) as server:
        sdk = client(server.url)
        chunks = list(sdk.models.generate_content_stream(model=wire.MODEL, contents="hi"))
        (request,) = server.seen()
    assert request.path.endswith(f"/models/{wire.MODEL}:streamGenerateContent?alt=sse")
    assert wire.api_key(request) == "firstrun-test-key"
    assert [c.text for c in chunks[:1]] == ["Reading."]
    (call,) = chunks[-1].function_calls
    assert (call.name, call.args) == ("bash", {"command": "ls"})
    assert chunks[-1].candidates[0].finish_reason == "STOP"
    usage = chunks[-1].usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count,
            usage.cached_content_token_count) == (120, 30, 40)
    assert all(c.usage_metadata is None for c in chunks[:-1])


def test_an_error_is_never_streamed() -> None:
    from google.genai import errors

    with VendorServer(wire.streaming(wire.script(wire.bad_key()))) as server:
        sdk = client(server.url)
        with pytest.raises(errors.ClientError) as raised:
            list(sdk.models.generate_content_stream(model=wire.MODEL, contents="hi"))
    assert raised.value.code == 400 and "API key not valid" in str(raised.value)


def test_unstreamed_calls_keep_their_plain_reply() -> None:
    with VendorServer(wire.streaming(wire.script(wire.response(wire.text("ok"))))) as server:
        sdk = client(server.url)
        reply = sdk.models.generate_content(model=wire.MODEL, contents="hi")
    assert reply.text == "ok"
