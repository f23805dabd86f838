"""The vendor contract's table: each wire format's way of saying the same scenario.

The contract suite (tests/agents/test_vendor_contract.py) writes each scenario once and
asks a ``WireFormat`` for the vendor's replies, the tool results its SDK sent back, and
the few facts that differ by vendor (error texts, how tokens are counted). What only one
vendor has (Gemini's id-less calls, OpenAI's ``max_tokens`` naming) stays in that vendor's
own test module; the checks of its first request and of its multi-turn usage live here,
beside its replies, as ``check_wire`` and ``check_usage``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from firstrun.agents.loop import LoopAgent
from firstrun.agents.prompt import SYSTEM_PROMPT
from firstrun.run.events import ModelTurn
from support import anthropic_wire, gemini_wire, openai_wire
from support.agents import (
    DOCS,
    GEMINI_KEY,
    OPENAI_KEY,
    TEST_KEY,
    claude,
    gemini_agent,
    openai_agent,
)
from support.vendor import Reply, Request, Script

GREET = "printf 'hello, reader\\n' > greeting.txt"
# A call is a vendor's own dict (a tool_use block, a tool call, a functionCall part).
Call = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """One way a vendor refuses, and what the run records of it."""

    id: str
    reply: Callable[[], Reply]
    detail: str
    vendor_stop: str


@dataclass(frozen=True, kw_only=True)
class WireFormat:
    name: str  # the agent's name, as the run records it
    vendor: str  # the usage's vendor
    model: str
    agent: Callable[..., LoopAgent]  # agent(url, *, sleeps=None, price=..., **loop)
    key: str
    key_variable: str  # the environment variable firstrun reads the key from
    reply: Callable[..., Reply]  # reply(text or None, *calls, tokens=(in, out), cached=0)
    bash: Callable[[str], Call]
    read_docs: Callable[[str], Call]
    script: Callable[..., Script]
    results: Callable[[Request], list[str]]  # the text of each tool result the SDK sent back
    api_key: Callable[[Request], str | None]
    first_user_text: Callable[[Request], str]
    rate_limited: Callable[[], Reply]  # asks for a 7 second wait
    failing: Sequence[Reply]  # a retryable failure, then server errors until retries run out
    failed_detail: str
    unreachable_detail: str  # how a run whose server is gone starts its detail
    bad_key: Callable[[], Reply]
    bad_key_detail: tuple[str, str]  # (starts with, contains)
    refusals: Sequence[Refusal]
    multi_turn: Callable[[], Script]  # read the docs, greet, cat, done: tokens as below
    check_wire: Callable[[list[Request]], None]
    check_usage: Callable[[dict[str, Any], list[ModelTurn]], None]
    missing_sdk: tuple[str, str]  # (module, the one-line refusal)


# ---- Anthropic Messages

def _anthropic_reply(text: str | None, *calls: Call, **usage: Any) -> Reply:
    return anthropic_wire.message(*([anthropic_wire.text(text)] if text else []), *calls, **usage)


def _anthropic_wire(requests: list[Request]) -> None:
    # The SDK spoke the real wire format: the key, the prompt, both tools, and
    # each tool result answering its tool_use by id.
    first = requests[0]
    assert first.path == "/v1/messages" and anthropic_wire.api_key(first) == TEST_KEY
    assert first.body["system"] == SYSTEM_PROMPT and first.body["model"] == anthropic_wire.MODEL
    assert [t["name"] for t in first.body["tools"]] == ["bash", "read_docs"]
    assert DOCS in first.body["messages"][0]["content"]
    (page,) = anthropic_wire.tool_results(requests[1])
    assert page["tool_use_id"] == requests[1].body["messages"][1]["content"][1]["id"]
    assert "title: Greeter quickstart" in page["content"] and "is_error" not in page


def _anthropic_usage(usage: dict[str, Any], turns: list[ModelTurn]) -> None:
    assert turns[0].tool_calls == [{"id": turns[0].tool_calls[0]["id"], "name": "read_docs",
                                    "arguments": {"url": DOCS}}]
    assert turns[1].usage == {"input_tokens": 2500, "output_tokens": 40, "cached_tokens": 500,
                              "cache_write_tokens": 0}
    # Usage and spend: 3/15 USD per million tokens, cached reads at 0.3.
    assert usage["turns"] == 4 and usage["model"] == anthropic_wire.MODEL
    assert [t["input_tokens"] for t in usage["per_turn"]] == [1000, 2500, 2500, 2600]
    assert usage["output_tokens"] == 140 and usage["cached_tokens"] == 500
    expected = (Decimal(1000 + 2000 + 2500 + 2600) * 3 + Decimal(500) * Decimal("0.3")
                + Decimal(140) * 15) / 1_000_000
    assert Decimal(usage["spend"]) == expected


def _anthropic_multi_turn() -> Script:
    w = anthropic_wire
    return w.script(
        w.message(w.text("Reading the docs."), w.read_docs(DOCS), tokens=(1000, 50)),
        w.message(w.bash(GREET), tokens=(2000, 40), cached=500),
        w.message(w.bash("cat greeting.txt"), tokens=(2500, 30)),
        w.message(w.text("Done: greeting.txt holds the greeting."), tokens=(2600, 20)),
    )


ANTHROPIC = WireFormat(
    name="claude", vendor="anthropic", model=anthropic_wire.MODEL, agent=claude, key=TEST_KEY,
    key_variable="FIRSTRUN_ANTHROPIC_API_KEY",
    reply=_anthropic_reply, bash=anthropic_wire.bash, read_docs=anthropic_wire.read_docs,
    script=anthropic_wire.script,
    results=lambda r: [b["content"] for b in anthropic_wire.tool_results(r)],
    api_key=anthropic_wire.api_key, first_user_text=anthropic_wire.first_user_text,
    rate_limited=lambda: anthropic_wire.rate_limited(retry_after="7"),
    failing=[anthropic_wire.overloaded(), anthropic_wire.server_error()],
    failed_detail="InternalServerError (HTTP 500)",
    unreachable_detail="anthropic: APIConnectionError",
    bad_key=anthropic_wire.unauthorized,
    bad_key_detail=("anthropic: AuthenticationError (HTTP 401)", "invalid x-api-key"),
    refusals=[Refusal(id="refusal", reply=lambda: anthropic_wire.refusal("This request was flagged."),
                      detail="cyber This request was flagged.", vendor_stop="refusal")],
    multi_turn=_anthropic_multi_turn, check_wire=_anthropic_wire, check_usage=_anthropic_usage,
    missing_sdk=("anthropic",
                 'usage: --agent claude needs the anthropic SDK: pip install "firstrun[claude]"'),
)


# ---- OpenAI Chat Completions

def _openai_wire(requests: list[Request]) -> None:
    # The SDK spoke the real wire format: the key as a bearer token, the
    # prompt as the system message, both tools as functions, the output limit
    # every compatible server knows, and each tool message answering its call by id.
    first = requests[0]
    assert first.path == "/v1/chat/completions" and openai_wire.api_key(first) == OPENAI_KEY
    system, task = first.body["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert task["role"] == "user" and DOCS in task["content"]
    assert first.body["model"] == openai_wire.MODEL and first.body["max_tokens"] == 8192
    assert "max_completion_tokens" not in first.body
    assert [(t["type"], t["function"]["name"]) for t in first.body["tools"]] == [
        ("function", "bash"), ("function", "read_docs")]
    assert first.body["tools"][0]["function"]["parameters"]["required"] == ["command"]
    assistant = requests[1].body["messages"][2]
    (page,) = openai_wire.tool_results(requests[1])
    assert assistant["role"] == "assistant" and assistant["content"] == "Reading the docs."
    assert page["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == f'{{"url": "{DOCS}"}}'
    assert "title: Greeter quickstart" in page["content"]


def _openai_usage(usage: dict[str, Any], turns: list[ModelTurn]) -> None:
    assert [(t.turn, t.stop, t.vendor_stop) for t in turns] == [
        (1, "tool_use", "tool_calls"), (2, "tool_use", "tool_calls"),
        (3, "tool_use", "tool_calls"), (4, "end", "stop")]
    assert turns[1].usage == {"input_tokens": 2000, "output_tokens": 40, "cached_tokens": 500,
                              "cache_write_tokens": 0}
    # Usage and spend: 2/8 USD per million tokens, cached reads at 0.5.
    assert usage["input_tokens"] == 8100 and usage["output_tokens"] == 140
    assert usage["cached_tokens"] == 500 and usage["served_models"] == [openai_wire.MODEL]
    expected = (Decimal(8100 - 500) * 2 + Decimal(500) * Decimal("0.5")
                + Decimal(140) * 8) / 1_000_000
    assert Decimal(usage["spend"]) == expected


def _openai_multi_turn() -> Script:
    w = openai_wire
    return w.script(
        w.completion("Reading the docs.", w.read_docs(DOCS), tokens=(1000, 50)),
        w.completion(None, w.bash(GREET), tokens=(2000, 40), cached=500),
        w.completion(None, w.bash("cat greeting.txt"), tokens=(2500, 30)),
        w.completion("Done: greeting.txt holds the greeting.", tokens=(2600, 20)),
    )


OPENAI = WireFormat(
    name="openai", vendor="openai", model=openai_wire.MODEL, agent=openai_agent, key=OPENAI_KEY,
    key_variable="FIRSTRUN_OPENAI_API_KEY",
    reply=openai_wire.completion, bash=openai_wire.bash, read_docs=openai_wire.read_docs,
    script=openai_wire.script,
    results=lambda r: [m["content"] for m in openai_wire.tool_results(r)],
    api_key=openai_wire.api_key, first_user_text=openai_wire.first_user_text,
    rate_limited=lambda: openai_wire.rate_limited(retry_after="7"),
    failing=[openai_wire.overloaded(), openai_wire.server_error()],
    failed_detail="InternalServerError (HTTP 500)",
    unreachable_detail="openai: APIConnectionError",
    bad_key=openai_wire.unauthorized,
    bad_key_detail=("openai: AuthenticationError (HTTP 401)", "Incorrect API key provided"),
    refusals=[
        Refusal(id="refusal", reply=lambda: openai_wire.refusal("I'm sorry, I can't assist with that."),
                detail="I'm sorry, I can't assist with that.", vendor_stop="stop"),
        Refusal(id="content_filter", reply=openai_wire.content_filtered,
                detail="the reply was withheld by the content filter",
                vendor_stop="content_filter"),
    ],
    multi_turn=_openai_multi_turn, check_wire=_openai_wire, check_usage=_openai_usage,
    missing_sdk=("openai",
                 'usage: --agent openai needs the openai SDK: pip install "firstrun[openai]"'),
)


# ---- Gemini generateContent

def _gemini_reply(text: str | None, *calls: Call, **usage: Any) -> Reply:
    return gemini_wire.response(*([gemini_wire.text(text)] if text else []), *calls, **usage)


def _gemini_result(response: dict[str, Any]) -> str:
    # A command that exited non-zero is reported under "error".
    answer = response["response"]
    return str(answer.get("output", answer.get("error")))


_GEMINI_FIRST_CALL = gemini_wire.read_docs(DOCS)


def _gemini_multi_turn() -> Script:
    w = gemini_wire
    return w.script(
        w.response(w.text("Reading the docs."), _GEMINI_FIRST_CALL, tokens=(1000, 50), thoughts=30),
        # A call without an id, as the API may send: answered by name alone.
        w.response(w.bash(GREET, with_id=False), tokens=(2000, 40), cached=500),
        w.response(w.bash("cat greeting.txt"), tokens=(2500, 30)),
        w.response(w.text("Done: greeting.txt holds the greeting."), tokens=(2600, 20)),
    )


def _gemini_wire(requests: list[Request]) -> None:
    first = requests[0]
    assert first.path.endswith(f"/models/{gemini_wire.MODEL}:generateContent")
    assert gemini_wire.api_key(first) == GEMINI_KEY
    assert first.body["systemInstruction"]["parts"] == [{"text": SYSTEM_PROMPT}]
    assert DOCS in gemini_wire.first_user_text(first)
    assert first.body["generationConfig"]["maxOutputTokens"] == 8192
    (declarations,) = [t["functionDeclarations"] for t in first.body["tools"]]
    assert [d["name"] for d in declarations] == ["bash", "read_docs"]
    # The model's turn went back as it came, thought signature included, and
    # the result answers the call by its id.
    assert requests[1].body["contents"][1] == {"role": "model", "parts": [
        {"text": "Reading the docs."}, _GEMINI_FIRST_CALL]}
    (page,) = gemini_wire.function_responses(requests[1])
    assert page["id"] == _GEMINI_FIRST_CALL["functionCall"]["id"] and page["name"] == "read_docs"
    assert "title: Greeter quickstart" in page["response"]["output"]
    (greet,) = gemini_wire.function_responses(requests[2])
    assert "id" not in greet and greet["name"] == "bash"


def _gemini_usage(usage: dict[str, Any], turns: list[ModelTurn]) -> None:
    assert [(t.turn, t.stop, t.vendor_stop) for t in turns] == [
        (1, "tool_use", "STOP"), (2, "tool_use", "STOP"), (3, "tool_use", "STOP"),
        (4, "end", "STOP")]
    # Thinking is billed as output; promptTokenCount already holds cached tokens.
    assert turns[0].usage == {"input_tokens": 1000, "output_tokens": 80, "cached_tokens": 0,
                              "cache_write_tokens": 0}
    assert turns[1].usage["cached_tokens"] == 500
    assert usage["input_tokens"] == 8100 and usage["output_tokens"] == 170
    expected = (Decimal(8100 - 500) * 1 + Decimal(500) * Decimal("0.25")
                + Decimal(170) * 4) / 1_000_000
    assert Decimal(usage["spend"]) == expected


GEMINI = WireFormat(
    name="gemini", vendor="google", model=gemini_wire.MODEL, agent=gemini_agent, key=GEMINI_KEY,
    key_variable="FIRSTRUN_GEMINI_API_KEY",
    reply=_gemini_reply, bash=gemini_wire.bash, read_docs=gemini_wire.read_docs,
    script=gemini_wire.script,
    results=lambda r: [_gemini_result(f) for f in gemini_wire.function_responses(r)],
    api_key=gemini_wire.api_key, first_user_text=gemini_wire.first_user_text,
    rate_limited=lambda: gemini_wire.rate_limited(delay="7s"),
    failing=[gemini_wire.unavailable(), gemini_wire.server_error()],
    failed_detail="ServerError (HTTP 500): INTERNAL An internal error",
    unreachable_detail="google: ConnectError",
    bad_key=gemini_wire.bad_key,
    bad_key_detail=("google: ClientError (HTTP 400): INVALID_ARGUMENT API key not valid",
                    "API key not valid"),
    refusals=[
        Refusal(id="blocked_prompt", reply=lambda: gemini_wire.blocked_prompt("PROHIBITED_CONTENT"),
                detail="PROHIBITED_CONTENT", vendor_stop="PROHIBITED_CONTENT"),
        Refusal(id="safety", reply=gemini_wire.safety_stop,
                detail="SAFETY HARM_CATEGORY_DANGEROUS_CONTENT", vendor_stop="SAFETY"),
        Refusal(id="recitation",
                reply=lambda: gemini_wire.response(gemini_wire.text("Once upon"),
                                                   finish_reason="RECITATION"),
                detail="RECITATION", vendor_stop="RECITATION"),
    ],
    multi_turn=_gemini_multi_turn, check_wire=_gemini_wire, check_usage=_gemini_usage,
    missing_sdk=("google.genai", 'usage: --agent gemini needs the google-genai SDK: '
                                 'pip install "firstrun[gemini]"'),
)

WIRE_FORMATS: tuple[WireFormat, ...] = (ANTHROPIC, OPENAI, GEMINI)
