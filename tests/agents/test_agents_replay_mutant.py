"""The replay agent running a mutant: one step dropped or one pin made impossible, or drift."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_agents_replay import ScriptedTools, brief, docs_brief

from firstrun.agents import AgentStop, ReplayAgent
from firstrun.tasks.model import DocsReplay
from firstrun.tasks.mutation import Mutation, version_pins

pytestmark = pytest.mark.fast

PINNED = '<pre><code class="language-bash">pip install tabulate==0.9.0\npython3 app.py</code></pre>'


def bash_calls(tools: ScriptedTools) -> list[str]:
    return [c[1] for c in tools.calls if c[0] == "bash"]


def test_a_drop_mutant_runs_every_step_but_its_own() -> None:
    tools = ScriptedTools()
    mutant = Mutation(of="t", step=2, command="two", where="step 2")
    result = ReplayAgent().run(replace(brief(("one", "two", "three")), mutation=mutant), tools)
    assert result.stop is AgentStop.FINISHED and result.turns == 2
    assert bash_calls(tools) == ["one", "three"]


def test_a_pin_mutant_asks_for_a_version_that_does_not_exist() -> None:
    tools = ScriptedTools(first=PINNED)
    [pin] = version_pins("pip install tabulate==0.9.0")
    mutant = Mutation(of="t", step=1, command="pip install tabulate==0.9.0", where="p block 0", pin=pin,
                      number=1)
    result = ReplayAgent().run(replace(docs_brief(DocsReplay(source="docs")), mutation=mutant), tools)
    assert result.stop is AgentStop.FINISHED
    assert bash_calls(tools) == ["pip install tabulate==99999.0.0", "python3 app.py"]


def test_a_mutant_whose_step_changed_or_vanished_is_drift_and_runs_nothing_in_its_place() -> None:
    changed = Mutation(of="t", step=2, command="TWO", where="step 2")
    tools = ScriptedTools()
    result = ReplayAgent().run(replace(brief(("one", "two")), mutation=changed), tools)
    assert result.stop is AgentStop.REPLAY_DRIFT and bash_calls(tools) == ["one"]
    assert "'two', not the 'TWO'" in result.detail
    gone = Mutation(of="t", step=3, command="three", where="step 3")
    result = ReplayAgent().run(replace(brief(("one", "two")), mutation=gone), ScriptedTools())
    assert result.stop is AgentStop.REPLAY_DRIFT and result.detail.endswith("now has 2 steps")
