"""Classification is a pure table over typed events: every row, and the order of the rules."""

from __future__ import annotations

import pytest

from egress_support import egress_record
from firstrun.agents.base import AgentStop
from firstrun.policy.permissions import PermissionMode, PermissionReason, PermissionVerdict
from firstrun.results.model import Classification as C
from firstrun.run.classify import RunReason as R
from firstrun.run.classify import blocking_steps, classify_run
from firstrun.run.events import (
    AgentFinished,
    CheckFinished,
    CheckIsolated,
    CommandRan,
    Egress,
    Event,
    Failure,
    ImageLacked,
    PermissionDecided,
    Source,
    WorkspaceDisk,
)

pytestmark = pytest.mark.fast


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
    # replay: docs stopped before a step whose value the task does not give,
    # and a hand-written step no page shows: the task, not the docs, is judged.
    ([agent(AgentStop.NEEDS_INPUT)], C.SKIPPED, R.NEEDS_INPUT),
    ([agent(AgentStop.REPLAY_DRIFT)], C.SKIPPED, R.REPLAY_DRIFT),
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


def step(code: int, command: str = "x", *, verdict: PermissionVerdict = PermissionVerdict.ALLOW,
         during: tuple[Egress, ...] = (), after: tuple[Egress, ...] = ()) -> list[Event]:
    """One agent command as the toolbelt emits it: its decision, what the proxy recorded
    while it ran, its result, and records that reached the run after it closed."""
    return [PermissionDecided(tool="bash", argument=command, verdict=verdict,
                              reason=PermissionReason.NO_RULE, mode=PermissionMode.UNATTENDED),
            *during, CommandRan(source=Source.AGENT, command=command, exit_code=code,
                                duration_s=0.0), *after]


def checked(code: int, *, during: tuple[Egress, ...] = ()) -> list[Event]:
    return [CheckIsolated(isolation="clean", killed=0), *during,
            CommandRan(source=Source.CHECK, command="<success check>", exit_code=code,
                       duration_s=0.0), check(code)]


def refused(host: str, reason: str = "dns_not_allowed", channel: str = "shell") -> Egress:
    return Egress(record=egress_record(channel=channel, decision="deny", reason=reason,
                                       scheme="dns", host=host))


DNS = refused("storage.example")
FAILED = agent(AgentStop.STEP_FAILED)
FINISHED = agent(AgentStop.FINISHED)

ATTRIBUTION = [
    # Puppeteer on docker: a DNS lookup refused during an earlier step that
    # succeeded, then a later step failed on its own (a SyntaxError).
    ([*step(0, "npm install", during=(DNS,)), *step(1, "node example.js"), FAILED, *checked(1)],
     C.DOCS_GAP, R.REPLAY_STEP_FAILED),
    # The failing step met the refusal itself.
    ([*step(0, "npm install"), *step(1, "node example.js", during=(DNS,)), FAILED, *checked(1)],
     C.BLOCKED, R.EGRESS_REFUSED),
    # Its record reached the run after the step closed, before anything else opened.
    ([*step(1, "npm install", after=(DNS,)), FAILED, *checked(1)], C.BLOCKED, R.EGRESS_REFUSED),
    # A late record of a step that succeeded stays that step's.
    ([*step(0, "npm install", after=(DNS,)), *step(1, "node example.js"), FAILED, *checked(1)],
     C.DOCS_GAP, R.REPLAY_STEP_FAILED),
    # The check that failed was refused while it ran.
    ([*step(0, "npm install"), FINISHED, *checked(1, during=(DNS,))], C.BLOCKED, R.EGRESS_REFUSED),
    # A model agent that went on past a refused, failed command, then the check failed.
    ([*step(6, "curl https://storage.example/x", during=(refused("storage.example", "not_allowed"),)),
      *step(0, "echo done"), FINISHED, *checked(1)], C.BLOCKED, R.EGRESS_REFUSED),
    # A timed-out step failed too.
    ([PermissionDecided(tool="bash", argument="x", verdict=PermissionVerdict.ALLOW,
                        reason=PermissionReason.NO_RULE, mode=PermissionMode.UNATTENDED), DNS,
      CommandRan(source=Source.AGENT, command="x", exit_code=-9, duration_s=9.0, timed_out=True),
      FAILED, *checked(1)], C.BLOCKED, R.EGRESS_REFUSED),
    # Before any command (the attestation's), during setup, or on the docs channel: never.
    ([DNS, cmd(Source.SETUP, 0), *step(1), FAILED, *checked(1)], C.DOCS_GAP, R.REPLAY_STEP_FAILED),
    ([*step(1, during=(refused("docs.example", "not_allowed", "docs"),)), FAILED, *checked(1)],
     C.DOCS_GAP, R.REPLAY_STEP_FAILED),
    # A refusal no task line lifts decides nothing, even during the failed step.
    ([*step(1, during=(refused("docs.example", "docs_host_on_shell"),)), FAILED, *checked(1)],
     C.DOCS_GAP, R.REPLAY_STEP_FAILED),
    # A bash call the permission rules refused never ran: it opens no step, so a
    # refusal then is the earlier step's late record.
    ([*step(0, "a"), *step(1, "b", verdict=PermissionVerdict.DENY)[:1], DNS, *step(1, "c"),
      FAILED, *checked(1)], C.DOCS_GAP, R.REPLAY_STEP_FAILED),
    # The check passing decides, whatever was refused.
    ([*step(1, during=(DNS,)), FAILED, *checked(0)], C.PASSED, R.PASSED),
]


@pytest.mark.parametrize(("events", "classification", "reason"), ATTRIBUTION)
def test_blocked_is_tied_to_refusals_made_while_a_failed_step_ran(
        events: list[Event], classification: C, reason: R) -> None:
    outcome = classify_run(events)
    assert (outcome.classification, outcome.reason) == (classification, reason)


def test_the_blocking_steps_name_each_failed_step_and_its_own_refusals() -> None:
    other = refused("cdn.example", "not_allowed")
    events = [*step(0, "npm install", during=(DNS,)), *step(1, "node example.js", during=(other,)),
              FAILED, *checked(1, during=(DNS,))]
    found = [(s.command, [r.host for r in records]) for s, records in blocking_steps(events)]
    assert found == [("node example.js", ["cdn.example"]), ("<success check>", ["storage.example"])]


NODE_LACKS = ImageLacked(image="firstrun/node:24", commands=["make"])
PYTHON_LACKS = ImageLacked(image="firstrun/python:3.11", libraries=["libGL.so.1"])

IMAGE = [
    # The step could not find a command a reader's machine has: not the docs'.
    ([*step(127, "make"), FAILED, *checked(1), NODE_LACKS], C.INFRA_ERROR, R.IMAGE_LACKS_COMMAND),
    ([*step(1, "python3 app.py"), FAILED, *checked(1), PYTHON_LACKS], C.INFRA_ERROR,
     R.IMAGE_LACKS_LIBRARY),
    ([*step(0), FINISHED, *checked(1), ImageLacked(image="firstrun/node:24", commands=["yarn"],
                                                   libraries=["libatomic.so.1"])],
     C.INFRA_ERROR, R.IMAGE_LACKS_COMMAND),
    # It outranks a refusal: the step could not have started either way.
    ([*step(127, "make", during=(DNS,)), FAILED, *checked(1), NODE_LACKS], C.INFRA_ERROR,
     R.IMAGE_LACKS_COMMAND),
    # A spent budget still decides first, and a passing check is a pass.
    ([*step(127, "make"), agent(AgentStop.BUDGET_EXHAUSTED), *checked(1), NODE_LACKS],
     C.BUDGET_EXHAUSTED, R.BUDGET_EXHAUSTED),
    ([*step(127, "make"), FAILED, *checked(0), NODE_LACKS], C.PASSED, R.PASSED),
    # Without the event (the host lacks it too, or no default image): the docs' gap.
    ([*step(127, "make"), FAILED, *checked(1)], C.DOCS_GAP, R.REPLAY_STEP_FAILED),
]


@pytest.mark.parametrize(("events", "classification", "reason"), IMAGE)
def test_a_default_image_that_lacked_what_the_host_has_is_never_a_docs_gap(
        events: list[Event], classification: C, reason: R) -> None:
    outcome = classify_run(events)
    assert (outcome.classification, outcome.reason) == (classification, reason)
