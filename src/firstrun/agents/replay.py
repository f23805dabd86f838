"""The replay agent: the documented commands, run as written, with no model.

Guarantee: a replay run reads the task's documented route page by page, in
order (so the run records the pages a reader would read), then runs the
task's ``replay`` steps in order in the session and stops at the first step
that exits non-zero. It never retries, edits or skips a step, so a failure
is the documentation's commands failing, not an agent's choice. A task
without a ``replay`` block stops at once with ``NO_REPLAY`` (the run is
``skipped``: there is nothing to replay, which says nothing about the docs).

Turns: one replay step is one turn; reading the route is not, because every
replay run reads the whole route and a page count is not a choice the agent
made. ``max_turns`` smaller than the number of steps stops the run with
``BUDGET_EXHAUSTED`` before the first step past it. The wall budget is the
toolbelt's to enforce, and ends the run the same way.

Permission rules apply to replay as to any agent: the task author's rules
are about what gets run, whoever types it. A route page or a step they
refuse stops the replay with ``PERMISSION_DENIED`` before it runs, because
replay may not swap in another command; the run is then ``skipped``
(``firstrun.run.classify`` says why).
"""

from __future__ import annotations

from firstrun.agents.base import (
    AgentResult,
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    CallRefused,
    Toolbelt,
)


class ReplayAgent:
    name = "replay"
    model: str | None = None

    def run(self, brief: Brief, tools: Toolbelt) -> AgentResult:
        if not brief.replay:
            return AgentResult(stop=AgentStop.NO_REPLAY, detail="the task has no replay block")
        turns = 0
        try:
            for url in brief.docs_route:
                try:
                    tools.read_docs(url)
                except CallRefused as exc:
                    why = exc.decision.explain()
                    return AgentResult(stop=AgentStop.PERMISSION_DENIED, turns=turns,
                                       detail=f"route page {url} not read, {why}")
            for number, step in enumerate(brief.replay, start=1):
                if turns >= brief.budgets.max_turns:
                    raise BudgetExhausted(
                        Budget.MAX_TURNS,
                        f"max_turns {brief.budgets.max_turns} reached before step {number}",
                    )
                turns += 1
                try:
                    result = tools.bash(step)
                except CallRefused as exc:
                    why = exc.decision.explain()
                    return AgentResult(stop=AgentStop.PERMISSION_DENIED, turns=turns,
                                       detail=f"step {number} not run, {why}: {step}")
                if result.exit_code != 0:
                    how = "timed out" if result.timed_out else f"exited {result.exit_code}"
                    return AgentResult(
                        stop=AgentStop.STEP_FAILED,
                        turns=turns,
                        detail=f"step {number} {how}: {step}",
                    )
        except BudgetExhausted as exc:
            return AgentResult(
                stop=AgentStop.BUDGET_EXHAUSTED, turns=turns, detail=f"{exc.budget}: {exc.detail}"
            )
        return AgentResult(stop=AgentStop.FINISHED, turns=turns)
