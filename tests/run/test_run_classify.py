"""Classification is a pure table over typed events: every row, and the order of the rules."""

from __future__ import annotations

import pytest

from firstrun.agents.base import AgentStop
from firstrun.results.model import Classification as C
from firstrun.run.classify import RunReason as R
from firstrun.run.classify import classify_run
from firstrun.run.events import (
    AgentFinished,
    CheckFinished,
    CommandRan,
    Failure,
    Source,
    WorkspaceDisk,
)


def cmd(source: Source, code: int) -> CommandRan:
    return CommandRan(source=source, command="x", exit_code=code, duration_s=0.0)


def agent(stop: AgentStop) -> AgentFinished:
    return AgentFinished(stop=stop)


def check(code: int | None) -> CheckFinished:
    return CheckFinished(exit_code=code)


def infra(reason: R) -> Failure:
    return Failure(phase="sandbox", who="linux", error_type="SandboxUnavailable", message="m",
                   infra=True, reason=reason.value)


def disk(*, reached: bool) -> WorkspaceDisk:
    return WorkspaceDisk(bound_bytes=32 << 20, mechanism="ext4", peak_bytes=32 << 20,
                         reached=reached)


BUG = Failure(phase="agent", who="harness", error_type="KeyError", message="tb", infra=False,
              reason=R.HARNESS_ERROR.value)

TABLE = [
    ([agent(AgentStop.FINISHED), check(0)], C.PASSED, R.PASSED),
    ([cmd(Source.AGENT, 0), agent(AgentStop.FINISHED), check(1)], C.DOCS_GAP, R.CHECK_FAILED),
    ([cmd(Source.AGENT, 2), agent(AgentStop.STEP_FAILED), check(1)], C.DOCS_GAP,
     R.REPLAY_STEP_FAILED),
    # The check alone decides: a failed step and a passing check is a pass.
    ([cmd(Source.AGENT, 2), agent(AgentStop.STEP_FAILED), check(0)], C.PASSED, R.PASSED),
    ([agent(AgentStop.FINISHED), check(None)], C.DOCS_GAP, R.CHECK_FAILED),
    ([agent(AgentStop.BUDGET_EXHAUSTED), check(1)], C.BUDGET_EXHAUSTED, R.BUDGET_EXHAUSTED),
    ([agent(AgentStop.BUDGET_EXHAUSTED), check(0)], C.PASSED, R.PASSED),
    # A full workspace disk is a spent budget, the task's to raise; the check still decides.
    ([cmd(Source.AGENT, 1), agent(AgentStop.STEP_FAILED), check(1), disk(reached=True)],
     C.BUDGET_EXHAUSTED, R.DISK_EXHAUSTED),
    ([agent(AgentStop.FINISHED), check(0), disk(reached=True)], C.PASSED, R.PASSED),
    ([agent(AgentStop.FINISHED), check(1), disk(reached=False)], C.DOCS_GAP, R.CHECK_FAILED),
    ([agent(AgentStop.NO_REPLAY)], C.SKIPPED, R.NO_REPLAY),
    ([agent(AgentStop.REFUSED)], C.AGENT_REFUSAL, R.AGENT_REFUSED),
    ([agent(AgentStop.INFRA_ERROR)], C.INFRA_ERROR, R.AGENT_INFRA),
    ([agent(AgentStop.HARNESS_ERROR)], C.HARNESS_ERROR, R.HARNESS_ERROR),
    ([cmd(Source.SETUP, 0), cmd(Source.SETUP, 1)], C.INFRA_ERROR, R.SETUP_FAILED),
    ([infra(R.SANDBOX_REFUSED)], C.INFRA_ERROR, R.SANDBOX_REFUSED),
    ([infra(R.ATTESTATION_FAILED)], C.INFRA_ERROR, R.ATTESTATION_FAILED),
    ([infra(R.PROXY_FAILED)], C.INFRA_ERROR, R.PROXY_FAILED),
    ([infra(R.INTERRUPTED)], C.INFRA_ERROR, R.INTERRUPTED),
    ([agent(AgentStop.FINISHED), BUG], C.HARNESS_ERROR, R.HARNESS_ERROR),
    # A harness bug outranks infrastructure trouble, which outranks everything after it.
    ([infra(R.PROXY_FAILED), BUG], C.HARNESS_ERROR, R.HARNESS_ERROR),
    ([cmd(Source.SETUP, 1), infra(R.SANDBOX_FAILED)], C.INFRA_ERROR, R.SANDBOX_FAILED),
    ([agent(AgentStop.NO_REPLAY), infra(R.PROXY_FAILED)], C.INFRA_ERROR, R.PROXY_FAILED),
    # The check's exit decides only once nothing above applies.
    ([agent(AgentStop.REFUSED), check(0)], C.AGENT_REFUSAL, R.AGENT_REFUSED),
    # A recheck has no agent: the check alone.
    ([check(0)], C.PASSED, R.PASSED),
    ([check(1)], C.DOCS_GAP, R.CHECK_FAILED),
    # No check and nothing that explains why is the runner's own fault.
    ([agent(AgentStop.FINISHED)], C.HARNESS_ERROR, R.NO_CHECK),
    ([], C.HARNESS_ERROR, R.NO_CHECK),
]


@pytest.mark.parametrize(("events", "classification", "reason"), TABLE)
def test_classification_table(events: list, classification: C, reason: R) -> None:
    outcome = classify_run(events)
    assert (outcome.classification, outcome.reason) == (classification, reason)


def test_setup_output_never_counts_as_a_failed_agent_step() -> None:
    events = [cmd(Source.SETUP, 0), cmd(Source.AGENT, 0), agent(AgentStop.FINISHED), check(1)]
    assert classify_run(events).reason is R.CHECK_FAILED
