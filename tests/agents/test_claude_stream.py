"""Claude Code's stream-json, read from streams the real CLI (2.1.332) wrote against a
scripted server: each table row is a captured stream and what the parser must make of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstrun.agents.cli.claude_stream import (
    ClaudeStream,
    Denied,
    Final,
    Init,
    Item,
    Noise,
    ToolOutcome,
    Turn,
)

STREAMS = Path(__file__).parent / "fixtures" / "claude_code"


def parse(name: str) -> list[Item]:
    stream = ClaudeStream()
    return [item for line in (STREAMS / name).read_text().splitlines()
            for item in stream.feed(line)]


def of(items: list[Item], kind: type) -> list:
    return [i for i in items if isinstance(i, kind)]


def test_a_passing_stream_is_two_turns_one_command_and_a_success() -> None:
    items = parse("pass.jsonl")
    (init,) = of(items, Init)
    assert init.version == "2.1.332" and init.model == "claude-sonnet-4-5"
    first, last = of(items, Turn)
    assert first.text == "Running it." and first.vendor_stop == "tool_use"
    assert [c["name"] for c in first.tool_calls] == ["Bash"]
    assert first.tool_calls[0]["arguments"]["command"] == "echo hi > x.txt; cat x.txt"
    # Output tokens come from message_delta, not the 1 message_start reports.
    assert (first.input_tokens, first.output_tokens) == (100, 20)
    assert last.text == "Done." and last.vendor_stop == "end_turn" and last.tool_calls == ()
    (ran,) = of(items, ToolOutcome)
    assert (ran.exit_code, ran.stdout, ran.is_error, ran.ran) == (0, "hi", False, True)
    (final,) = of(items, Final)
    assert (final.subtype, final.is_error, final.result, final.num_turns) == \
        ("success", False, "Done.", 2)


def test_a_failed_command_a_refused_fetch_and_a_timeout_keep_their_facts() -> None:
    items = parse("steps.jsonl")
    failed, fetch, slow = of(items, ToolOutcome)
    assert (failed.exit_code, failed.stdout, failed.is_error) == (3, "out\nerr", True)
    assert failed.arguments["command"] == "echo out; echo err >&2; exit 3"
    assert fetch.name == "WebFetch" and fetch.exit_code is None and fetch.is_error
    assert (failed.ran, fetch.ran) == (True, False)
    (denied,) = of(items, Denied)
    assert (denied.tool, denied.tool_use_id) == ("WebFetch", fetch.tool_use_id)
    assert slow.exit_code == 143
    assert len(of(items, Turn)) == 4


@pytest.mark.parametrize(("name", "subtype", "reason", "status"), [
    ("unauthorized.jsonl", "success", "api_error", 401),
    ("max_turns.jsonl", "error_max_turns", "max_turns", None),
    ("max_budget.jsonl", "error_max_budget_usd", "budget_exhausted", None),
])
def test_how_a_run_ended_is_read_from_the_result_line(name: str, subtype: str, reason: str,
                                                      status: int | None) -> None:
    (final,) = of(parse(name), Final)
    assert (final.subtype, final.terminal_reason, final.api_error_status) == \
        (subtype, reason, status)


def test_lines_that_are_not_the_stream_are_noise_not_errors() -> None:
    stream = ClaudeStream()
    assert stream.feed("warning: something\n") == [Noise(line="warning: something")]
    assert stream.feed("[1, 2]") == [Noise(line="[1, 2]")]
    assert stream.feed("") == []
    # A delta for a message never started is ignored, not a KeyError.
    assert stream.feed('{"type":"stream_event","api_message_id":"x",'
                       '"event":{"type":"message_stop"}}') == []
