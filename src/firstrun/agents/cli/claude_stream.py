"""Claude Code's ``--output-format stream-json`` as data: turns, tool outcomes, the end.

Guarantee: pure and sans-io. ``ClaudeStream.feed`` takes one line of the stream
and returns what it completed, in stream order: ``Init``, a ``Turn`` once its
API message has stopped (usage as the server reported it), a ``ToolOutcome``
per tool result, a ``Denied`` per call the CLI's own permission check turned
down, ``Final`` for the ``result`` line. A line that is not a JSON object is
``Noise``, never an exception: a CLI upgrade must not crash the harness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from firstrun.agents.cli.lines import Noise, count, read_line

# A Bash result carries its exit code: the CLI writes "Exit code N" first in a
# failed command's result.
_EXIT = re.compile(r"\AExit code (\d+)(?:\n|\Z)")
# How the CLI marks the result of a call it refused to make.
_NOT_RUN = "<tool_use_error>"


@dataclass(frozen=True, kw_only=True)
class Init:
    version: str | None
    model: str | None
    mcp_servers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class Turn:
    message_id: str
    model: str | None
    text: str
    tool_calls: tuple[dict[str, Any], ...]
    vendor_stop: str | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    # Set for a sub-agent's turn: the Task call it works for.
    parent: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolOutcome:
    tool_use_id: str
    name: str
    arguments: dict[str, Any]
    content: str
    is_error: bool
    # False when the CLI never ran the call (a permission or input error of its own).
    ran: bool
    exit_code: int | None
    stdout: str | None
    stderr: str | None


@dataclass(frozen=True, kw_only=True)
class Denied:
    tool_use_id: str
    tool: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Final:
    subtype: str
    is_error: bool
    result: str
    num_turns: int | None
    cost_usd: float | None
    api_error_status: int | None
    terminal_reason: str | None


Item = Init | Turn | ToolOutcome | Denied | Final | Noise


@dataclass
class _Open:
    model: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    output_tokens: int = 0
    vendor_stop: str | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)
    parent: str | None = None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


class ClaudeStream:
    def __init__(self) -> None:
        self._open: dict[str, _Open] = {}
        self._calls: dict[str, dict[str, Any]] = {}
        self._denied: set[str] = set()

    # The stream is the one --verbose --include-partial-messages gives: a turn's
    # usage is input from message_start, output from message_delta.
    def feed(self, line: str) -> list[Item]:
        data = read_line(line)
        if data is None:
            return []
        if isinstance(data, Noise):
            return [data]
        kind = data.get("type")
        if kind == "stream_event":
            return self._event(data)
        if kind == "assistant":
            self._assistant(data)
            return []
        if kind == "user":
            return self._results(data)
        if kind == "system":
            return self._system(data)
        if kind == "result":
            return [self._final(data)]
        return []

    def _system(self, data: dict[str, Any]) -> list[Item]:
        if data.get("subtype") == "init":
            servers = tuple((str(s.get("name")), str(s.get("status")))
                            for s in data.get("mcp_servers") or () if isinstance(s, dict))
            return [Init(version=data.get("claude_code_version"), model=data.get("model"),
                         mcp_servers=servers)]
        if data.get("subtype") == "permission_denied":
            self._denied.add(str(data.get("tool_use_id")))
            return [Denied(tool_use_id=str(data.get("tool_use_id")), tool=str(data.get("tool_name")),
                           message=str(data.get("message", "")))]
        return []

    def _event(self, data: dict[str, Any]) -> list[Item]:
        event = data.get("event") or {}
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            ident = str(message.get("id"))
            self._open[ident] = _Open(model=message.get("model"),
                                      usage=dict(message.get("usage") or {}),
                                      parent=data.get("parent_tool_use_id"))
            return []
        ident = str(data.get("api_message_id"))
        turn = self._open.get(ident)
        if turn is None:
            return []
        if kind == "message_delta":
            turn.vendor_stop = (event.get("delta") or {}).get("stop_reason")
            turn.output_tokens = count((event.get("usage") or {}).get("output_tokens"))
        elif kind == "message_stop":
            del self._open[ident]
            return [self._turn(ident, turn)]
        return []

    def _assistant(self, data: dict[str, Any]) -> None:
        message = data.get("message") or {}
        turn = self._open.get(str(message.get("id")))
        blocks = [b for b in message.get("content") or () if isinstance(b, dict)]
        for block in blocks:
            if block.get("type") == "tool_use":
                self._calls[str(block.get("id"))] = block
        if turn is not None:
            turn.blocks.extend(blocks)

    def _turn(self, ident: str, turn: _Open) -> Turn:
        usage = turn.usage
        cached = count(usage.get("cache_read_input_tokens"))
        written = count(usage.get("cache_creation_input_tokens"))
        text = "".join(b.get("text", "") for b in turn.blocks if b.get("type") == "text")
        calls = tuple({"id": b.get("id"), "name": b.get("name"), "arguments": b.get("input") or {}}
                      for b in turn.blocks if b.get("type") == "tool_use")
        return Turn(message_id=ident, model=turn.model, text=text, tool_calls=calls,
                    vendor_stop=turn.vendor_stop,
                    # All input, as firstrun counts it: the uncached part plus both cache kinds.
                    input_tokens=count(usage.get("input_tokens")) + cached + written,
                    output_tokens=turn.output_tokens, cached_tokens=cached,
                    cache_write_tokens=written, parent=turn.parent)

    def _results(self, data: dict[str, Any]) -> list[Item]:
        content = (data.get("message") or {}).get("content")
        if not isinstance(content, list):
            return []
        detail = data.get("tool_use_result")
        # Per call: whether the CLI's permission check let it run at all.
        unrun = {str(m.get("id")) for m in data.get("tool_result_meta") or ()
                 if isinstance(m, dict) and (m.get("non_execution_kind") or (
                     m.get("permission_decision") or {}).get("decision") == "reject")}
        out: list[Item] = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            ident = str(block.get("tool_use_id"))
            call = self._calls.get(ident, {})
            text = _text_of(block.get("content"))
            is_error = bool(block.get("is_error"))
            ran = not (is_error and (text.startswith(_NOT_RUN) or ident in self._denied
                                     or ident in unrun))
            exit_code: int | None = None
            stdout = stderr = None
            if call.get("name") == "Bash" and ran:
                found = _EXIT.match(text) if is_error else None
                exit_code = int(found.group(1)) if found else (None if is_error else 0)
                if isinstance(detail, dict):
                    stdout, stderr = detail.get("stdout"), detail.get("stderr")
                elif found:
                    stdout = text[found.end():]
            out.append(ToolOutcome(tool_use_id=ident, name=str(call.get("name", "")),
                                   arguments=dict(call.get("input") or {}), content=text,
                                   is_error=is_error, ran=ran, exit_code=exit_code,
                                   stdout=stdout, stderr=stderr))
        return out

    def _final(self, data: dict[str, Any]) -> Final:
        status = data.get("api_error_status")
        cost = data.get("total_cost_usd")
        turns = data.get("num_turns")
        return Final(subtype=str(data.get("subtype", "")), is_error=bool(data.get("is_error")),
                     result=str(data.get("result") or ""),
                     num_turns=turns if isinstance(turns, int) else None,
                     cost_usd=float(cost) if isinstance(cost, int | float) else None,
                     api_error_status=status if isinstance(status, int) else None,
                     terminal_reason=data.get("terminal_reason"))
