"""What an agent is given, what it may do, and what it reports back.

Guarantee: an agent sees a read-only ``Brief`` and a ``Toolbelt`` of two tools,
``bash`` (one command in the attested session) and ``read_docs`` (one page,
fetched on the harness side), and nothing else: no session, no proxy, no task
file, no check. Every call goes through the toolbelt, which records it and holds
it to the wall budget and the permission rules whatever the agent does. Why it
stopped is one ``AgentStop`` from a closed set; ``claim`` and ``detail`` never decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from firstrun.policy.permissions import PermissionDecision
from firstrun.tasks.model import Budgets, DocsReplay, ReplayStep
from firstrun.tasks.mutation import Mutation

if TYPE_CHECKING:
    # Type-only: an agent reads the data the toolbelt hands it and never
    # touches the sandbox or the docs reader itself (pyproject's import
    # contract allows exactly these two edges).
    from firstrun.docs.page import Page
    from firstrun.sandbox.base import ExecResult


class AgentStop(StrEnum):
    """Why the agent stopped; the classifier maps these, never free text."""

    FINISHED = "finished"
    STEP_FAILED = "step_failed"
    BUDGET_EXHAUSTED = "budget_exhausted"
    REFUSED = "refused"
    NO_REPLAY = "no_replay"
    # A replay step (or route page) the task's permission rules refuse: the
    # documented commands cannot be run as written under the task's own rules.
    PERMISSION_DENIED = "permission_denied"
    # replay: docs reached a step with a placeholder the task gives no value for.
    NEEDS_INPUT = "needs_input"
    # A hand-written replay step matches no code block on the route: the task is stale.
    REPLAY_DRIFT = "replay_drift"
    INFRA_ERROR = "infra_error"
    HARNESS_ERROR = "harness_error"


class Budget(StrEnum):
    """Which budget ran out."""

    MAX_SECONDS = "max_seconds"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    MAX_SPEND = "max_spend"
    # The model's own context window, not a task budget, but it ends the run
    # the same way: the conversation cannot go on.
    CONTEXT_WINDOW = "context_window"


class BudgetExhausted(Exception):
    """Raised by a toolbelt when a call would go past the run's budget.

    Control flow between the harness and an agent, not a failure: the agent
    (or, if it lets this escape, the runner) ends the agent phase with
    ``AgentStop.BUDGET_EXHAUSTED``.
    """

    def __init__(self, budget: Budget, detail: str) -> None:
        super().__init__(detail)
        self.budget = budget
        self.detail = detail


class CallRefused(Exception):
    """Raised by a toolbelt when a permission rule refuses a call; the call did not run.

    Not a failure of anything: a model agent hands ``message`` back to the
    model as that call's result and carries on; the replay agent stops,
    because it may not change the documented commands. The decision is
    already in the trace when this is raised.
    """

    def __init__(self, *, tool: str, argument: str, decision: PermissionDecision) -> None:
        self.tool = tool
        self.argument = argument
        self.decision = decision
        self.message = f"{tool} call not run: {decision.explain()}"
        super().__init__(self.message)


@dataclass(frozen=True, kw_only=True)
class Brief:
    """Everything an agent is told about its task. The check is not in it.

    ``max_spend`` is this run's spend limit in USD: the amount reserved for
    it under ``--max-spend``, or None when the sweep has no spend cap.
    """

    task: str
    goal: str
    docs_route: tuple[str, ...]
    docs_hosts: tuple[str, ...]
    budgets: Budgets
    replay: tuple[ReplayStep, ...]
    replay_docs: DocsReplay | None = None
    # ``firstrun mutate``: the one change the replay makes to its steps.
    mutation: Mutation | None = None
    max_spend: Decimal | None = None


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Where a replay step comes from: a route page and its code block's index there."""

    page: str
    block: int


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    """One model turn as the trace records it: what the model said and asked for.

    ``tool_calls`` holds ``{"id", "name", "arguments"}`` per call, plus
    ``"error"`` for a call the loop refused to run (an unknown tool, bad
    arguments); the calls that ran are recorded again, with their results, by
    the toolbelt. ``usage`` holds ``input_tokens`` (all input, cached
    included), ``output_tokens``, ``cached_tokens`` and ``cache_write_tokens``,
    each None when the server reported no usage; ``spend`` is this turn's
    cost in USD as a decimal string, None when the price is unknown.
    """

    turn: int
    text: str
    tool_calls: tuple[dict[str, Any], ...]
    stop: str
    vendor_stop: str | None
    usage: dict[str, int | None]
    spend: str | None
    retries: int = 0


class Toolbelt(Protocol):
    def bash(self, command: str, *, timeout: float | None = None,
             origin: Origin | None = None) -> ExecResult:
        """Run ``command`` under bash in the workspace; recorded as an agent command.

        ``origin`` is recorded with it: the page and block a replay step came from.

        ``timeout`` can only shorten the task's per-command limit and the
        time left in the wall budget. Raises ``BudgetExhausted`` when no
        time is left, or when the command was cut short because the wall
        budget ran out (the command is recorded first), and ``CallRefused``
        when a permission rule refuses it (it never starts).
        """
        ...

    def read_docs(self, url: str) -> Page:
        """Read one documentation page on the harness side; recorded as a docs read.

        A page that cannot be read is a ``Page`` with ``error`` set, never an
        exception. Raises ``BudgetExhausted`` when no time is left, and
        ``CallRefused`` when a permission rule refuses the URL.
        """
        ...

    # A model-driven agent hands each model turn here, so the trace holds what the
    # model said beside what ran.
    def record_turn(self, turn: TurnRecord) -> None:
        """Write one model turn to the trace (agents without a model never call it)."""
        ...


@dataclass(frozen=True, kw_only=True)
class AgentResult:
    stop: AgentStop
    turns: int = 0
    claim: str = ""
    detail: str = ""
    usage: dict[str, Any] = field(default_factory=dict)


class Agent(Protocol):
    name: str
    model: str | None

    def run(self, brief: Brief, tools: Toolbelt) -> AgentResult: ...
