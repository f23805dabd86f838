"""The Claude agent through the official ``anthropic`` SDK, against a scripted Messages API
server on loopback, in the real sandbox through the real runner and proxy.

Each transcript is judged by evidence: the requests the server received
(the tool results the SDK sent back), the run's trace, and the check's
verdict on the workspace the model's commands changed.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from firstrun.agents.loop import RetryPolicy
from firstrun.agents.prompt import PROMPT_VERSION, SYSTEM_PROMPT
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, Event, ModelTurn, Source, read_trace
from firstrun.run.runner import RunConfig, run_task
from support import anthropic_wire as wire
from support.agents import DOCS, DOCS_HOST, TEST_KEY, claude, greeter_task
from support.vendor import VendorServer

GREET = "printf 'hello, reader\\n' > greeting.txt"


def run(task, agent, config: RunConfig):
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=agent, config=config, on_event=events.append)
    return record, events


def agent_commands(events: list[Event]) -> list[CommandRan]:
    return [e for e in events if isinstance(e, CommandRan) and e.source is Source.AGENT]


def test_multi_turn_tool_use_ends_in_a_pass(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(
        wire.message(wire.text("Reading the docs."), wire.read_docs(DOCS), tokens=(1000, 50)),
        wire.message(wire.bash(GREET), tokens=(2000, 40), cached=500),
        wire.message(wire.bash("cat greeting.txt"), tokens=(2500, 30)),
        wire.message(wire.text("Done: greeting.txt holds the greeting."), tokens=(2600, 20)),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), claude(server.url), config)
    requests = server.seen()
    assert (record.classification, record.reason) == (Classification.PASSED, "passed")
    assert record.agent == "claude" and record.model == wire.MODEL
    # The SDK spoke the real wire format: the key, the prompt, both tools, and
    # each tool result answering its tool_use by id.
    first = requests[0]
    assert first.path == "/v1/messages" and wire.api_key(first) == TEST_KEY
    assert first.body["system"] == SYSTEM_PROMPT and first.body["model"] == wire.MODEL
    assert [t["name"] for t in first.body["tools"]] == ["bash", "read_docs"]
    assert DOCS in first.body["messages"][0]["content"]
    (page,) = wire.tool_results(requests[1])
    assert page["tool_use_id"] == requests[1].body["messages"][1]["content"][1]["id"]
    assert "title: Greeter quickstart" in page["content"] and "is_error" not in page
    (greet,) = wire.tool_results(requests[2])
    assert greet["content"].startswith("exit code: 0\n")
    (cat,) = wire.tool_results(requests[3])
    assert "hello, reader" in cat["content"]
    # The trace holds every turn beside the commands it ran.
    assert [c.command for c in agent_commands(events)] == [GREET, "cat greeting.txt"]
    turns = [e for e in events if isinstance(e, ModelTurn)]
    assert [t.turn for t in turns] == [1, 2, 3, 4]
    assert turns[0].tool_calls == [{"id": turns[0].tool_calls[0]["id"], "name": "read_docs",
                                    "arguments": {"url": DOCS}}]
    assert turns[1].usage == {"input_tokens": 2500, "output_tokens": 40, "cached_tokens": 500,
                              "cache_write_tokens": 0}
    kinds = [line["kind"] for line in read_trace(config.out_dir / record.trace)]
    assert kinds.count("model_turn") == 4
    assert kinds.index("model_turn") < kinds.index("docs_read") < kinds.index("command")
    # Usage and spend: 3/15 USD per million tokens, cached reads at 0.3.
    usage = record.extra["usage"]
    assert usage["turns"] == 4 and usage["model"] == wire.MODEL
    assert usage["prompt_version"] == PROMPT_VERSION
    assert [t["input_tokens"] for t in usage["per_turn"]] == [1000, 2500, 2500, 2600]
    assert usage["output_tokens"] == 140 and usage["cached_tokens"] == 500
    expected = (Decimal(1000 + 2000 + 2500 + 2600) * 3 + Decimal(500) * Decimal("0.3")
                + Decimal(140) * 15) / 1_000_000
    assert Decimal(usage["spend"]) == expected
    assert record.extra["claim"] == "Done: greeting.txt holds the greeting."


def test_a_run_whose_commands_miss_the_goal_is_a_docs_gap(config: RunConfig,
                                                         tmp_path: Path) -> None:
    transcript = wire.script(
        wire.message(wire.read_docs(DOCS)),
        wire.message(wire.bash("printf 'goodbye\\n' > greeting.txt")),
        wire.message(wire.text("The greeting file is created.")),
    )
    with VendorServer(transcript) as server:
        record, _ = run(greeter_task(tmp_path), claude(server.url), config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    assert record.last_page_before_failure == DOCS
    # The model claimed success; the claim is on record and decided nothing.
    assert record.extra["claim"] == "The greeting file is created."
    assert record.extra["agent_stop"] == "finished"


def test_a_rate_limit_is_waited_out_then_the_run_goes_on(config: RunConfig,
                                                        tmp_path: Path) -> None:
    transcript = wire.script(
        [wire.rate_limited(retry_after="7"), wire.message(wire.bash(GREET))],
        wire.message(wire.text("Done.")),
    )
    sleeps: list[float] = []
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), claude(server.url, sleeps=sleeps), config)
    assert record.classification is Classification.PASSED
    assert len(server.seen()) == 3
    # One wait, at least as long as the server's retry-after asked.
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
                             claude(server.url, sleeps=sleeps, retry=retry), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "agent_infra_error")
    assert len(server.seen()) == 4 and len(sleeps) == 3
    # Full jitter under an exponential ceiling: 1, 2, 4 seconds at most.
    assert all(0 <= s <= cap for s, cap in zip(sleeps, (1, 2, 4), strict=True))
    assert "InternalServerError (HTTP 500)" in record.detail
    assert "gave up after 4 attempts" in record.detail
    assert record.check_exit is None and not any(isinstance(e, ModelTurn) for e in events)


def test_a_refusal_is_an_agent_refusal_and_nothing_runs_after_it(config: RunConfig,
                                                                tmp_path: Path) -> None:
    transcript = wire.script(wire.refusal("This request was flagged."))
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), claude(server.url), config)
    assert (record.classification, record.reason) == (Classification.AGENT_REFUSAL,
                                                      "agent_refused")
    assert record.extra["agent_stop"] == "refused"
    assert record.detail == "cyber This request was flagged."
    assert record.check_exit is None and agent_commands(events) == []
    (turn,) = [e for e in events if isinstance(e, ModelTurn)]
    assert (turn.stop, turn.vendor_stop) == ("refusal", "refusal")


def test_a_bad_key_is_a_harness_error_with_a_clear_message(config: RunConfig,
                                                          tmp_path: Path) -> None:
    transcript = wire.script(wire.unauthorized())
    sleeps: list[float] = []
    with VendorServer(transcript) as server:
        record, _ = run(greeter_task(tmp_path), claude(server.url, sleeps=sleeps), config)
    assert (record.classification, record.reason) == (Classification.HARNESS_ERROR,
                                                      "harness_error")
    assert record.detail.startswith("anthropic: AuthenticationError (HTTP 401)")
    assert "invalid x-api-key" in record.detail
    # Not retried: a bad key stays bad.
    assert len(server.seen()) == 1 and sleeps == []


def test_the_token_budget_ends_the_run_before_its_calls_run(config: RunConfig,
                                                           tmp_path: Path) -> None:
    transcript = wire.script(
        wire.message(wire.read_docs(DOCS), tokens=(600, 100)),
        wire.message(wire.bash(GREET), tokens=(900, 150)),
    )
    task = greeter_task(tmp_path, budgets={"max_tokens": 1500})
    with VendorServer(transcript) as server:
        record, events = run(task, claude(server.url), config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail == "max_tokens: 1750 tokens used of max_tokens 1500"
    # The second turn was recorded and paid for, but its command never ran.
    assert len(server.seen()) == 2 and agent_commands(events) == []
    assert record.extra["usage"]["turns"] == 2 and record.check_exit == 1


def test_the_turn_budget_ends_the_run(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(*(wire.message(wire.bash(f"echo {n}")) for n in range(5)))
    task = greeter_task(tmp_path, budgets={"max_turns": 3})
    with VendorServer(transcript) as server:
        record, events = run(task, claude(server.url), config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail == "max_turns: max_turns 3 reached"
    # The third turn's call ran; no fourth request was made.
    assert len(server.seen()) == 3
    assert [c.command for c in agent_commands(events)] == ["echo 0", "echo 1", "echo 2"]


def test_curl_to_the_docs_host_from_the_shell_is_refused_and_recorded(config: RunConfig,
                                                                     tmp_path: Path) -> None:
    curl = f"curl -sS -o /dev/null -w '%{{http_code}}' {DOCS}"
    transcript = wire.script(
        wire.message(wire.bash(curl)),
        wire.message(wire.read_docs(DOCS)),
        wire.message(wire.bash(GREET)),
        wire.message(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), claude(server.url), config)
    assert record.classification is Classification.PASSED
    (tried, _) = agent_commands(events)
    assert tried.command == curl and tried.stdout == "403"
    (blocked,) = record.blocked_egress
    assert (blocked["host"], blocked["channel"], blocked["reason"]) == (
        DOCS_HOST, "shell", "docs_host_on_shell")
    # The model was told what happened, in its tool result.
    (result,) = wire.tool_results(server.seen()[1])
    assert "403" in result["content"]
