"""The typed events of one run, and the append-only trace they are written to.

Guarantee: everything a run did that a report or a classification may use
is one of these events, written to ``trace.jsonl`` in order, one JSON object
per line, flushed as it happens, so a trace cut short by a crash or a kill
still holds everything up to that moment. Classification reads the same
typed events, never message text, so it is identical on every backend.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

# Defined beside the agents that return it; a trace names the same values.
from firstrun.agents.base import AgentStop, Origin
from firstrun.policy.permissions import PermissionDecision, PermissionMode, PermissionReason, PermissionVerdict
from firstrun.proxy.records import EgressRecord


class Source(StrEnum):
    """Who a command belongs to: the outcome depends on it."""

    SETUP = "setup"
    AGENT = "agent"
    CHECK = "check"


@dataclass(frozen=True, kw_only=True)
class Event:
    kind: ClassVar[str] = "event"

    def to_data(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    kind: ClassVar[str] = "run_started"
    task: str
    attempt: int
    agent: str
    model: str | None
    task_file: str
    task_sha256: str


@dataclass(frozen=True, kw_only=True)
class SandboxStarted(Event):
    kind: ClassVar[str] = "sandbox_started"
    info: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class CommandRan(Event):
    kind: ClassVar[str] = "command"
    source: Source
    command: str
    exit_code: int
    duration_s: float
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    # What the boundary refused while it ran, as the agent was told it.
    refusals: list[str] = field(default_factory=list)
    # replay: docs: the route page and code block this step came from.
    origin: Origin | None = None


@dataclass(frozen=True, kw_only=True)
class DocsRead(Event):
    kind: ClassVar[str] = "docs_read"
    page: dict[str, Any]
    route: bool = False


@dataclass(frozen=True, kw_only=True)
class AffordancesProbed(Event):
    """What ``--probe-affordances`` found (``firstrun.docs.affordances``): a summary
    and every candidate checked, with its status and size."""

    kind: ClassVar[str] = "affordance_probe"
    summary: dict[str, Any]
    checked: list[dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class ModelTurn(Event):
    """One model turn: its text, the tool calls it asked for, and what it cost.

    The calls that ran appear again as ``command``/``docs_read`` events with
    their results; a call the loop refused carries its ``error`` here.
    """

    kind: ClassVar[str] = "model_turn"
    turn: int
    text: str
    tool_calls: list[dict[str, Any]]
    stop: str
    vendor_stop: str | None
    usage: dict[str, int]
    spend: str | None
    retries: int = 0


@dataclass(frozen=True, kw_only=True)
class PermissionDecided(Event):
    """The permission rules' decision on one agent tool call, made before it could run.

    Every ``bash`` and ``read_docs`` call of the agent phase has one, allowed
    or not. An allowed call's ``command``/``docs_read`` event follows it; a
    refused one has none, because it never ran. ``argument`` is as the
    agent wrote it; ``rule`` is the deciding rule's canonical text and
    ``origin`` where it is written (``file:line``), both None when no rule
    decided.
    """

    kind: ClassVar[str] = "permission"
    tool: str
    argument: str
    verdict: PermissionVerdict
    reason: PermissionReason
    mode: PermissionMode
    source: str | None = None
    rule: str | None = None
    origin: str | None = None

    @classmethod
    def of(cls, decision: PermissionDecision, *, tool: str, argument: str) -> PermissionDecided:
        rule = decision.rule
        return cls(tool=tool, argument=argument, verdict=decision.verdict,
                   reason=decision.reason, mode=decision.mode, source=decision.source,
                   rule=rule.text if rule is not None else None,
                   origin=rule.origin if rule is not None else None)


@dataclass(frozen=True, kw_only=True)
class Egress(Event):
    # Typed while the run holds it; its data form is written only to the trace.
    kind: ClassVar[str] = "egress"
    record: EgressRecord

    def to_data(self) -> dict[str, Any]:
        return {"kind": self.kind, "record": self.record.to_data()}


@dataclass(frozen=True, kw_only=True)
class AgentFinished(Event):
    kind: ClassVar[str] = "agent_finished"
    stop: AgentStop
    turns: int = 0
    claim: str = ""
    detail: str = ""
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CheckIsolated(Event):
    """How the check was kept apart from the agent, just before it started.

    ``isolation`` is a ``CheckIsolation`` value; ``killed`` is how many
    processes left by setup and the agent were killed (and gone) first, None
    for a ``shared`` check, which runs beside them.
    """

    kind: ClassVar[str] = "check_isolated"
    isolation: str
    killed: int | None


@dataclass(frozen=True, kw_only=True)
class CheckFinished(Event):
    kind: ClassVar[str] = "check_finished"
    exit_code: int | None
    output: str = ""
    duration_s: float = 0.0
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class WorkspaceDisk(Event):
    """What bounded the workspace on the host's disk, and whether use reached the bound.

    ``bound_bytes`` None: nothing did, and ``mechanism`` says why. ``reached``:
    writes past the bound failed with ENOSPC (``firstrun.sandbox.disk``).
    """

    kind: ClassVar[str] = "workspace_disk"
    bound_bytes: int | None
    mechanism: str
    peak_bytes: int = 0
    reached: bool = False


@dataclass(frozen=True, kw_only=True)
class ImageLacked(Event):
    """What the run's default image lacked and this host has, that a failed step needed.

    ``commands``: names a step ran that the image cannot find (the step exited
    127); ``libraries``: shared libraries the loader could not open.
    """

    kind: ClassVar[str] = "image_lacked"
    image: str
    commands: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Failure(Event):
    """The harness or its infrastructure failed; ``who`` is FirstrunError.who.

    ``reason`` is the stable key the classifier reports (``sandbox_refused``,
    ``proxy_failed``, ...), decided from the exception's type where it was
    caught; ``message`` is for people.
    """

    kind: ClassVar[str] = "failure"
    phase: str
    who: str
    error_type: str
    message: str
    infra: bool
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class RunFinished(Event):
    kind: ClassVar[str] = "run_finished"
    classification: str
    reason: str


# A run's trace, in its run directory.
TRACE_FILE = "trace.jsonl"


class Trace:
    """``trace.jsonl`` for one run: append-only, one flushed line per event, thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._seq = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        self._fh = os.fdopen(fd, "a", encoding="utf-8")
        self._events: list[Event] = []

    def emit(self, event: Event) -> None:
        with self._lock:
            self._seq += 1
            line = {
                "seq": self._seq,
                "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "mono": round(time.monotonic(), 6),
                **event.to_data(),
            }
            self._fh.write(json.dumps(line, sort_keys=True, default=str) + "\n")
            self._fh.flush()
            self._events.append(event)

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_trace(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a trace; a torn last line (a crash mid-write) is skipped."""
    events = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events
