"""Gemini CLI's ``--output-format stream-json``, read from streams the real CLI (0.61.0)
wrote against a scripted streamGenerateContent server: each stream and what the parser
must make of it."""

from __future__ import annotations

from pathlib import Path

from firstrun.agents.cli.gemini_cli import exit_code
from firstrun.agents.cli.gemini_stream import (
    Asked,
    Final,
    GeminiStream,
    Init,
    Item,
    Noise,
    Notice,
    ToolOutcome,
    Turn,
    Usage,
)

STREAMS = Path(__file__).parent / "fixtures" / "gemini"


def parse(name: str) -> list[Item]:
    stream = GeminiStream()
    return [item for line in (STREAMS / name).read_text().splitlines()
            for item in stream.feed(line)]


def test_turns_end_at_their_first_result_and_keep_every_call_in_order() -> None:
    items = parse("commands.jsonl")
    assert isinstance(items[0], Init) and items[0].model == "gemini-test-1"
    turns = [i for i in items if isinstance(i, Turn)]
    assert [t.text for t in turns] == ["Trying.", "", "", "Final "]
    assert [[c["arguments"].get("command") for c in t.tool_calls] for t in turns] == [
        ["echo out; echo err >&2; exit 3"], ["touch denied-file", "echo two"], [None], []]
    # Each turn comes before the outcomes of the calls it asked for.
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["Init", "Asked", "Turn", "ToolOutcome", "Asked", "Asked", "Turn",
                     "ToolOutcome", "ToolOutcome", "Asked", "Turn", "ToolOutcome", "Turn", "Final"]
    asked = [i for i in items if isinstance(i, Asked)]
    assert [a.arguments.get("command") for a in asked[1:3]] == ["touch denied-file", "echo two"]


def test_a_turn_ended_early_is_not_ended_again() -> None:
    stream = GeminiStream()
    lines = (STREAMS / "commands.jsonl").read_text().splitlines()
    for line in lines[:4]:
        stream.feed(line)
    (turn,) = stream.close()
    assert isinstance(turn, Turn) and turn.text == "Trying." and len(turn.tool_calls) == 1
    assert stream.close() == []
    # Its first result now only reports the outcome.
    assert [type(i).__name__ for i in stream.feed(lines[4])] == ["ToolOutcome"]


def test_tool_outcomes_name_their_call_and_why_one_failed() -> None:
    outcomes = [i for i in parse("commands.jsonl") if isinstance(i, ToolOutcome)]
    failed_command, refused, ran, unknown = outcomes
    # A command's non-zero exit is still a success of the tool: the code is not here.
    assert (failed_command.ok, failed_command.output) == (True, "out\nerr")
    assert failed_command.name == "run_shell_command"
    assert (refused.ok, refused.error_type) == (False, "policy_violation")
    assert refused.arguments["command"] == "touch denied-file"
    assert (ran.ok, ran.output, ran.error_type) == (True, "two", None)
    assert (unknown.name, unknown.error_type) == ("read_docs", "tool_not_registered")


def test_the_result_holds_the_runs_token_totals() -> None:
    (final,) = [i for i in parse("commands.jsonl") if isinstance(i, Final)]
    assert final.ok and final.error_type is None
    assert final.usage == Usage(input_tokens=600, output_tokens=65, cached_tokens=100)
    assert final.by_model == {"gemini-test-1": final.usage}


def test_an_api_error_is_a_failed_result_with_no_turn() -> None:
    items = parse("api_error.jsonl")
    assert not [i for i in items if isinstance(i, Turn)]
    (final,) = [i for i in items if isinstance(i, Final)]
    assert not final.ok and "API key not valid" in final.error_message
    assert final.usage == Usage(input_tokens=0, output_tokens=0, cached_tokens=0)


def test_the_turn_limit_is_named_in_the_result() -> None:
    items = parse("turn_limit.jsonl")
    assert len([i for i in items if isinstance(i, Turn)]) == 2
    (final,) = [i for i in items if isinstance(i, Final)]
    assert (final.ok, final.error_type) == (False, "FatalTurnLimitedError")


def test_warnings_other_lines_and_odd_shapes_never_raise() -> None:
    stream = GeminiStream()
    assert stream.feed("") == []
    assert stream.feed("Ripgrep is not available.") == [Noise(line="Ripgrep is not available.")]
    assert stream.feed('{"type":"error","severity":"warning","message":"Loop detected"}') == [
        Notice(severity="warning", message="Loop detected")]
    assert stream.feed('{"type":"tool_result","tool_id":7,"status":"error","error":[1]}') == [
        ToolOutcome(tool_id="7", name="", arguments={}, ok=False, output="", error_type=None)]
    (final,) = stream.feed('{"type":"result","status":"success","stats":{"input_tokens":true}}')
    assert isinstance(final, Final) and final.usage.input_tokens == 0


def test_the_exit_code_is_read_from_the_shell_tools_report() -> None:
    report = "<untrusted_context>\nOutput: out\nerr\nExit Code: 3\nProcess Group PGID: 1\n"
    assert exit_code(report) == 3
    assert exit_code("Output: hi\nProcess Group PGID: 1") == 0
    assert exit_code("Output: printed\nExit Code: 9\nExit Code: 1\nProcess Group PGID: 2") == 1
