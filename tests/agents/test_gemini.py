"""The Gemini agent through the official ``google-genai`` SDK, against a scripted
generateContent server on loopback, in the real sandbox through the real runner and proxy.

Each transcript is judged by evidence: the requests the server received
(the functionResponse parts the SDK sent back, the model turns as they were
returned), the run's trace, and the check's verdict on the workspace.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from firstrun.agents import make_agent
from firstrun.agents.gemini_agent import DEFAULT_MODEL, make_gemini
from firstrun.agents.loop import LoopAgent, RetryPolicy
from firstrun.agents.prompt import PROMPT_VERSION, SYSTEM_PROMPT
from firstrun.agents.spend import FilePrice
from firstrun.errors import UsageError
from firstrun.results.model import Classification
from firstrun.results.store import ResultsStore
from firstrun.run.events import CommandRan, Event, ModelTurn, Source, read_trace
from firstrun.run.runner import RunConfig, run_task
from firstrun.run.suite import run_suite
from support import gemini_wire as wire
from support.agents import DOCS, DOCS_HOST, GREETER_DOCS, greeter_task
from support.vendor import Router, VendorServer

GREET = "printf 'hello, reader\\n' > greeting.txt"
KEY = "gemini-test-key"
PRICE = FilePrice(model=wire.MODEL, input=Decimal(1), output=Decimal(4), cached=Decimal("0.25"))
FIRSTRUN = Path(sys.executable).parent / "firstrun"


def agent(url: str, *, sleeps: list[float] | None = None, **loop: Any) -> LoopAgent:
    """A Gemini agent on the scripted server; retry waits go to ``sleeps``, not to sleep."""
    record = sleeps if sleeps is not None else []
    return make_gemini(model=wire.MODEL, base_url=url, price_file={wire.MODEL: PRICE},
                       environ={"FIRSTRUN_GEMINI_API_KEY": KEY}, sleep=record.append,
                       rng=random.Random(7), **loop)


def run(task, agent, config: RunConfig):
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=agent, config=config, on_event=events.append)
    return record, events


def agent_commands(events: list[Event]) -> list[CommandRan]:
    return [e for e in events if isinstance(e, CommandRan) and e.source is Source.AGENT]


def test_multi_turn_tool_use_ends_in_a_pass(config: RunConfig, tmp_path: Path) -> None:
    first_call = wire.read_docs(DOCS)
    transcript = wire.script(
        wire.response(wire.text("Reading the docs."), first_call, tokens=(1000, 50), thoughts=30),
        # A call without an id, as the API may send: answered by name alone.
        wire.response(wire.bash(GREET, with_id=False), tokens=(2000, 40), cached=500),
        wire.response(wire.bash("cat greeting.txt"), tokens=(2500, 30)),
        wire.response(wire.text("Done: greeting.txt holds the greeting."), tokens=(2600, 20)),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url), config)
    requests = server.seen()
    assert (record.classification, record.reason) == (Classification.PASSED, "passed")
    assert record.agent == "gemini" and record.model == wire.MODEL
    first = requests[0]
    assert first.path.endswith(f"/models/{wire.MODEL}:generateContent")
    assert wire.api_key(first) == KEY
    assert first.body["systemInstruction"]["parts"] == [{"text": SYSTEM_PROMPT}]
    assert DOCS in wire.first_user_text(first)
    assert first.body["generationConfig"]["maxOutputTokens"] == 8192
    (declarations,) = [t["functionDeclarations"] for t in first.body["tools"]]
    assert [d["name"] for d in declarations] == ["bash", "read_docs"]
    # The model's turn went back as it came, thought signature included, and
    # the result answers the call by its id.
    assert requests[1].body["contents"][1] == {"role": "model", "parts": [
        {"text": "Reading the docs."}, first_call]}
    (page,) = wire.function_responses(requests[1])
    assert page["id"] == first_call["functionCall"]["id"] and page["name"] == "read_docs"
    assert "title: Greeter quickstart" in page["response"]["output"]
    (greet,) = wire.function_responses(requests[2])
    assert "id" not in greet and greet["name"] == "bash"
    assert greet["response"]["output"].startswith("exit code: 0\n")
    (cat,) = wire.function_responses(requests[3])
    assert "hello, reader" in cat["response"]["output"]
    assert [c.command for c in agent_commands(events)] == [GREET, "cat greeting.txt"]
    turns = [e for e in events if isinstance(e, ModelTurn)]
    assert [(t.turn, t.stop, t.vendor_stop) for t in turns] == [
        (1, "tool_use", "STOP"), (2, "tool_use", "STOP"), (3, "tool_use", "STOP"),
        (4, "end", "STOP")]
    # Thinking is billed as output; promptTokenCount already holds cached tokens.
    assert turns[0].usage == {"input_tokens": 1000, "output_tokens": 80, "cached_tokens": 0,
                              "cache_write_tokens": 0}
    assert turns[1].usage["cached_tokens"] == 500
    usage = record.extra["usage"]
    assert usage["vendor"] == "google" and usage["prompt_version"] == PROMPT_VERSION
    assert usage["input_tokens"] == 8100 and usage["output_tokens"] == 170
    expected = (Decimal(8100 - 500) * 1 + Decimal(500) * Decimal("0.25")
                + Decimal(170) * 4) / 1_000_000
    assert Decimal(usage["spend"]) == expected
    assert record.extra["claim"] == "Done: greeting.txt holds the greeting."


def test_a_run_whose_commands_miss_the_goal_is_a_docs_gap(config: RunConfig,
                                                         tmp_path: Path) -> None:
    transcript = wire.script(
        wire.response(wire.read_docs(DOCS)),
        wire.response(wire.bash("printf 'goodbye\\n' > greeting.txt")),
        wire.response(wire.text("The greeting file is created.")),
    )
    with VendorServer(transcript) as server:
        record, _ = run(greeter_task(tmp_path), agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    assert record.last_page_before_failure == DOCS
    assert record.extra["claim"] == "The greeting file is created."


def test_a_rate_limit_waits_as_long_as_its_retry_info_asks(config: RunConfig,
                                                           tmp_path: Path) -> None:
    transcript = wire.script(
        [wire.rate_limited(delay="7s"), wire.response(wire.bash(GREET))],
        wire.response(wire.text("Done.")),
    )
    sleeps: list[float] = []
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url, sleeps=sleeps), config)
    assert record.classification is Classification.PASSED
    assert len(server.seen()) == 3
    (waited,) = sleeps
    assert waited >= 7
    assert [t.retries for t in events if isinstance(t, ModelTurn)] == [1, 0]


def test_server_errors_until_retries_run_out_are_an_infra_error(config: RunConfig,
                                                               tmp_path: Path) -> None:
    transcript = wire.script([wire.unavailable(), wire.server_error()])
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
    assert "ServerError (HTTP 500): INTERNAL An internal error" in record.detail
    assert "gave up after 4 attempts" in record.detail
    assert not any(isinstance(e, ModelTurn) for e in events)


def test_a_network_failure_is_retried_as_unavailable(config: RunConfig, tmp_path: Path) -> None:
    with VendorServer(wire.script(wire.response(wire.text("never")))) as server:
        url = server.url
    sleeps: list[float] = []
    record, _ = run(greeter_task(tmp_path),
                    agent(url, sleeps=sleeps, retry=RetryPolicy(attempts=2)), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "agent_infra_error")
    assert record.detail.startswith("google: ConnectError") and len(sleeps) == 1


@pytest.mark.parametrize("reply, detail, vendor_stop", [
    (wire.blocked_prompt("PROHIBITED_CONTENT"), "PROHIBITED_CONTENT", "PROHIBITED_CONTENT"),
    (wire.safety_stop(), "SAFETY HARM_CATEGORY_DANGEROUS_CONTENT", "SAFETY"),
    (wire.response(wire.text("Once upon"), finish_reason="RECITATION"), "RECITATION",
     "RECITATION"),
])
def test_a_refusal_is_an_agent_refusal_and_nothing_runs_after_it(
        config: RunConfig, tmp_path: Path, reply, detail: str, vendor_stop: str) -> None:
    with VendorServer(wire.script(reply)) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.AGENT_REFUSAL,
                                                      "agent_refused")
    assert record.detail == detail and agent_commands(events) == []
    (turn,) = [e for e in events if isinstance(e, ModelTurn)]
    assert (turn.stop, turn.vendor_stop) == ("refusal", vendor_stop)


def test_a_bad_key_is_a_harness_error_with_a_clear_message(config: RunConfig,
                                                          tmp_path: Path) -> None:
    sleeps: list[float] = []
    with VendorServer(wire.script(wire.bad_key())) as server:
        record, _ = run(greeter_task(tmp_path), agent(server.url, sleeps=sleeps), config)
    assert (record.classification, record.reason) == (Classification.HARNESS_ERROR,
                                                      "harness_error")
    assert record.detail.startswith("google: ClientError (HTTP 400): INVALID_ARGUMENT API key "
                                    "not valid")
    assert len(server.seen()) == 1 and sleeps == []


def test_the_token_budget_ends_the_run_before_its_calls_run(config: RunConfig,
                                                           tmp_path: Path) -> None:
    transcript = wire.script(
        wire.response(wire.read_docs(DOCS), tokens=(600, 100)),
        wire.response(wire.bash(GREET), tokens=(900, 150)),
    )
    task = greeter_task(tmp_path, budgets={"max_tokens": 1500})
    with VendorServer(transcript) as server:
        record, events = run(task, agent(server.url), config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    assert record.detail == "max_tokens: 1750 tokens used of max_tokens 1500"
    assert len(server.seen()) == 2 and agent_commands(events) == []


def test_the_turn_budget_ends_the_run(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(*(wire.response(wire.bash(f"echo {n}")) for n in range(5)))
    task = greeter_task(tmp_path, budgets={"max_turns": 3})
    with VendorServer(transcript) as server:
        record, events = run(task, agent(server.url), config)
    assert record.detail == "max_turns: max_turns 3 reached"
    assert len(server.seen()) == 3
    assert [c.command for c in agent_commands(events)] == ["echo 0", "echo 1", "echo 2"]


def test_a_cut_off_reply_is_asked_to_continue(config: RunConfig, tmp_path: Path) -> None:
    transcript = wire.script(
        wire.response(wire.text("I will now"), finish_reason="MAX_TOKENS"),
        wire.response(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        run(greeter_task(tmp_path), agent(server.url), config)
    last = server.seen()[1].body["contents"][-1]
    assert last["role"] == "user" and "cut off" in last["parts"][0]["text"]


def test_calls_the_loop_cannot_run_are_answered_as_errors(config: RunConfig,
                                                         tmp_path: Path) -> None:
    transcript = wire.script(
        wire.response(wire.call("web_search", query="greeter"), wire.bash("exit 3")),
        wire.response(wire.text("Stopping.")),
    )
    with VendorServer(transcript) as server:
        run(greeter_task(tmp_path), agent(server.url), config)
    unknown, failed = wire.function_responses(server.seen()[1])
    assert unknown["name"] == "web_search" and "unknown tool" in unknown["response"]["error"]
    # A command that exited non-zero is reported under "error", with its exit code.
    assert failed["response"]["error"].startswith("exit code: 3\n")


def test_curl_to_the_docs_host_from_the_shell_is_refused_and_recorded(config: RunConfig,
                                                                     tmp_path: Path) -> None:
    curl = f"curl -sS -o /dev/null -w '%{{http_code}}' {DOCS}"
    transcript = wire.script(
        wire.response(wire.bash(curl)),
        wire.response(wire.read_docs(DOCS)),
        wire.response(wire.bash(GREET)),
        wire.response(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(server.url), config)
    assert record.classification is Classification.PASSED
    (tried, _) = agent_commands(events)
    assert tried.command == curl and tried.stdout == "403"
    (blocked,) = record.blocked_egress
    assert (blocked["host"], blocked["channel"], blocked["reason"]) == (
        DOCS_HOST, "shell", "docs_host_on_shell")
    (result,) = wire.function_responses(server.seen()[1])
    assert "403" in result["response"]["output"]


def test_parallel_runs_each_follow_their_own_transcript(config: RunConfig,
                                                         tmp_path: Path) -> None:
    goals = {n: f"Create greeting.txt holding the greeting (variant {n})." for n in range(3)}
    tasks = [greeter_task(tmp_path, name=f"greeter-{n}", goal=goals[n]) for n in range(3)]
    routes = {
        goals[n]: wire.script(
            wire.response(wire.bash(f"{GREET}; echo variant {n}")),
            wire.response(wire.text(f"Done with variant {n}.")))
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


def test_a_canary_key_is_nowhere_but_the_request_to_the_vendor(tmp_path: Path) -> None:
    canary, vendor_canary = "gemini-canary-8d2f6b1e90", "gemini-vendor-canary-71a0c4"
    task = greeter_task(tmp_path)
    out = tmp_path / "out"
    transcript = wire.script(wire.response(wire.bash("env; cat /proc/self/environ")),
                             wire.response(wire.text("Looked around.")))
    env = {**os.environ, "FIRSTRUN_GEMINI_API_KEY": canary, "GEMINI_API_KEY": vendor_canary}
    with VendorServer(transcript) as server:
        done = subprocess.run(
            [str(FIRSTRUN), "run", str(task.path), "--agent", "gemini", "--model", wire.MODEL,
             "--base-url", server.url, "--backend", "linux", "--out", str(out),
             "--docs-mirror", f"{DOCS_HOST}={GREETER_DOCS}"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=240)
    assert done.returncode == 1, done.stderr
    assert wire.api_key(server.seen()[0]) == canary
    assert "PATH=" in next(out.rglob("trace.jsonl")).read_text(encoding="utf-8")
    for secret in (canary, vendor_canary):
        for path in (p for p in out.rglob("*") if p.is_file()):
            assert secret.encode() not in path.read_bytes(), path
        assert secret not in done.stdout and secret not in done.stderr


def test_make_agent_gemini_refuses_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIRSTRUN_GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with pytest.raises(UsageError, match="no API key: set FIRSTRUN_GEMINI_API_KEY or "
                                         "GEMINI_API_KEY"):
        make_agent("gemini")
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    chosen = make_agent("gemini")
    assert (chosen.name, chosen.model) == ("gemini", DEFAULT_MODEL)
    # The default model is priced by the maintained table.
    assert isinstance(chosen, LoopAgent) and chosen.pricing is not None


def test_a_missing_sdk_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.genai", None)  # import google.genai now fails
    monkeypatch.setenv("FIRSTRUN_GEMINI_API_KEY", "k")
    with pytest.raises(UsageError) as caught:
        make_agent("gemini")
    assert str(caught.value) == (
        'usage: --agent gemini needs the google-genai SDK: pip install "firstrun[gemini]"')
