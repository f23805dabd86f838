"""One contract for every vendor agent, each scenario written once and run over every wire
format (Anthropic Messages, OpenAI Chat Completions, Gemini generateContent).

Each agent runs through its official SDK against a scripted server on loopback, through
the real runner and proxy, on the fake backend (the agent loop is under test, not the
boundary). Each transcript is judged by evidence: the requests the server received (the
tool results the SDK sent back), the run's trace, and the check's verdict on the
workspace the model's commands changed.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest

from firstrun.agents import make_agent
from firstrun.agents.loop import RetryPolicy
from firstrun.agents.prompt import PROMPT_VERSION
from firstrun.agents.spend import FilePrice, SpendGovernor
from firstrun.errors import UsageError
from firstrun.results.model import Classification
from firstrun.results.store import ResultsStore
from firstrun.run.events import ModelTurn, read_trace
from firstrun.run.runner import RunConfig
from firstrun.run.suite import run_suite
from support.agents import DOCS, DOCS_HOST, agent_commands, greeter_task, run_agent
from support.vendor import Router, VendorServer
from support.wire_formats import GREET, WIRE_FORMATS, Refusal, WireFormat

pytestmark = pytest.mark.fast

by_format = pytest.mark.parametrize("fmt", WIRE_FORMATS, ids=[f.name for f in WIRE_FORMATS])


@by_format
def test_multi_turn_tool_use_ends_in_a_pass(fmt: WireFormat, config: RunConfig,
                                            tmp_path: Path) -> None:
    with VendorServer(fmt.multi_turn()) as server:
        record, events = run_agent(greeter_task(tmp_path), fmt.agent(server.url), config)
    requests = server.seen()
    assert (record.classification, record.reason) == (Classification.PASSED, "passed")
    assert record.agent == fmt.name and record.model == fmt.model
    fmt.check_wire(requests)
    greet, cat = fmt.results(requests[2]), fmt.results(requests[3])
    assert len(greet) == 1 and greet[0].startswith("exit code: 0\n")
    assert len(cat) == 1 and "hello, reader" in cat[0]
    # The trace holds every turn beside the commands it ran.
    assert [c.command for c in agent_commands(events)] == [GREET, "cat greeting.txt"]
    turns = [e for e in events if isinstance(e, ModelTurn)]
    assert [t.turn for t in turns] == [1, 2, 3, 4]
    kinds = [line["kind"] for line in read_trace(config.out_dir / record.trace)]
    assert kinds.count("model_turn") == 4
    assert kinds.index("model_turn") < kinds.index("docs_read") < kinds.index("command")
    usage = record.extra["usage"]
    assert usage["vendor"] == fmt.vendor and usage["prompt_version"] == PROMPT_VERSION
    fmt.check_usage(usage, turns)
    assert record.extra["claim"] == "Done: greeting.txt holds the greeting."


@by_format
def test_a_run_whose_commands_miss_the_goal_is_a_docs_gap(fmt: WireFormat, config: RunConfig,
                                                         tmp_path: Path) -> None:
    transcript = fmt.script(
        fmt.reply(None, fmt.read_docs(DOCS)),
        fmt.reply(None, fmt.bash("printf 'goodbye\\n' > greeting.txt")),
        fmt.reply("The greeting file is created."),
    )
    with VendorServer(transcript) as server:
        record, _ = run_agent(greeter_task(tmp_path), fmt.agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    assert record.last_page_before_failure == DOCS
    # The model claimed success; the claim is on record and decided nothing.
    assert record.extra["claim"] == "The greeting file is created."
    assert record.extra["agent_stop"] == "finished"


@by_format
def test_a_rate_limit_is_waited_out_then_the_run_goes_on(fmt: WireFormat, config: RunConfig,
                                                        tmp_path: Path) -> None:
    transcript = fmt.script([fmt.rate_limited(), fmt.reply(None, fmt.bash(GREET))],
                            fmt.reply("Done."))
    sleeps: list[float] = []
    with VendorServer(transcript) as server:
        record, events = run_agent(greeter_task(tmp_path), fmt.agent(server.url, sleeps=sleeps), config)
    assert record.classification is Classification.PASSED
    assert len(server.seen()) == 3
    # One wait, at least as long as the server asked (retry-after, or Gemini's RetryInfo).
    (waited,) = sleeps
    assert waited >= 7
    assert [t.retries for t in events if isinstance(t, ModelTurn)] == [1, 0]


@by_format
def test_server_errors_until_retries_run_out_are_an_infra_error(fmt: WireFormat,
                                                               config: RunConfig,
                                                               tmp_path: Path) -> None:
    sleeps: list[float] = []
    retry = RetryPolicy(attempts=4, base_s=1.0, cap_s=8.0)
    with VendorServer(fmt.script(list(fmt.failing))) as server:
        record, events = run_agent(greeter_task(tmp_path),
                             fmt.agent(server.url, sleeps=sleeps, retry=retry), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "agent_infra_error")
    # Four attempts, no more: the SDK's own retries are off.
    assert len(server.seen()) == 4 and len(sleeps) == 3
    # Full jitter under an exponential ceiling: 1, 2, 4 seconds at most.
    assert all(0 <= s <= cap for s, cap in zip(sleeps, (1, 2, 4), strict=True))
    assert fmt.failed_detail in record.detail
    assert "gave up after 4 attempts" in record.detail
    assert record.check_exit is None and not any(isinstance(e, ModelTurn) for e in events)


@by_format
def test_a_network_failure_is_retried_as_unavailable(fmt: WireFormat, config: RunConfig,
                                                     tmp_path: Path) -> None:
    # A server that is gone: every attempt fails to connect.
    with VendorServer(fmt.script(fmt.reply("never"))) as server:
        url = server.url
    sleeps: list[float] = []
    record, _ = run_agent(greeter_task(tmp_path),
                    fmt.agent(url, sleeps=sleeps, retry=RetryPolicy(attempts=2)), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "agent_infra_error")
    assert record.detail.startswith(fmt.unreachable_detail) and len(sleeps) == 1


@pytest.mark.parametrize("fmt, refusal", [(f, r) for f in WIRE_FORMATS for r in f.refusals],
                         ids=[f"{f.name}-{r.id}" for f in WIRE_FORMATS for r in f.refusals])
def test_a_refusal_is_an_agent_refusal_and_nothing_runs_after_it(
        fmt: WireFormat, refusal: Refusal, config: RunConfig, tmp_path: Path) -> None:
    with VendorServer(fmt.script(refusal.reply())) as server:
        record, events = run_agent(greeter_task(tmp_path), fmt.agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.AGENT_REFUSAL,
                                                      "agent_refused")
    assert record.extra["agent_stop"] == "refused" and record.detail == refusal.detail
    assert record.check_exit is None and agent_commands(events) == []
    (turn,) = [e for e in events if isinstance(e, ModelTurn)]
    assert (turn.stop, turn.vendor_stop) == ("refusal", refusal.vendor_stop)


@by_format
def test_a_bad_key_is_a_harness_error_with_a_clear_message(fmt: WireFormat, config: RunConfig,
                                                          tmp_path: Path) -> None:
    sleeps: list[float] = []
    with VendorServer(fmt.script(fmt.bad_key())) as server:
        record, _ = run_agent(greeter_task(tmp_path), fmt.agent(server.url, sleeps=sleeps), config)
    assert (record.classification, record.reason) == (Classification.HARNESS_ERROR,
                                                      "harness_error")
    starts, holds = fmt.bad_key_detail
    assert record.detail.startswith(starts) and holds in record.detail
    # Not retried: a bad key stays bad.
    assert len(server.seen()) == 1 and sleeps == []


@by_format
def test_the_token_budget_ends_the_run_before_its_calls_run(fmt: WireFormat, config: RunConfig,
                                                           tmp_path: Path) -> None:
    transcript = fmt.script(fmt.reply(None, fmt.read_docs(DOCS), tokens=(600, 100)),
                            fmt.reply(None, fmt.bash(GREET), tokens=(900, 150)))
    task = greeter_task(tmp_path, budgets={"max_tokens": 1500})
    with VendorServer(transcript) as server:
        record, events = run_agent(task, fmt.agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail == "max_tokens: 1750 tokens used of max_tokens 1500"
    # The second turn was recorded and paid for, but its command never ran.
    assert len(server.seen()) == 2 and agent_commands(events) == []
    assert record.extra["usage"]["turns"] == 2 and record.check_exit == 1


@by_format
def test_the_turn_budget_ends_the_run(fmt: WireFormat, config: RunConfig, tmp_path: Path) -> None:
    transcript = fmt.script(*(fmt.reply(None, fmt.bash(f"echo {n}")) for n in range(5)))
    task = greeter_task(tmp_path, budgets={"max_turns": 3})
    with VendorServer(transcript) as server:
        record, events = run_agent(task, fmt.agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail == "max_turns: max_turns 3 reached"
    # The third turn's call ran; no fourth request was made.
    assert len(server.seen()) == 3
    assert [c.command for c in agent_commands(events)] == ["echo 0", "echo 1", "echo 2"]


@by_format
def test_curl_to_the_docs_host_from_the_shell_is_refused_and_recorded(
        fmt: WireFormat, config: RunConfig, tmp_path: Path) -> None:
    curl = f"curl -sS -o /dev/null -w '%{{http_code}}' {DOCS}"
    transcript = fmt.script(
        fmt.reply(None, fmt.bash(curl)),
        fmt.reply(None, fmt.read_docs(DOCS)),
        fmt.reply(None, fmt.bash(GREET)),
        fmt.reply("Done."),
    )
    with VendorServer(transcript) as server:
        record, events = run_agent(greeter_task(tmp_path), fmt.agent(server.url), config)
    assert record.classification is Classification.PASSED
    (tried, _) = agent_commands(events)
    assert tried.command == curl and tried.stdout == "403"
    (blocked,) = record.blocked_egress
    assert (blocked["host"], blocked["channel"], blocked["reason"]) == (
        DOCS_HOST, "shell", "docs_host_on_shell")
    # The model was told what happened, in its tool result.
    (result,) = fmt.results(server.seen()[1])
    assert "403" in result


@by_format
def test_parallel_runs_each_follow_their_own_transcript(fmt: WireFormat, config: RunConfig,
                                                         tmp_path: Path) -> None:
    goals = {n: f"Create greeting.txt holding the greeting (variant {n})." for n in range(3)}
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", goal=goals[n]) for n in range(3)]
    routes = {
        goals[n]: fmt.script(fmt.reply(None, fmt.bash(f"{GREET}; echo variant {n}")),
                             fmt.reply(f"Done with variant {n}."))
        for n in range(3)
    }
    with VendorServer(Router(fmt.first_user_text, routes)) as server:
        outcome = run_suite(tasks, agent_factory=lambda: fmt.agent(server.url), config=config,
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


@by_format
def test_max_spend_stops_a_parallel_sweep_without_passing_the_cap(fmt: WireFormat,
                                                                  config: RunConfig,
                                                                  tmp_path: Path) -> None:
    # A thousandth of a USD per token, either way: each run reserves 1 USD
    # (max_tokens 1000) and spends 0.7; under a 2.5 cap exactly three runs fit
    # (a fourth needs settled + held <= 1.5, and three started runs hold at
    # least 2.1), whatever order the three workers take.
    price = FilePrice(model=fmt.model, input=Decimal(1000), output=Decimal(1000))
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", budgets={"max_tokens": 1000})
             for n in range(3)]
    with VendorServer(fmt.script(fmt.reply("Nothing to do.", tokens=(600, 100)))) as server:
        governor = SpendGovernor(cap=Decimal("2.5"), pricing=price)
        outcome = run_suite(tasks, agent_factory=lambda: fmt.agent(server.url, price=price),
                            config=config, store=ResultsStore(config.out_dir, meta={}),
                            repeat=2, workers=3, spend=governor)
    assert outcome.spend_reached and not outcome.interrupted
    assert len(outcome.records) == 3 and len(server.seen()) == 3
    assert all(r.extra["usage"]["spend"] == "0.7" for r in outcome.records)
    assert governor.spent == Decimal("2.1")


@by_format
def test_a_missing_sdk_is_one_line_naming_the_extra(fmt: WireFormat,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    module, refusal = fmt.missing_sdk
    monkeypatch.setitem(sys.modules, module, None)  # importing the SDK now fails
    monkeypatch.setenv(fmt.key_variable, "k")
    with pytest.raises(UsageError) as caught:
        make_agent(fmt.name)
    assert str(caught.value) == refusal
