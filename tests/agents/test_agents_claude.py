"""The Claude agent through the official ``anthropic`` SDK, against a scripted Messages API
server on loopback, in the real sandbox through the real runner and proxy.

Each transcript is judged by evidence: the requests the server received
(the tool results the SDK sent back), the run's trace, and the check's
verdict on the workspace the model's commands changed.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import anthropic_wire as wire
from agent_support import DOCS, DOCS_HOST, TEST_KEY, claude, greeter_task
from vendor_support import VendorServer

from firstrun.agents.loop import RetryPolicy
from firstrun.agents.prompt import PROMPT_VERSION, SYSTEM_PROMPT
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, Event, ModelTurn, Source, read_trace
from firstrun.run.runner import RunConfig, run_task

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
