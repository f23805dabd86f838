"""The replay agent against a toolbelt that records calls: order, first failure, budgets."""

from __future__ import annotations

import pytest

from firstrun.agents import (
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    ReplayAgent,
    make_agent,
)
from firstrun.errors import UsageError
from firstrun.sandbox.base import CappedOutput, ExecResult
from firstrun.tasks.model import Budgets


class ScriptedTools:
    """A toolbelt whose commands exit with the codes given, in order, recording every call."""

    def __init__(self, codes: dict[str, int] | None = None, *, budget_after: int | None = None):
        self.codes = codes or {}
        self.calls: list[tuple[str, str]] = []
        self.budget_after = budget_after

    def bash(self, command: str, *, timeout: float | None = None) -> ExecResult:
        if self.budget_after is not None and len(self.calls) >= self.budget_after:
            raise BudgetExhausted(Budget.MAX_SECONDS, "spent")
        self.calls.append(("bash", command))
        empty = CappedOutput(data=b"", total_bytes=0)
        return ExecResult(exit_code=self.codes.get(command, 0), stdout=empty, stderr=empty,
                          duration_s=0.0)

    def read_docs(self, url: str):
        self.calls.append(("read_docs", url))
        return None


def brief(replay: tuple[str, ...], *, max_turns: int = 20) -> Brief:
    return Brief(task="t", goal="g", docs_route=("http://a.test/1", "http://a.test/2"),
                 docs_hosts=("a.test",), budgets=Budgets(max_turns=max_turns), replay=replay)


def test_reads_the_route_in_order_then_runs_every_step() -> None:
    tools = ScriptedTools()
    result = ReplayAgent().run(brief(("one", "two")), tools)
    assert result.stop is AgentStop.FINISHED and result.turns == 2
    assert tools.calls == [("read_docs", "http://a.test/1"), ("read_docs", "http://a.test/2"),
                           ("bash", "one"), ("bash", "two")]


def test_stops_at_the_first_failing_step() -> None:
    tools = ScriptedTools({"two": 3})
    result = ReplayAgent().run(brief(("one", "two", "three")), tools)
    assert result.stop is AgentStop.STEP_FAILED and result.turns == 2
    assert ("bash", "three") not in tools.calls
    assert "step 2 exited 3" in result.detail


def test_no_replay_block_touches_nothing() -> None:
    tools = ScriptedTools()
    result = ReplayAgent().run(brief(()), tools)
    assert result.stop is AgentStop.NO_REPLAY and tools.calls == []


def test_max_turns_stops_before_the_step_past_it() -> None:
    tools = ScriptedTools()
    result = ReplayAgent().run(brief(("one", "two", "three"), max_turns=2), tools)
    assert result.stop is AgentStop.BUDGET_EXHAUSTED and result.turns == 2
    assert [c for c in tools.calls if c[0] == "bash"] == [("bash", "one"), ("bash", "two")]
    assert result.detail.startswith("max_turns")


def test_the_toolbelt_ending_the_wall_budget_ends_the_agent() -> None:
    tools = ScriptedTools(budget_after=3)
    result = ReplayAgent().run(brief(("one", "two")), tools)
    assert result.stop is AgentStop.BUDGET_EXHAUSTED and result.turns == 2
    assert result.detail.startswith("max_seconds")


def test_make_agent_knows_replay_and_names_the_flag_otherwise() -> None:
    assert isinstance(make_agent("replay"), ReplayAgent)
    with pytest.raises(UsageError, match="--agent: unknown agent 'replya'; did you mean 'replay'"):
        make_agent("replya")
    with pytest.raises(UsageError, match="--model"):
        make_agent("replay", model="gpt")
