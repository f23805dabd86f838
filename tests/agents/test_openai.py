"""The OpenAI agent through the official ``openai`` SDK, against a scripted Chat Completions
server on loopback, in the real sandbox through the real runner and proxy.

Each transcript is judged by evidence: the requests the server received
(what the SDK sent back as tool messages), the run's trace, and the check's
verdict on the workspace the model's commands changed.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest

from firstrun.agents import make_agent
from firstrun.agents.loop import LoopAgent, RetryPolicy
from firstrun.agents.openai_agent import DEFAULT_MODEL, make_openai
from firstrun.agents.prompt import PROMPT_VERSION, SYSTEM_PROMPT
from firstrun.agents.spend import FilePrice, SpendGovernor
from firstrun.errors import UsageError
from firstrun.results.model import Classification
from firstrun.results.store import ResultsStore
from firstrun.run.events import CommandRan, Event, ModelTurn, Source, read_trace
from firstrun.run.runner import RunConfig, run_task
from firstrun.run.suite import run_suite
from support import openai_wire as wire
from support.agents import DOCS, DOCS_HOST, greeter_task
from support.agents import OPENAI_KEY as KEY
from support.agents import openai_agent as agent
from support.vendor import Router, VendorServer

GREET = "printf 'hello, reader\\n' > greeting.txt"


def run(task, agent, config: RunConfig):
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=agent, config=config, on_event=events.append)
    return record, events


def agent_commands(events: list[Event]) -> list[CommandRan]:
    return [e for e in events if isinstance(e, CommandRan) and e.source is Source.AGENT]


def test_multi_turn_tool_use_ends_in_a_pass(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(
        wire.completion("Reading the docs.", wire.read_docs(DOCS), tokens=(1000, 50)),
        wire.completion(None, wire.bash(GREET), tokens=(2000, 40), cached=500),
        wire.completion(None, wire.bash("cat greeting.txt"), tokens=(2500, 30)),
        wire.completion("Done: greeting.txt holds the greeting.", tokens=(2600, 20)),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url), config)
    requests = server.seen()
    assert (record.classification, record.reason) == (Classification.PASSED, "passed")
    assert record.agent == "openai" and record.model == wire.MODEL
    # The SDK spoke the real wire format: the key as a bearer token, the
    # prompt as the system message, both tools as functions, the output limit
    # every compatible server knows, and each tool message answering its call by id.
    first = requests[0]
    assert first.path == "/v1/chat/completions" and wire.api_key(first) == KEY
    system, task = first.body["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert task["role"] == "user" and DOCS in task["content"]
    assert first.body["model"] == wire.MODEL and first.body["max_tokens"] == 8192
    assert "max_completion_tokens" not in first.body
    assert [(t["type"], t["function"]["name"]) for t in first.body["tools"]] == [
        ("function", "bash"), ("function", "read_docs")]
    assert first.body["tools"][0]["function"]["parameters"]["required"] == ["command"]
    assistant = requests[1].body["messages"][2]
    (page,) = wire.tool_results(requests[1])
    assert assistant["role"] == "assistant" and assistant["content"] == "Reading the docs."
    assert page["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == f'{{"url": "{DOCS}"}}'
    assert "title: Greeter quickstart" in page["content"]
    (greet,) = wire.tool_results(requests[2])
    assert greet["content"].startswith("exit code: 0\n")
    (cat,) = wire.tool_results(requests[3])
    assert "hello, reader" in cat["content"]
    # The trace holds every turn beside the commands it ran.
    assert [c.command for c in agent_commands(events)] == [GREET, "cat greeting.txt"]
    turns = [e for e in events if isinstance(e, ModelTurn)]
    assert [(t.turn, t.stop, t.vendor_stop) for t in turns] == [
        (1, "tool_use", "tool_calls"), (2, "tool_use", "tool_calls"),
        (3, "tool_use", "tool_calls"), (4, "end", "stop")]
    assert turns[1].usage == {"input_tokens": 2000, "output_tokens": 40, "cached_tokens": 500,
                              "cache_write_tokens": 0}
    kinds = [line["kind"] for line in read_trace(config.out_dir / record.trace)]
    assert kinds.count("model_turn") == 4
    # Usage and spend: 2/8 USD per million tokens, cached reads at 0.5.
    usage = record.extra["usage"]
    assert usage["vendor"] == "openai" and usage["prompt_version"] == PROMPT_VERSION
    assert usage["input_tokens"] == 8100 and usage["output_tokens"] == 140
    assert usage["cached_tokens"] == 500 and usage["served_models"] == [wire.MODEL]
    expected = (Decimal(8100 - 500) * 2 + Decimal(500) * Decimal("0.5")
                + Decimal(140) * 8) / 1_000_000
    assert Decimal(usage["spend"]) == expected
    assert record.extra["claim"] == "Done: greeting.txt holds the greeting."


def test_a_run_whose_commands_miss_the_goal_is_a_docs_gap(config: RunConfig,
                                                         tmp_path: Path) -> None:
    transcript = wire.script(
        wire.completion(None, wire.read_docs(DOCS)),
        wire.completion(None, wire.bash("printf 'goodbye\\n' > greeting.txt")),
        wire.completion("The greeting file is created."),
    )
    with VendorServer(transcript) as server:
        record, _ = run(greeter_task(tmp_path), agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    assert record.last_page_before_failure == DOCS
    # The model claimed success; the claim is on record and decided nothing.
    assert record.extra["claim"] == "The greeting file is created."
    assert record.extra["agent_stop"] == "finished"


def test_a_rate_limit_is_waited_out_then_the_run_goes_on(config: RunConfig,
                                                        tmp_path: Path) -> None:
    transcript = wire.script(
        [wire.rate_limited(retry_after="7"), wire.completion(None, wire.bash(GREET))],
        wire.completion("Done."),
    )
    sleeps: list[float] = []
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url, sleeps=sleeps), config)
    assert record.classification is Classification.PASSED
    assert len(server.seen()) == 3
    (waited,) = sleeps
    assert waited >= 7
    turns = [e for e in events if isinstance(e, ModelTurn)]
    assert [t.retries for t in turns] == [1, 0]


def test_server_errors_until_retries_run_out_are_an_infra_error(config: RunConfig,
                                                               tmp_path: Path) -> None:
    transcript = wire.script([wire.overloaded(), wire.server_error()])
    sleeps: list[float] = []
    retry = RetryPolicy(attempts=4, base_s=1.0, cap_s=8.0)
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path),
                             agent(server.url, sleeps=sleeps, retry=retry), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "agent_infra_error")
    # Four attempts, no more: the SDK's own retries are off.
    assert len(server.seen()) == 4 and len(sleeps) == 3
    assert all(0 <= s <= cap for s, cap in zip(sleeps, (1, 2, 4), strict=True))
    assert "InternalServerError (HTTP 500)" in record.detail
    assert "gave up after 4 attempts" in record.detail
    assert record.check_exit is None and not any(isinstance(e, ModelTurn) for e in events)


def test_a_network_failure_is_retried_as_unavailable(config: RunConfig, tmp_path: Path) -> None:
    # A server that is gone: every attempt fails to connect.
    with VendorServer(wire.script(wire.completion("never"))) as server:
        url = server.url
    sleeps: list[float] = []
    record, _ = run(greeter_task(tmp_path),
                    agent(url, sleeps=sleeps, retry=RetryPolicy(attempts=2)), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "agent_infra_error")
    assert record.detail.startswith("openai: APIConnectionError") and len(sleeps) == 1


@pytest.mark.parametrize("reply, detail, vendor_stop", [
    (wire.refusal("I'm sorry, I can't assist with that."),
     "I'm sorry, I can't assist with that.", "stop"),
    (wire.content_filtered(), "the reply was withheld by the content filter", "content_filter"),
])
def test_a_refusal_is_an_agent_refusal_and_nothing_runs_after_it(
        config: RunConfig, tmp_path: Path, reply, detail: str, vendor_stop: str) -> None:
    with VendorServer(wire.script(reply)) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.AGENT_REFUSAL,
                                                      "agent_refused")
    assert record.extra["agent_stop"] == "refused" and record.detail == detail
    assert record.check_exit is None and agent_commands(events) == []
    (turn,) = [e for e in events if isinstance(e, ModelTurn)]
    assert (turn.stop, turn.vendor_stop) == ("refusal", vendor_stop)


def test_a_bad_key_is_a_harness_error_with_a_clear_message(config: RunConfig,
                                                          tmp_path: Path) -> None:
    sleeps: list[float] = []
    with VendorServer(wire.script(wire.unauthorized())) as server:
        record, _ = run(greeter_task(tmp_path), agent(server.url, sleeps=sleeps), config)
    assert (record.classification, record.reason) == (Classification.HARNESS_ERROR,
                                                      "harness_error")
    assert record.detail.startswith("openai: AuthenticationError (HTTP 401)")
    assert "Incorrect API key provided" in record.detail
    assert len(server.seen()) == 1 and sleeps == []


def test_the_token_budget_ends_the_run_before_its_calls_run(config: RunConfig,
                                                           tmp_path: Path) -> None:
    transcript = wire.script(
        wire.completion(None, wire.read_docs(DOCS), tokens=(600, 100)),
        wire.completion(None, wire.bash(GREET), tokens=(900, 150)),
    )
    task = greeter_task(tmp_path, budgets={"max_tokens": 1500})
    with VendorServer(transcript) as server:
        record, events = run(task, agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail == "max_tokens: 1750 tokens used of max_tokens 1500"
    assert len(server.seen()) == 2 and agent_commands(events) == []
    assert record.extra["usage"]["turns"] == 2


def test_the_turn_budget_ends_the_run(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(*(wire.completion(None, wire.bash(f"echo {n}")) for n in range(5)))
    task = greeter_task(tmp_path, budgets={"max_turns": 3})
    with VendorServer(transcript) as server:
        record, events = run(task, agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail == "max_turns: max_turns 3 reached"
    assert len(server.seen()) == 3
    assert [c.command for c in agent_commands(events)] == ["echo 0", "echo 1", "echo 2"]


def test_calls_the_loop_cannot_run_are_answered_by_id(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(
        wire.completion(None, wire.tool_call("bash", arguments="{not json"),
                        wire.tool_call("web_search", query="greeter")),
        wire.completion("Stopping."),
    )
    with VendorServer(transcript) as server:
        run(greeter_task(tmp_path), agent(server.url), config)
    calls = server.seen()[1].body["messages"][2]["tool_calls"]
    malformed, unknown = wire.tool_results(server.seen()[1])
    assert [malformed["tool_call_id"], unknown["tool_call_id"]] == [c["id"] for c in calls]
    assert "exactly one argument, 'command'" in malformed["content"]
    assert "unknown tool 'web_search'" in unknown["content"]


def test_curl_to_the_docs_host_from_the_shell_is_refused_and_recorded(config: RunConfig,
                                                                     tmp_path: Path) -> None:
    curl = f"curl -sS -o /dev/null -w '%{{http_code}}' {DOCS}"
    transcript = wire.script(
        wire.completion(None, wire.bash(curl)),
        wire.completion(None, wire.read_docs(DOCS)),
        wire.completion(None, wire.bash(GREET)),
        wire.completion("Done."),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url), config)
    assert record.classification is Classification.PASSED
    (tried, _) = agent_commands(events)
    assert tried.command == curl and tried.stdout == "403"
    (blocked,) = record.blocked_egress
    assert (blocked["host"], blocked["channel"], blocked["reason"]) == (
        DOCS_HOST, "shell", "docs_host_on_shell")
    (result,) = wire.tool_results(server.seen()[1])
    assert "403" in result["content"]


def test_parallel_runs_each_follow_their_own_transcript(config: RunConfig,
                                                         tmp_path: Path) -> None:
    goals = {n: f"Create greeting.txt holding the greeting (variant {n})." for n in range(3)}
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", goal=goals[n]) for n in range(3)]
    routes = {
        goals[n]: wire.script(
            wire.completion(None, wire.bash(f"{GREET}; echo variant {n}")),
            wire.completion(f"Done with variant {n}."))
        for n in range(3)
    }
    with VendorServer(Router(wire.first_user_text, routes)) as server:
        outcome = run_suite(tasks, agent_factory=lambda: agent(server.url), config=config,
                            store=ResultsStore(config.out_dir, meta={}), workers=3)
    by_task = {r.task: r for r in outcome.records}
    assert sorted(by_task) == ["greeter-0", "greeter-1", "greeter-2"]
    for n in range(3):
        record = by_task[f"greeter-{n}"]
        assert record.classification is Classification.PASSED
        assert record.extra["claim"] == f"Done with variant {n}."
        (command,) = [c for c in read_trace(config.out_dir / record.trace)
                      if c["kind"] == "command" and c["source"] == "agent"]
        assert command["stdout"] == f"variant {n}\n"
    assert len(server.seen()) == 6


def test_max_spend_stops_a_parallel_sweep_without_passing_the_cap(config: RunConfig,
                                                                  tmp_path: Path) -> None:
    # A thousandth of a USD per token: each run reserves 1 USD (max_tokens
    # 1000) and spends 0.7; under a 2.5 cap exactly three runs fit.
    price = FilePrice(model=wire.MODEL, input=Decimal(1000), output=Decimal(1000))
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", budgets={"max_tokens": 1000})
             for n in range(3)]
    transcript = wire.script(wire.completion("Nothing to do.", tokens=(600, 100)))
    with VendorServer(transcript) as server:
        governor = SpendGovernor(cap=Decimal("2.5"), pricing=price)
        outcome = run_suite(tasks, agent_factory=lambda: agent(server.url, price=price),
                            config=config, store=ResultsStore(config.out_dir, meta={}),
                            repeat=2, workers=3, spend=governor)
    assert outcome.spend_reached and len(outcome.records) == 3 and len(server.seen()) == 3
    assert all(r.extra["usage"]["spend"] == "0.7" for r in outcome.records)
    assert governor.spent == Decimal("2.1")


def test_a_reply_without_usage_leaves_tokens_and_spend_unknown(config: RunConfig,
                                                               tmp_path: Path) -> None:
    transcript = wire.script(wire.completion(None, wire.bash(GREET), local=True),
                             wire.completion("Done.", local=True))
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url), config)
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
        record, events = run(task, agent(server.url), config)
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
        run(greeter_task(tmp_path), openai_agent, config)
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


def test_a_missing_sdk_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai now fails
    monkeypatch.setenv("FIRSTRUN_OPENAI_API_KEY", "k")
    with pytest.raises(UsageError) as caught:
        make_agent("openai")
    assert str(caught.value) == (
        'usage: --agent openai needs the openai SDK: pip install "firstrun[openai]"')
