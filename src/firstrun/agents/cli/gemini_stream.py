"""Gemini CLI's ``--output-format stream-json`` as data: turns, tool outcomes, the end.

Guarantee: pure and sans-io. ``GeminiStream.feed`` takes one line of the stream
and returns what it completed, in stream order: ``Init``, ``Asked`` per call the
model asks for, a ``Turn`` once the model's reply is whole (its text and its
calls; this stream carries no per-turn usage), a ``ToolOutcome`` per tool result,
a ``Notice`` per warning, ``Final`` for the ``result`` line (the run's token
totals). ``close`` ends the turn early. A line that is not a JSON object is
``Noise``, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from firstrun.agents.cli.lines import Noise, count, read_line


@dataclass(frozen=True, kw_only=True)
class Init:
    session_id: str | None
    model: str | None


@dataclass(frozen=True, kw_only=True)
class Asked:
    tool_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Turn:
    text: str
    # {"id", "name", "arguments"} per call, in the order the model asked.
    tool_calls: tuple[dict[str, Any], ...]


@dataclass(frozen=True, kw_only=True)
class ToolOutcome:
    tool_id: str
    name: str
    arguments: dict[str, Any]
    ok: bool
    output: str
    # The CLI's kind of failure ("policy_violation" for a call a hook refused,
    # "tool_not_registered", ...), None when the call succeeded.
    error_type: str | None


@dataclass(frozen=True, kw_only=True)
class Notice:
    severity: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token totals as the CLI sums them: ``input_tokens`` counts cached input too."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int


@dataclass(frozen=True, kw_only=True)
class Final:
    ok: bool
    # The CLI's name for why it failed ("FatalTurnLimitedError" for its turn
    # limit), None on success.
    error_type: str | None
    error_message: str
    usage: Usage
    by_model: dict[str, Usage] = field(default_factory=dict)


Item = Init | Asked | Turn | ToolOutcome | Notice | Final | Noise


def _usage(stats: Any) -> Usage:
    stats = stats if isinstance(stats, dict) else {}
    return Usage(input_tokens=count(stats.get("input_tokens")),
                 output_tokens=count(stats.get("output_tokens")),
                 cached_tokens=count(stats.get("cached")))


class GeminiStream:
    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: list[dict[str, Any]] = []
        # tool_id -> (name, arguments), for the result that names only the id.
        self._asked: dict[str, tuple[str, dict[str, Any]]] = {}

    def close(self) -> list[Item]:
        """The turn in progress, if the model said or asked anything in it, now ended.

        Every call of a turn is asked before any of them runs, so the harness may
        end the turn once one of its calls is about to run.
        """
        if not self._text and not self._calls:
            return []
        turn = Turn(text="".join(self._text), tool_calls=tuple(self._calls))
        self._text, self._calls = [], []
        return [turn]

    def feed(self, line: str) -> list[Item]:
        data = read_line(line)
        if data is None:
            return []
        if isinstance(data, Noise):
            return [data]
        kind = data.get("type")
        if kind == "init":
            return [Init(session_id=_str(data.get("session_id")), model=_str(data.get("model")))]
        if kind == "message":
            # The user's message is the prompt firstrun gave; the model's comes in deltas.
            if data.get("role") == "assistant":
                self._text.append(str(data.get("content") or ""))
            return []
        if kind == "tool_use":
            tool_id = str(data.get("tool_id") or "")
            name = str(data.get("tool_name") or "")
            arguments = data.get("parameters") if isinstance(data.get("parameters"), dict) else {}
            self._asked[tool_id] = (name, arguments)
            self._calls.append({"id": tool_id, "name": name, "arguments": arguments})
            return [Asked(tool_id=tool_id, name=name, arguments=arguments)]
        if kind == "tool_result":
            # Every call of a turn is asked before any of them runs: the first
            # result ends the turn.
            items = self.close()
            tool_id = str(data.get("tool_id") or "")
            name, arguments = self._asked.get(tool_id, ("", {}))
            error = data.get("error") if isinstance(data.get("error"), dict) else {}
            items.append(ToolOutcome(
                tool_id=tool_id, name=name, arguments=arguments,
                ok=data.get("status") == "success", output=str(data.get("output") or ""),
                error_type=_str(error.get("type")) if data.get("status") != "success" else None))
            return items
        if kind == "error":
            return [Notice(severity=str(data.get("severity") or "error"),
                           message=str(data.get("message") or ""))]
        if kind == "result":
            items = self.close()
            error = data.get("error") if isinstance(data.get("error"), dict) else {}
            stats = data.get("stats") if isinstance(data.get("stats"), dict) else {}
            models = stats.get("models") if isinstance(stats.get("models"), dict) else {}
            items.append(Final(
                ok=data.get("status") == "success", error_type=_str(error.get("type")),
                error_message=str(error.get("message") or ""), usage=_usage(stats),
                by_model={str(name): _usage(value) for name, value in models.items()}))
            return items
        return [Noise(line=line.strip())]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
