"""Turning a run's events into its saved record, and exceptions into failure events.

Guarantee: exceptions are mapped here and only here, by type, never by
message: the sandbox refusing or failing, attestation, the proxy and the docs
reader are infrastructure (``infra`` true, with a stable reason); anything
else is a firstrun bug whose traceback goes into the trace. A ``RunRecord``
is built from the typed events alone, so what a report says about a run is
what its trace holds.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

from firstrun.agents.base import AgentStop
from firstrun.errors import (
    AttestationFailed,
    DocsError,
    FirstrunError,
    ProxyError,
    SandboxError,
    SandboxUnavailable,
)
from firstrun.policy import permissions
from firstrun.policy.decision import Reason as EgressReason
from firstrun.policy.network import Channel, destination_label
from firstrun.proxy.records import EgressRecord, Scheme
from firstrun.results.model import Classification, PageRead, RunRecord
from firstrun.run.classify import Outcome, RunReason, blocking_refusals, blocking_steps
from firstrun.run.events import (
    AffordancesProbed,
    AgentFinished,
    CheckFinished,
    CheckIsolated,
    CommandRan,
    DocsRead,
    Egress,
    Event,
    Failure,
    ImageLacked,
    PermissionDecided,
    SandboxStarted,
    Source,
    Trace,
    WorkspaceDisk,
)
from firstrun.tasks.allowlist import allow_entries
from firstrun.tasks.model import Task


def infra_reason(exc: BaseException) -> RunReason | None:
    """The infrastructure reason for ``exc``, or None when it is a harness bug. By type only."""
    if isinstance(exc, SandboxUnavailable):
        return RunReason.SANDBOX_REFUSED
    if isinstance(exc, AttestationFailed):
        return RunReason.ATTESTATION_FAILED
    if isinstance(exc, SandboxError):
        return RunReason.SANDBOX_FAILED
    if isinstance(exc, ProxyError):
        return RunReason.PROXY_FAILED
    if isinstance(exc, DocsError):
        return RunReason.DOCS_FAILED
    return None


def failure_event(exc: BaseException, *, phase: str) -> Failure:
    reason = infra_reason(exc)
    if reason is not None:
        assert isinstance(exc, FirstrunError)
        return Failure(phase=phase, who=exc.who, error_type=type(exc).__name__,
                       message=str(exc), infra=True, reason=reason.value)
    return Failure(phase=phase, who="harness", error_type=type(exc).__name__,
                   message="".join(traceback.format_exception(exc)), infra=False,
                   reason=RunReason.HARNESS_ERROR.value)


def refusal_line(record: EgressRecord) -> str:
    """One refusal as the agent reads it: where, and the stable reason."""
    where = record.host or "(no valid host)" if record.scheme is Scheme.DNS \
        else destination_label(record.host, record.port, record.reason)
    return f"[sandbox] refused {where} ({record.reason.value})"


class Refusals:
    """The shell channel's refusals, in order, so a command's own can be told to the agent.

    The attestation probe's reserved host is never among them.
    """

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._lock = threading.Lock()

    def add(self, record: EgressRecord) -> None:
        if record.channel is not Channel.SHELL or not record.denied \
                or record.reason is EgressReason.ATTESTATION:
            return
        with self._lock:
            self._lines.append(refusal_line(record))

    def mark(self) -> int:
        with self._lock:
            return len(self._lines)

    def since(self, mark: int) -> tuple[str, ...]:
        """The refusals after ``mark``, each line once."""
        with self._lock:
            return tuple(dict.fromkeys(self._lines[mark:]))


class Recorder:
    """Writes events to the trace and the caller's callback, from any thread.

    Egress arrives on the proxy's thread, which must never see an exception;
    a failure there is kept and raised on the run's own thread. ``refusals``
    holds the shell's refusals as the agent is told them.
    """

    def __init__(self, trace: Trace, on_event: Callable[[Event], None] | None) -> None:
        self._trace = trace
        self._on_event = on_event
        self._lock = threading.Lock()
        self.errors: list[Exception] = []
        self.refusals = Refusals()

    def emit(self, event: Event) -> None:
        self._trace.emit(event)
        if self._on_event is not None:
            self._on_event(event)

    def events(self) -> list[Event]:
        return self._trace.events()

    def egress(self, record: EgressRecord) -> None:
        try:
            self.refusals.add(record)
            self.emit(Egress(record=record))
        except Exception as exc:
            with self._lock:
                self.errors.append(exc)

    def raise_deferred(self) -> None:
        with self._lock:
            if self.errors:
                raise self.errors[0]


def _refused_where(record: EgressRecord) -> str:
    if record.scheme is Scheme.DNS:
        return str(record.host)
    return destination_label(record.host, record.port)


def _page(record: dict[str, Any]) -> PageRead:
    return PageRead(url_requested=record["url_requested"], url_final=record.get("url_final"),
                    status=record.get("status"), error=record.get("error"),
                    bytes=record.get("bytes", 0), sha256=record.get("sha256"),
                    from_cache=bool(record.get("from_cache", False)))


def last_page_before_failure(events: list[Event]) -> str | None:
    """The last page read before the first failing agent command, or before a failed check."""
    last: str | None = None
    for event in events:
        if isinstance(event, DocsRead):
            last = event.page["url_requested"]
        elif isinstance(event, CommandRan) and event.source is Source.AGENT and event.exit_code != 0:
            return last
        elif isinstance(event, CheckFinished):
            return last if event.exit_code != 0 else None
    return None


def _allow_fix(events: list[Event], outcome: Outcome) -> dict[str, list[str]]:
    """What a report-only run would have been refused, else what blocked this run."""
    learnt = [e.record for e in events if isinstance(e, Egress) and e.record.would_deny is not None]
    if learnt:
        return allow_entries(r.to_data() for r in learnt).to_data()
    if outcome.classification is Classification.BLOCKED:
        return allow_entries(r.to_data() for r in blocking_refusals(events)).to_data()
    return {}


def build_record(task: Task, *, attempt: int, agent_name: str, model: str | None, outcome: Outcome, events: list[Event],
                 started_at: str, duration_s: float, trace: str) -> RunRecord:
    info = next((e.info for e in events if isinstance(e, SandboxStarted)), None)
    reads = [e for e in events if isinstance(e, DocsRead)]
    finished = next((e for e in events if isinstance(e, AgentFinished)), None)
    check = next((e for e in events if isinstance(e, CheckFinished)), None)
    isolated = next((e for e in events if isinstance(e, CheckIsolated)), None)
    failure = next((e for e in events if isinstance(e, Failure)), None)
    disk = next((e for e in events if isinstance(e, WorkspaceDisk)), None)
    lacked = next((e for e in events if isinstance(e, ImageLacked)), None)
    findings = tuple(
        {"url": e.page["url_requested"], "error": e.page["error"], "status": e.page["status"],
         "detail": e.page["detail"]}
        for e in reads if e.route and e.page.get("error") is not None
    )
    egress = [e.record for e in events if isinstance(e, Egress)]
    # An agent CLI's own traffic to its API host is counted apart from the run's
    # egress: neither a page read nor a refusal of what the docs asked for.
    agent_egress = [r for r in egress if r.channel is Channel.AGENT]
    blocked = tuple(r.to_data() for r in egress if r.denied and r.channel is not Channel.AGENT)
    failed_setup = next((e for e in events if isinstance(e, CommandRan)
                         and e.source is Source.SETUP and e.exit_code != 0), None)
    if failure is not None:
        detail = failure.message.strip().splitlines()[-1] if failure.message.strip() else ""
    elif failed_setup is not None:
        detail = f"setup step exited {failed_setup.exit_code}: {failed_setup.command}"
    elif outcome.classification is Classification.BLOCKED:
        step, refused = blocking_steps(events)[0]
        hosts = ", ".join(dict.fromkeys(_refused_where(r) for r in refused))
        what = "the check" if step.source is Source.CHECK else f"the step `{step.command}`"
        detail = f"{what} failed while the sandbox refused {hosts}"
    elif lacked is not None and outcome.reason in (RunReason.IMAGE_LACKS_COMMAND,
                                                   RunReason.IMAGE_LACKS_LIBRARY):
        what = [*(f"the command {c}" for c in lacked.commands),
                *(f"the shared library {lib}" for lib in lacked.libraries)]
        detail = f"the image {lacked.image} lacks {', '.join(what)}, which this host has"
    elif outcome.reason is RunReason.DISK_EXHAUSTED and disk is not None:
        detail = (f"the workspace reached its disk bound of {(disk.bound_bytes or 0) >> 20} MiB; "
                  "writes past it failed with ENOSPC")
    elif finished is not None and finished.stop is not AgentStop.FINISHED and finished.detail:
        detail = finished.detail
    elif check is not None and check.exit_code != 0:
        detail = check.detail
    else:
        detail = ""
    extra: dict[str, Any] = {}
    if finished is not None:
        extra = {"agent_stop": finished.stop.value, "turns": finished.turns,
                 "usage": finished.usage, "claim": finished.claim}
    if agent_egress:
        # Records, not requests: an inspected tunnel leaves its own and one per request.
        extra["agent_egress"] = {"records": len(agent_egress),
                                 "refused": sum(1 for r in agent_egress if r.denied)}
    if task.mutation is not None:
        extra["mutation"] = task.mutation.to_data()
    if failure is not None:
        extra["failure"] = {"phase": failure.phase, "who": failure.who,
                            "error_type": failure.error_type}
    if outcome.classification is Classification.BLOCKED:
        # Which failed steps the boundary refused, and what: the refusals that decided.
        extra["blocked_by"] = [
            {"step": step.command, "source": step.source.value,
             "refusals": [f"{_refused_where(r)} ({r.reason.value})" for r in refused]}
            for step, refused in blocking_steps(events)]
    if lacked is not None:
        extra["image_lacked"] = {"image": lacked.image, "commands": lacked.commands,
                                 "libraries": lacked.libraries}
    if disk is not None:
        extra["disk"] = {"bound_bytes": disk.bound_bytes, "mechanism": disk.mechanism,
                         "peak_bytes": disk.peak_bytes, "reached": disk.reached}
    probed = next((e for e in events if isinstance(e, AffordancesProbed)), None)
    if probed is not None:
        extra["affordances"] = probed.summary
    decided = [e for e in events if isinstance(e, PermissionDecided)]
    if decided:
        refused = [e for e in decided if e.verdict is not permissions.PermissionVerdict.ALLOW]
        extra["permissions"] = {
            "allowed": len(decided) - len(refused),
            "refused": len(refused),
            "refusals": [{"tool": e.tool, "argument": e.argument, "reason": e.reason.value,
                          "rule": e.rule, "origin": e.origin} for e in refused],
        }
    return RunRecord(
        task=task.name, task_file=task.path, task_sha256=task.sha256, attempt=attempt,
        agent=agent_name, model=model, classification=outcome.classification,
        reason=outcome.reason.value,
        backend=info["backend"] if info else None,
        enforcement=info["enforcement"] if info else None,
        policy_hash=info["policy_hash"] if info else None,
        attestation=tuple(info["attestation"]) if info else (),
        layers=tuple(info["layers"]) if info else (),
        pages=tuple(_page(e.page) for e in reads),
        docs_route=task.docs_route,
        last_page_before_failure=last_page_before_failure(events),
        route_findings=findings,
        blocked_egress=blocked,
        check_exit=check.exit_code if check is not None else None,
        check_output=check.output if check is not None else "",
        check_isolation=isolated.isolation if isolated is not None else None,
        killed_before_check=isolated.killed if isolated is not None else None,
        allow_fix=_allow_fix(events, outcome),
        commands=sum(1 for e in events if isinstance(e, CommandRan) and e.source is Source.AGENT),
        started_at=started_at,
        duration_s=round(duration_s, 3),
        trace=trace,
        detail=detail,
        extra=extra,
    )
