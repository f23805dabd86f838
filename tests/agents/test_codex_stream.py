"""``codex exec --json``, read from streams the real Codex CLI (0.171.0) wrote against a
scripted Responses API server: each stream and what the parser must make of it."""

from __future__ import annotations

from pathlib import Path

from firstrun.agents.cli.codex_stream import (
    CodexStream,
    Command,
    Failed,
    Item,
    McpCall,
    Message,
    Noise,
    Notice,
    TurnUsage,
    logged_calls,
)

STREAMS = Path(__file__).parent / "fixtures" / "codex"


def parse(name: str) -> list[Item]:
    stream = CodexStream()
    return [item for line in (STREAMS / name).read_text().splitlines()
            for item in stream.feed(line)]


def test_commands_keep_their_exit_codes_and_output_in_order() -> None:
    items = parse("commands.jsonl")
    failed, ok = [i for i in items if isinstance(i, Command)]
    assert (failed.exit_code, failed.output, failed.status) == (3, "out\nerr\n", "failed")
    assert failed.command == "/bin/bash -lc 'echo out; echo err >&2; exit 3'"
    assert (ok.exit_code, ok.output) == (0, "hi\n")
    assert [i.text for i in items if isinstance(i, Message)] == ["Trying again.", "Done."]
    # One turn of the conversation, three model calls: Codex sums their usage.
    assert [i for i in items if isinstance(i, TurnUsage)] == [
        TurnUsage(input_tokens=300, cached_tokens=30, cache_write_tokens=0, output_tokens=60)]


def test_a_message_only_run_is_its_message_and_its_usage() -> None:
    items = parse("message.jsonl")
    assert [i.text for i in items if isinstance(i, Message)] == ["Done."]
    (notice,) = [i for i in items if isinstance(i, Notice)]
    assert "Model metadata for `gpt-test-1` not found" in notice.message
    assert len([i for i in items if isinstance(i, TurnUsage)]) == 1


def test_a_401_is_five_retries_then_a_failed_turn() -> None:
    items = parse("unauthorized.jsonl")
    retries = [i for i in items if isinstance(i, Notice) and i.message.startswith("Reconnecting")]
    assert len(retries) == 5
    (failed,) = [i for i in items if isinstance(i, Failed)]
    assert "401 Unauthorized" in failed.message
    assert not [i for i in items if isinstance(i, TurnUsage)]


def test_lines_that_are_not_the_stream_are_noise() -> None:
    stream = CodexStream()
    assert stream.feed("Reading additional input from stdin...") == [
        Noise(line="Reading additional input from stdin...")]
    assert stream.feed('{"type":"item.completed","item":{"type":"reasoning"}}') == []


def test_an_mcp_call_is_its_server_tool_and_arguments_and_a_refused_command_never_ran() -> None:
    items = parse("mcp_and_refusal.jsonl")
    (read,) = [i for i in items if isinstance(i, McpCall)]
    assert (read.server, read.tool, read.status) == ("firstrun", "read_docs", "completed")
    assert read.arguments == {"url": "https://docs.example/index.html"}
    # ``touch x`` was refused by the PreToolUse hook: Codex reports no command for it.
    assert [c.script for c in items if isinstance(c, Command)] == [
        "echo hello > a.txt; cat a.txt", "echo STOPNOW"]


def test_a_command_is_read_back_out_of_codex_s_shell_wrapper() -> None:
    def script(command: str) -> str:
        return Command(command=command, output="", exit_code=0, status="completed").script

    assert script("/bin/bash -lc 'echo '\"'\"'hi'\"'\"' > a'") == "echo 'hi' > a"
    assert script("/bin/sh -c 'ls -l'") == "ls -l"
    # Not a shell wrapper, or not one shlex can read: the command as reported.
    assert script("python3 -V") == "python3 -V"
    assert script("/bin/bash -lc 'unterminated") == "/bin/bash -lc 'unterminated"


def _record(**attributes: str) -> dict:
    return {"timeUnixNano": "1", "attributes": [
        {"key": k.replace("_", ".", 1) if k.startswith("event_") else k,
         "value": {"stringValue": v}} for k, v in attributes.items()]}


def test_each_logged_model_call_is_its_usage_and_nothing_else_counts() -> None:
    # The shape Codex 0.171.0 exports (OTLP/HTTP JSON): one codex.sse_event record
    # per response.completed carrying that call's token counts as strings.
    body = {"resourceLogs": [{"resource": {}, "scopeLogs": [{"logRecords": [
        _record(event_name="codex.api_request"),
        _record(event_name="codex.sse_event", event_kind="response.completed"),
        _record(event_name="codex.sse_event", event_kind="response.completed",
                input_token_count="100", output_token_count="20", cached_token_count="10",
                cache_write_token_count="0", reasoning_token_count="0"),
        _record(event_name="codex.sse_event", event_kind="response.completed",
                input_token_count="7", output_token_count="x"),
    ]}]}]}
    assert logged_calls(body) == [
        TurnUsage(input_tokens=100, cached_tokens=10, cache_write_tokens=0, output_tokens=20),
        TurnUsage(input_tokens=7, cached_tokens=0, cache_write_tokens=0, output_tokens=0)]
    for nothing in (None, [], {"resourceLogs": [None, {"scopeLogs": "x"}]}):
        assert logged_calls(nothing) == []
