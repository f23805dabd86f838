"""The toolbelt an agent gets: ``bash`` in the session, ``read_docs`` on the harness side.

Guarantee: every call is decided by the run's permission rules before it starts
and the decision is recorded whatever it is; a call not allowed never reaches
the session or the docs reader, and the agent gets ``CallRefused`` naming the
rule. Every call that runs is recorded as it completes, and every call is held
to the agent phase's wall budget (``BudgetExhausted``); once the run's ``stop``
is set no further call starts (``RunInterrupted``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from firstrun.agents.base import Budget, BudgetExhausted, CallRefused, Origin, TurnRecord
from firstrun.docs import DocsReader, Page
from firstrun.policy.permissions import BASH, READ_DOCS, PermissionMode, PermissionVerdict, RuleSet, decide
from firstrun.run.events import (
    CommandRan,
    DocsRead,
    Event,
    ModelTurn,
    PermissionDecided,
    Source,
)
from firstrun.sandbox.base import ExecResult, Session, Stream

if TYPE_CHECKING:
    from firstrun.run.record import Refusals


# Raised at the next call once stop is set (Ctrl-C on the suite); the command
# already running is cut by the runner, which interrupts the session.
class RunInterrupted(BaseException):
    """The sweep was asked to stop. A BaseException, so an agent's ``except
    Exception`` cannot swallow it and carry on."""


class RunToolbelt:
    def __init__(
        self,
        *,
        session: Session,
        reader: DocsReader,
        route: tuple[str, ...],
        max_seconds: float,
        max_command_seconds: float,
        emit: Callable[[Event], None],
        stop: threading.Event | None = None,
        permissions: Sequence[RuleSet] = (),
        refusals: Refusals | None = None,
    ) -> None:
        self._refusals = refusals
        self._session = session
        self._reader = reader
        self._route = frozenset(route)
        self._max_seconds = max_seconds
        self._max_command_seconds = max_command_seconds
        self._deadline = time.monotonic() + max_seconds
        self._emit = emit
        self._stop = stop
        self._permissions = tuple(permissions)

    def _remaining(self) -> float:
        if self._stop is not None and self._stop.is_set():
            raise RunInterrupted()
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise BudgetExhausted(
                Budget.MAX_SECONDS, f"the agent phase used its {self._max_seconds:g}s"
            )
        return left

    def _permit(self, tool: str, argument: str) -> None:
        # Nobody sits at a firstrun run to answer an ask: ask is deny. The rules
        # see only the text of a call, so they are a stated intent and an early
        # stop, not a boundary; the sandbox below holds either way.
        decision = decide(self._permissions, tool=tool, argument=argument,
                          mode=PermissionMode.UNATTENDED)
        self._emit(PermissionDecided.of(decision, tool=tool, argument=argument))
        if decision.verdict is not PermissionVerdict.ALLOW:
            raise CallRefused(tool=tool, argument=argument, decision=decision)

    def bash(self, command: str, *, timeout: float | None = None,
             origin: Origin | None = None) -> ExecResult:
        left = self._remaining()
        self._permit(BASH, command)
        # The smallest of what the agent asked, the task's per-command limit and
        # the time left.
        limit = min(self._max_command_seconds, left if timeout is None else min(timeout, left))
        cut_by_budget = limit >= left
        mark = self._refusals.mark() if self._refusals is not None else 0
        result = self._session.exec(command, timeout=limit)
        if self._refusals is not None:
            result = replace(result, refusals=self._refusals.since(mark))
        self._emit(
            CommandRan(
                source=Source.AGENT,
                command=command,
                exit_code=result.exit_code,
                duration_s=round(result.duration_s, 3),
                timed_out=result.timed_out,
                stdout=result.stdout.text(),
                stderr=result.stderr.text(),
                truncated=result.stdout.truncated or result.stderr.truncated,
                refusals=list(result.refusals),
                origin=origin,
            )
        )
        if result.timed_out and cut_by_budget:
            raise BudgetExhausted(
                Budget.MAX_SECONDS,
                f"the agent phase used its {self._max_seconds:g}s during: {command}",
            )
        return result

    def run_process(self, argv: Sequence[str], *, env: dict[str, str],
                    on_output: Callable[[bytes], None]) -> ExecResult:
        # An agent CLI: its whole life is the agent phase, so its limit is the
        # wall budget left, not the per-command limit its own commands get.
        left = self._remaining()

        def out(stream: Stream, data: bytes) -> None:
            if stream is Stream.STDOUT:
                on_output(data)

        result = self._session.exec(list(argv), timeout=left, env=env, on_output=out)
        if result.timed_out:
            raise BudgetExhausted(Budget.MAX_SECONDS,
                                  f"the agent phase used its {self._max_seconds:g}s")
        return result

    def permit(self, tool: str, argument: str) -> None:
        self._remaining()
        self._permit(tool, argument)

    def record_command(self, *, command: str, exit_code: int, stdout: str, stderr: str,
                       timed_out: bool = False) -> None:
        self._emit(CommandRan(source=Source.AGENT, command=command, exit_code=exit_code,
                              duration_s=0.0, timed_out=timed_out, stdout=stdout, stderr=stderr))

    def read_docs(self, url: str) -> Page:
        self._remaining()
        self._permit(READ_DOCS, url)
        page = self._reader.read(url)
        # route: the URL is a page of the documented route.
        self._emit(DocsRead(page=page.to_record(), route=url in self._route))
        return page

    def record_turn(self, turn: TurnRecord) -> None:
        # Recorded even past the budget: the turn happened and was paid for.
        self._emit(ModelTurn(turn=turn.turn, text=turn.text, tool_calls=list(turn.tool_calls),
                             stop=turn.stop, vendor_stop=turn.vendor_stop, usage=dict(turn.usage),
                             spend=turn.spend, retries=turn.retries))
        # A stopped sweep pays for no further model call.
        if self._stop is not None and self._stop.is_set():
            raise RunInterrupted()
