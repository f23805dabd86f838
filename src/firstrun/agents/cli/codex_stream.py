"""``codex exec --json`` as data: commands, messages, usage per turn, and failures.

Guarantee: pure and sans-io, like ``claude_stream``. ``CodexStream.feed`` takes
one line and returns what it completed: a ``Command`` per finished command (its
exit code as Codex reported it, None when it never ran), a ``McpCall`` per
finished MCP tool call, a ``Message`` per agent message, a ``TurnUsage`` per
completed turn, a ``Notice`` per error event or item, ``Failed`` for a failed
turn. A line that is not a JSON object is ``Noise``, never an exception.
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
