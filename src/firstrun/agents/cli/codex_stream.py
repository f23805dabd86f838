"""``codex exec --json`` as data: commands, messages, usage per turn, and failures.

Guarantee: pure and sans-io, like ``claude_stream``. ``CodexStream.feed`` takes
one line and returns what it completed: a ``Command`` per finished command (its
exit code as Codex reported it, None when it never ran), a ``McpCall`` per
finished MCP tool call, a ``Message`` per agent message, a ``TurnUsage`` per
completed turn, a ``Notice`` per error event or item, ``Failed`` for a failed
turn. A line that is not a JSON object is ``Noise``, never an exception.
``logged_calls`` reads each model call's usage out of Codex's OpenTelemetry logs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from firstrun.agents.cli.lines import Noise, count, read_line


@dataclass(frozen=True, kw_only=True)
class Command:
    command: str
    output: str
    exit_code: int | None
    status: str


    @property
    def script(self) -> str:
        """The command as the model wrote it: Codex reports it wrapped in its
        shell (``/bin/bash -lc '...'``)."""
        try:
            argv = shlex.split(self.command)
        except ValueError:
            return self.command
        if len(argv) == 3 and argv[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh") \
                and argv[1] in ("-c", "-lc"):
            return argv[2]
        return self.command


@dataclass(frozen=True, kw_only=True)
class McpCall:
    server: str
    tool: str
    arguments: dict[str, Any]
    status: str


@dataclass(frozen=True, kw_only=True)
class Message:
    text: str


# Codex reports usage per turn of the conversation, not per model call, so a
# turn's usage covers every call it made.
@dataclass(frozen=True, kw_only=True)
class TurnUsage:
    input_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int


# Codex's retries and warnings: an ``error`` event or error item.
@dataclass(frozen=True, kw_only=True)
class Notice:
    message: str


@dataclass(frozen=True, kw_only=True)
class Failed:
    message: str


Item = Command | McpCall | Message | TurnUsage | Notice | Failed | Noise


class CodexStream:
    def feed(self, line: str) -> list[Item]:
        data = read_line(line)
        if data is None:
            return []
        if isinstance(data, Noise):
            return [data]
        kind = data.get("type")
        if kind == "item.completed":
            return self._item(data.get("item") or {})
        if kind == "turn.completed":
            usage = data.get("usage") or {}
            return [TurnUsage(input_tokens=count(usage.get("input_tokens")),
                              cached_tokens=count(usage.get("cached_input_tokens")),
                              cache_write_tokens=count(usage.get("cache_write_input_tokens")),
                              output_tokens=count(usage.get("output_tokens")))]
        if kind == "turn.failed":
            return [Failed(message=str((data.get("error") or {}).get("message", "")))]
        if kind == "error":
            return [Notice(message=str(data.get("message", "")))]
        return []

    def _item(self, item: dict[str, Any]) -> list[Item]:
        kind = item.get("type")
        if kind == "command_execution":
            code = item.get("exit_code")
            return [Command(command=str(item.get("command", "")),
                            output=str(item.get("aggregated_output") or ""),
                            exit_code=code if isinstance(code, int) else None,
                            status=str(item.get("status", "")))]
        if kind == "mcp_tool_call":
            arguments = item.get("arguments")
            return [McpCall(server=str(item.get("server", "")), tool=str(item.get("tool", "")),
                            arguments=arguments if isinstance(arguments, dict) else {},
                            status=str(item.get("status", "")))]
        if kind == "agent_message":
            return [Message(text=str(item.get("text", "")))]
        if kind == "error":
            return [Notice(message=str(item.get("message", "")))]
        return []


def _attribute(value: Any) -> Any:
    # An OTLP AnyValue: {"stringValue": ...} or {"intValue": "12"} and so on.
    return next(iter(value.values()), None) if isinstance(value, dict) and value else None


def logged_calls(body: Any) -> list[TurnUsage]:
    """Each model call's usage in one OTLP/HTTP JSON logs body Codex exported.

    Codex's stream reports usage per turn of the conversation only; its
    OpenTelemetry log has a ``codex.sse_event`` record per ``response.completed``
    with that call's token counts. Anything else in the body is skipped.
    """
    calls: list[TurnUsage] = []
    if not isinstance(body, dict):
        return calls
    for resource in body.get("resourceLogs") or ():
        for scope in (resource.get("scopeLogs") or ()) if isinstance(resource, dict) else ():
            for record in (scope.get("logRecords") or ()) if isinstance(scope, dict) else ():
                attrs = {a.get("key"): _attribute(a.get("value"))
                         for a in (record.get("attributes") or ()) if isinstance(a, dict)} \
                    if isinstance(record, dict) else {}
                if attrs.get("event.name") != "codex.sse_event" \
                        or attrs.get("event.kind") != "response.completed" \
                        or "input_token_count" not in attrs:
                    continue
                calls.append(TurnUsage(
                    input_tokens=_tokens(attrs.get("input_token_count")),
                    cached_tokens=_tokens(attrs.get("cached_token_count")),
                    cache_write_tokens=_tokens(attrs.get("cache_write_token_count")),
                    output_tokens=_tokens(attrs.get("output_token_count"))))
    return calls


def _tokens(value: Any) -> int:
    # OTLP sends integers as strings, and Codex sends these as string attributes.
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0
