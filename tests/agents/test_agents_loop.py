"""The loop's edges through the Claude adapter: calls it refuses to run, a reply cut off
at the output limit, a full context window, and make_agent's refusals before any run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from firstrun.agents import make_agent
from firstrun.agents.loop import CUT_OFF
from firstrun.errors import UsageError
from firstrun.results.model import Classification
from firstrun.run.events import Event, ModelTurn
from firstrun.run.runner import RunConfig, run_task
from support import anthropic_wire as wire
from support.agents import DOCS, claude, greeter_task
from support.vendor import VendorServer

pytestmark = pytest.mark.fast


def test_calls_the_loop_cannot_run_are_answered_with_an_error(config: RunConfig,
                                                             tmp_path: Path) -> None:
    transcript = wire.script(
        wire.message(wire.tool_use("web_search", query="greeter"),
                     wire.tool_use("bash", cmd="ls"), wire.read_docs(DOCS)),
        wire.message(wire.text("Stopping.")),
    )
    events: list[Event] = []
    with VendorServer(transcript) as server:
        record = run_task(greeter_task(tmp_path), attempt=1, agent=claude(server.url),
                          config=config, on_event=events.append)
    unknown, malformed, page = wire.tool_results(server.seen()[1])
    assert unknown["is_error"] and "unknown tool 'web_search'" in unknown["content"]
    assert malformed["is_error"] and "exactly one argument, 'command'" in malformed["content"]
    assert "is_error" not in page and "Greeter quickstart" in page["content"]
    (turn, _) = [e for e in events if isinstance(e, ModelTurn)]
    assert [c.get("error") is not None for c in turn.tool_calls] == [True, True, False]
    assert record.classification is Classification.DOCS_GAP and record.commands == 0


def test_a_reply_cut_off_at_the_output_limit_is_asked_to_continue(config: RunConfig,
                                                                 tmp_path: Path) -> None:
    transcript = wire.script(
        wire.message(wire.text("I will now"), stop_reason="max_tokens"),
        wire.message(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        run_task(greeter_task(tmp_path), attempt=1, agent=claude(server.url), config=config)
    last = server.seen()[1].body["messages"][-1]
    assert last == {"role": "user", "content": CUT_OFF}


def test_a_full_context_window_ends_the_run_as_a_spent_budget(config: RunConfig,
                                                             tmp_path: Path) -> None:
    transcript = wire.script(wire.message(wire.text("..."),
                                          stop_reason="model_context_window_exceeded"))
    with VendorServer(transcript) as server:
        record = run_task(greeter_task(tmp_path), attempt=1, agent=claude(server.url),
                          config=config)
    assert record.classification is Classification.BUDGET_EXHAUSTED
    assert record.detail.startswith("context_window:")


def test_a_missing_sdk_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic now fails
    monkeypatch.setenv("FIRSTRUN_ANTHROPIC_API_KEY", "k")
    with pytest.raises(UsageError) as caught:
        make_agent("claude")
    assert str(caught.value) == (
        'usage: --agent claude needs the anthropic SDK: pip install "firstrun[claude]"')


def test_make_agent_refuses_what_an_agent_cannot_use(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="--base-url: the replay agent uses no model server"):
        make_agent("replay", base_url="http://127.0.0.1:9")
    with pytest.raises(UsageError, match="--base-url: 'ftp://x' is not an http"):
        make_agent("claude", base_url="ftp://x")
    monkeypatch.delenv("FIRSTRUN_ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UsageError, match="no API key: set FIRSTRUN_ANTHROPIC_API_KEY or "):
        make_agent("claude")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    agent = make_agent("claude", model="claude-sonnet-4-5")
    assert (agent.name, agent.model) == ("claude", "claude-sonnet-4-5")
