"""What only the OpenAI agent does, through the official ``openai`` SDK against a scripted
Chat Completions server on loopback (what every vendor does is test_vendor_contract.py).

Each transcript is judged by evidence: the requests the server received
(what the SDK sent back as tool messages), the run's trace, and the check's
verdict on the workspace the model's commands changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.agents import make_agent
from firstrun.agents.loop import LoopAgent
from firstrun.agents.openai_agent import DEFAULT_MODEL, make_openai
from firstrun.errors import UsageError
from firstrun.results.model import Classification
from firstrun.run.events import ModelTurn
from firstrun.run.runner import RunConfig
from support import openai_wire as wire
from support.agents import OPENAI_KEY as KEY
from support.agents import agent_commands, greeter_task, run_agent
from support.agents import openai_agent as agent
from support.vendor import VendorServer

pytestmark = pytest.mark.fast

GREET = "printf 'hello, reader\\n' > greeting.txt"


def test_calls_the_loop_cannot_run_are_answered_by_id(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(
        wire.completion(None, wire.tool_call("bash", arguments="{not json"),
                        wire.tool_call("web_search", query="greeter")),
        wire.completion("Stopping."),
    )
    with VendorServer(transcript) as server:
        run_agent(greeter_task(tmp_path), agent(server.url), config)
    calls = server.seen()[1].body["messages"][2]["tool_calls"]
    malformed, unknown = wire.tool_results(server.seen()[1])
    assert [malformed["tool_call_id"], unknown["tool_call_id"]] == [c["id"] for c in calls]
    assert "exactly one argument, 'command'" in malformed["content"]
    assert "unknown tool 'web_search'" in unknown["content"]


def test_a_reply_without_usage_leaves_tokens_and_spend_unknown(config: RunConfig,
                                                               tmp_path: Path) -> None:
    transcript = wire.script(wire.completion(None, wire.bash(GREET), local=True),
                             wire.completion("Done.", local=True))
    with VendorServer(transcript) as server:
        record, events = run_agent(greeter_task(tmp_path), agent(server.url), config)
    assert record.classification is Classification.PASSED
    usage = record.extra["usage"]
    assert usage["spend"] is None
    assert usage["input_tokens"] is None and usage["output_tokens"] is None
    assert [t["input_tokens"] for t in usage["per_turn"]] == [None, None]
    turns = [e for e in events if isinstance(e, ModelTurn)]
    assert turns[0].usage == dict.fromkeys(
        ("input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens"))
    assert turns[0].spend is None


def test_without_usage_a_token_limit_cannot_be_held(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(wire.completion(None, wire.bash(GREET), local=True))
    task = greeter_task(tmp_path, budgets={"max_tokens": 100_000})
    with VendorServer(transcript) as server:
        record, events = run_agent(task, agent(server.url), config)
    assert record.classification is Classification.BUDGET_EXHAUSTED
    assert record.detail == ("max_tokens: turn 1 reported no token usage, "
                             "so max_tokens 100000 cannot be held")
    assert agent_commands(events) == []


def test_openai_itself_gets_max_completion_tokens(config: RunConfig, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # No --base-url: the SDK's own OPENAI_BASE_URL points it at the scripted
    # server, which then sees what OpenAI's API would.
    with VendorServer(wire.script(wire.completion("Done."))) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        openai_agent = make_openai(model=wire.MODEL, environ={"OPENAI_API_KEY": KEY})
        run_agent(greeter_task(tmp_path), openai_agent, config)
    (request,) = server.seen()
    assert request.body["max_completion_tokens"] == 8192 and "max_tokens" not in request.body
    assert wire.api_key(request) == KEY


def test_make_agent_openai_needs_a_key_unless_a_base_url_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIRSTRUN_OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UsageError, match="no API key: set FIRSTRUN_OPENAI_API_KEY or "
                                         "OPENAI_API_KEY"):
        make_agent("openai")
    local = make_agent("openai", model="llama3.2", base_url="http://127.0.0.1:11434/v1")
    assert (local.name, local.model) == ("openai", "llama3.2")
    # A local model has no price: spend is unknown, never zero.
    assert isinstance(local, LoopAgent) and local.pricing is None
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    assert make_agent("openai").model == DEFAULT_MODEL
