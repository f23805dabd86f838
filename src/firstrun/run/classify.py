"""Deciding what a run means, from its typed events alone.

Guarantee: ``classify_run`` is a pure function of the events a run emitted. It
reads types and enums, never message text, so the same events classify the
same way on every backend and when read back from a trace. A run is
``docs_gap`` only when its check failed and nothing else explains it (the
harness, the infrastructure, a budget, a refusal, the task's own rules or the
boundary); the rules, in the order they decide, are at ``classify_run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from firstrun.agents.base import AgentStop
from firstrun.policy.decision import Reason as EgressReason
from firstrun.policy.network import Channel
from firstrun.policy.permissions import BASH, PermissionVerdict
from firstrun.proxy.records import EgressRecord
from firstrun.results.model import Classification
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
from firstrun.tasks.allowlist import BLOCKING


class RunReason(StrEnum):
    """Stable keys for ``RunRecord.reason``; results and statistics key on them."""

    PASSED = "passed"
    CHECK_FAILED = "check_failed"
    EGRESS_REFUSED = "egress_refused"
    REPLAY_STEP_FAILED = "replay_step_failed"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DISK_EXHAUSTED = "disk_exhausted"
    IMAGE_LACKS_COMMAND = "image_lacks_command"
    IMAGE_LACKS_LIBRARY = "image_lacks_library"
    NO_REPLAY = "no_replay"
    PERMISSION_DENIED = "permission_denied"
    NEEDS_INPUT = "needs_input"
    REPLAY_DRIFT = "replay_drift"
    AGENT_REFUSED = "agent_refused"
    SETUP_FAILED = "setup_failed"
    SANDBOX_REFUSED = "sandbox_refused"
    SANDBOX_FAILED = "sandbox_failed"
    ATTESTATION_FAILED = "attestation_failed"
    PROXY_FAILED = "proxy_failed"
    RECORD_BUDGET_EXHAUSTED = "record_budget_exhausted"
    DOCS_FAILED = "docs_failed"
    AGENT_INFRA = "agent_infra_error"
    HARNESS_ERROR = "harness_error"
    # The Ray node that carried the run out was lost under it (run.ray_engine).
    NODE_LOST = "node_lost"
    NO_CHECK = "no_check"
    INTERRUPTED = "interrupted"
    TUNNEL_CUT = "tunnel_cut"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    classification: Classification
    reason: RunReason


# The rules, in order; the first that applies decides:
#
# 1. a harness failure (a bug in firstrun)               -> harness_error
# 2. an infrastructure failure (sandbox refused or failed, attestation,
#    proxy, docs reader), then the proxy's spent record budget
#    (record_budget_exhausted), then a failed setup step  -> infra_error
# 3. the agent stopped for an infrastructure reason       -> infra_error
#    (or for a harness one                                -> harness_error)
# 4. replay with no replay block                          -> skipped
# 5. replay stopped by the task's permission rules        -> skipped (permission_denied)
#    replay: docs stopped before a step needing a value   -> skipped (needs_input)
#    a hand-written replay step no route block shows      -> skipped (replay_drift)
# 6. the agent refused                                    -> agent_refusal
# 7. otherwise the check alone decides: exit 0            -> passed
#    non-zero: a spent budget                             -> budget_exhausted
#              (the agent's, or the workspace's disk: disk_exhausted)
#              the default image lacked what a failed
#              step needed and the host has               -> infra_error
#              (image_lacks_command, image_lacks_library)
#              the boundary refused a shell destination
#              while a failed step ran                    -> blocked (egress_refused)
#              the boundary cut a shell tunnel            -> infra_error (tunnel_cut)
#              else                                       -> docs_gap
#    (reason replay_step_failed when an agent step failed first, else check_failed)
#
# A route page that could not be read is a finding, not a rule here: the check
# alone decides between passed and docs_gap.
def classify_run(events: Sequence[Event]) -> Outcome:
    failures = [e for e in events if isinstance(e, Failure)]
    for failure in failures:
        if not failure.infra:
            return Outcome(classification=Classification.HARNESS_ERROR, reason=RunReason.HARNESS_ERROR)
    if failures:
        return Outcome(classification=Classification.INFRA_ERROR, reason=_infra_reason(failures[0]))
    # The proxy writes one closing record, reason record_budget_exhausted, when
    # something in the sandbox flooded it past its record budget; from then on it
    # refused every request, the docs reader's and the check's included. What
    # failed or passed after that says nothing about the docs, so this is decided
    # before the setup, the agent's stop and the check, a passing check included:
    # such a run is not evidence either way (EVIDENTIAL).
    if any(isinstance(e, Egress) and e.record.reason is EgressReason.RECORD_BUDGET_EXHAUSTED
           for e in events):
        return Outcome(classification=Classification.INFRA_ERROR,
                       reason=RunReason.RECORD_BUDGET_EXHAUSTED)
    if any(
        isinstance(e, CommandRan) and e.source is Source.SETUP and e.exit_code != 0 for e in events
    ):
        return Outcome(classification=Classification.INFRA_ERROR, reason=RunReason.SETUP_FAILED)
    finished = next((e for e in events if isinstance(e, AgentFinished)), None)
    if finished is not None:
        if finished.stop is AgentStop.INFRA_ERROR:
            return Outcome(classification=Classification.INFRA_ERROR, reason=RunReason.AGENT_INFRA)
        if finished.stop is AgentStop.HARNESS_ERROR:
            return Outcome(classification=Classification.HARNESS_ERROR, reason=RunReason.HARNESS_ERROR)
        if finished.stop is AgentStop.NO_REPLAY:
            return Outcome(classification=Classification.SKIPPED, reason=RunReason.NO_REPLAY)
        # Replay types the documented commands as written, so a step the task's
        # own rules refuse means the task and its docs disagree (the quickstart
        # needs curl and the task forbids it): not a gap in the docs, and no
        # evidence about them either way; ``firstrun validate`` warns of such a
        # task before it runs. A model agent is told of a refusal and may find
        # another way, as around a blocked request, so the check decides its run;
        # the refusals are counted in its record.
        if finished.stop is AgentStop.PERMISSION_DENIED:
            return Outcome(classification=Classification.SKIPPED,
                           reason=RunReason.PERMISSION_DENIED)
        # A step needing a value the task does not give cannot be typed as the
        # page shows it, and a hand-written step no page on the route shows means
        # the task's copy and the docs have parted: a verdict either way would be
        # about the task, not the docs.
        if finished.stop is AgentStop.NEEDS_INPUT:
            return Outcome(classification=Classification.SKIPPED, reason=RunReason.NEEDS_INPUT)
        if finished.stop is AgentStop.REPLAY_DRIFT:
            return Outcome(classification=Classification.SKIPPED, reason=RunReason.REPLAY_DRIFT)
        if finished.stop is AgentStop.REFUSED:
            return Outcome(classification=Classification.AGENT_REFUSAL, reason=RunReason.AGENT_REFUSED)
    check = next((e for e in events if isinstance(e, CheckFinished)), None)
    if check is None:
        # Every path that skips the check emits a Failure first or stops the
        # agent above; reaching here means the runner itself lost its way.
        return Outcome(classification=Classification.HARNESS_ERROR, reason=RunReason.NO_CHECK)
    if check.exit_code == 0:
        return Outcome(classification=Classification.PASSED, reason=RunReason.PASSED)
    if finished is None:
        # ``firstrun check``: the check alone, over a kept workspace.
        return Outcome(classification=Classification.DOCS_GAP, reason=RunReason.CHECK_FAILED)
    if finished.stop is AgentStop.BUDGET_EXHAUSTED:
        return Outcome(classification=Classification.BUDGET_EXHAUSTED, reason=RunReason.BUDGET_EXHAUSTED)
    # Writes past the workspace's bound failed with ENOSPC: a check that failed
    # then is a spent budget, the task's to raise, not a finding about the docs.
    if any(isinstance(e, WorkspaceDisk) and e.reached for e in events):
        return Outcome(classification=Classification.BUDGET_EXHAUSTED, reason=RunReason.DISK_EXHAUSTED)
    # The default image could not find a command a failed step ran by name, or
    # the loader a shared library, and the host has it (found by run.lacking). A
    # reader's machine has them, so the failure says nothing about the docs.
    lacked = next((e for e in events if isinstance(e, ImageLacked)), None)
    if lacked is not None:
        return Outcome(classification=Classification.INFRA_ERROR,
                       reason=RunReason.IMAGE_LACKS_COMMAND if lacked.commands
                       else RunReason.IMAGE_LACKS_LIBRARY)
    # The refused step may have needed exactly what was refused: not evidence
    # about the docs. The record names those refusals and carries the task lines
    # that would allow them.
    if blocking_refusals(events):
        return Outcome(classification=Classification.BLOCKED, reason=RunReason.EGRESS_REFUSED)
    # A cut tunnel (the proxy could not carry it, the upstream reset it, or it
    # ended before any byte came down; proxy.records.tunnel_cut) lost what the
    # command sent through it; a check that failed after may have failed of it.
    if any(isinstance(e, Egress) and e.record.channel is Channel.SHELL and e.record.cut
           for e in events):
        return Outcome(classification=Classification.INFRA_ERROR, reason=RunReason.TUNNEL_CUT)
    return Outcome(
        classification=Classification.DOCS_GAP,
        reason=RunReason.REPLAY_STEP_FAILED
        if finished.stop is AgentStop.STEP_FAILED
        else RunReason.CHECK_FAILED,
    )


def blocking_refusals(events: Sequence[Event]) -> list[EgressRecord]:
    """The shell-channel refusals that make a failed run ``blocked`` (rule 7), in order."""
    return [record for _, records in blocking_steps(events) for record in records]


def blocking_steps(events: Sequence[Event]) -> list[tuple[CommandRan, list[EgressRecord]]]:
    """Each failed step that ran while the boundary refused what blocks, with those refusals."""
    # What blocks (BLOCKING) is a shell-channel refusal for a reason the task's own
    # lists decide (not_allowed, port_not_allowed, ip_literal, dns_not_allowed,
    # tcp_not_allowed), or a datagram that was not DNS (udp_not_allowed). Not a
    # docs host fetched from the shell (docs_host_on_shell): the agent is told to
    # read docs through read_docs, so that refusal decides nothing; nor the address
    # floor, which no task line may lift for a name that is not the task's own. A
    # refusal during a step that succeeded blocks nothing: that step did without it.
    found = []
    for step, records in step_egress(events):
        refused = [r for r in records if r.channel is Channel.SHELL
                   and r.denied and r.reason in BLOCKING]
        if refused and _failed(step):
            found.append((step, refused))
    return found


def step_egress(events: Sequence[Event]) -> list[tuple[CommandRan, list[EgressRecord]]]:
    """Each command, with the egress records made while it ran, in order.

    An agent command opens at its allowed ``bash`` decision, the check at
    ``CheckIsolated``; each closes at its ``CommandRan``. A record that
    arrives after a command closed and before the next opened is that
    command's too: the proxy's records reach the run from another thread,
    a moment after the request was refused. Records before any command
    (the attestation's) belong to none. A setup command has no opening
    mark, so its records count as the command's before it: neither blocks
    anything, since a failed setup command is ``infra_error`` first.
    """
    steps: list[tuple[CommandRan, list[EgressRecord]]] = []
    current: list[EgressRecord] = []
    last: list[EgressRecord] | None = None
    running = False
    for event in events:
        if _opens_command(event):
            current, running = [], True
        elif isinstance(event, Egress):
            if running:
                current.append(event.record)
            elif last is not None:
                last.append(event.record)
        elif isinstance(event, CommandRan):
            steps.append((event, current))
            last, current, running = current, [], False
    return steps


def _opens_command(event: Event) -> bool:
    return isinstance(event, CheckIsolated) or (
        isinstance(event, PermissionDecided) and event.tool == BASH
        and event.verdict is PermissionVerdict.ALLOW)


# A failed step: an agent command or the check that exited non-zero or timed out.
def _failed(step: CommandRan) -> bool:
    return step.source is not Source.SETUP and (step.exit_code != 0 or step.timed_out)


def _infra_reason(failure: Failure) -> RunReason:
    try:
        return RunReason(failure.reason)
    except ValueError:
        # A trace from a build that knew a reason this one does not.
        return RunReason.SANDBOX_FAILED
