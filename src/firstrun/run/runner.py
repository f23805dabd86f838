"""One run of one task: workspace, proxy, attested session, setup, agent, check, record.

Guarantee: ``run_task`` always returns a ``RunRecord`` and never raises for
anything that happens inside the run. Every exception is mapped once, here,
by its type: the sandbox refusing or failing, attestation, the proxy and the
docs reader are ``infra_error`` (with a ``failure`` event naming who); any
other exception is a firstrun bug, ``harness_error``, with its traceback in
the trace. A failing ``setup`` step is ``infra_error`` and the agent never
runs. The check runs in the same session and workspace as the agent, after
it. The classification comes from the typed events alone
(``firstrun.run.classify``), and the trace is complete before it is made:
egress records are written as the proxy makes them, and the session and the
proxy are closed (so their last records are in) before classifying. A
workspace is private and thrown away, unless ``keep_sandbox`` keeps it at
``out_dir/runs/<task>/<attempt>/workspace``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from firstrun.agents.base import Agent, AgentResult, AgentStop, Brief, BudgetExhausted
from firstrun.docs import Politeness
from firstrun.errors import (
    AttestationFailed,
    DocsError,
    FirstrunError,
    ProxyError,
    SandboxError,
    SandboxUnavailable,
)
from firstrun.proxy.records import EgressRecord
from firstrun.results.model import PageRead, RunRecord
from firstrun.run.check import agent_output, run_check
from firstrun.run.classify import Reason, Verdict, classify
from firstrun.run.config import RunConfig
from firstrun.run.events import (
    AgentFinished,
    CheckFinished,
    CommandRan,
    DocsRead,
    Egress,
    Event,
    Failure,
    RunFinished,
    RunStarted,
    SandboxStarted,
    Source,
    Trace,
)
from firstrun.run.sandbox import open_sandbox
from firstrun.run.toolbelt import RunInterrupted, RunToolbelt
from firstrun.run.workspace import Workspace
from firstrun.tasks.model import Task

__all__ = ["RunConfig", "run_task", "run_dir"]

TRACE_FILE = "trace.jsonl"
# Agent stops after which the check can still decide the run.
_CHECKED = frozenset({AgentStop.FINISHED, AgentStop.STEP_FAILED, AgentStop.BUDGET_EXHAUSTED})


def run_dir(config: RunConfig, task_name: str, attempt: int) -> Path:
    return config.out_dir / "runs" / task_name / str(attempt)


def infra_reason(exc: BaseException) -> Reason | None:
    """The infrastructure reason for ``exc``, or None when it is a harness bug. By type only."""
    if isinstance(exc, SandboxUnavailable):
        return Reason.SANDBOX_REFUSED
    if isinstance(exc, AttestationFailed):
        return Reason.ATTESTATION_FAILED
    if isinstance(exc, SandboxError):
        return Reason.SANDBOX_FAILED
    if isinstance(exc, ProxyError):
        return Reason.PROXY_FAILED
    if isinstance(exc, DocsError):
        return Reason.DOCS_FAILED
    return None


def failure_event(exc: BaseException, *, phase: str) -> Failure:
    reason = infra_reason(exc)
    if reason is not None:
        assert isinstance(exc, FirstrunError)
        return Failure(phase=phase, who=exc.who, error_type=type(exc).__name__,
                       message=str(exc), infra=True, reason=reason.value)
    return Failure(phase=phase, who="harness", error_type=type(exc).__name__,
                   message="".join(traceback.format_exception(exc)), infra=False,
                   reason=Reason.HARNESS_ERROR.value)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Recorder:
    """Writes events to the trace and the caller's callback, from any thread.

    Egress arrives on the proxy's thread, which must never see an exception;
    a failure there is kept and raised on the run's own thread.
    """

    def __init__(self, trace: Trace, on_event: Callable[[Event], None] | None) -> None:
        self._trace = trace
        self._on_event = on_event
        self._lock = threading.Lock()
        self.errors: list[Exception] = []

    def emit(self, event: Event) -> None:
        self._trace.emit(event)
        if self._on_event is not None:
            self._on_event(event)

    def events(self) -> list[Event]:
        return self._trace.events()

    def egress(self, record: EgressRecord) -> None:
        try:
            self.emit(Egress(record=record.to_data()))
        except Exception as exc:
            with self._lock:
                self.errors.append(exc)

    def raise_deferred(self) -> None:
        with self._lock:
            if self.errors:
                raise self.errors[0]


def run_task(
    task: Task,
    *,
    attempt: int,
    agent: Agent,
    config: RunConfig,
    on_event: Callable[[Event], None] | None = None,
    stop: threading.Event | None = None,
) -> RunRecord:
    """Run ``task`` once. ``stop`` (set on Ctrl-C) ends the run at the next call boundary."""
    where = run_dir(config, task.name, attempt)
    if where.exists():
        # A fresh sweep into the same --out replaces this attempt; rmtree
        # removes symlinks a kept workspace holds and never follows them.
        shutil.rmtree(where)
    trace = Trace(where / TRACE_FILE)
    recorder = _Recorder(trace, on_event)
    started_at, started = _now(), time.monotonic()
    try:
        recorder.emit(RunStarted(task=task.name, attempt=attempt, agent=agent.name,
                                 model=agent.model, task_file=task.path, task_sha256=task.sha256))
        _carry_out(task, agent=agent, config=config, where=where, recorder=recorder, stop=stop)
        verdict = classify(trace.events())
        recorder.emit(RunFinished(classification=verdict.classification.value,
                                  reason=verdict.reason.value))
        return build_record(task, attempt=attempt, agent=agent, verdict=verdict,
                            events=trace.events(), started_at=started_at,
                            duration_s=time.monotonic() - started,
                            trace=str((where / TRACE_FILE).relative_to(config.out_dir)))
    finally:
        trace.close()


def _carry_out(task: Task, *, agent: Agent, config: RunConfig, where: Path,
               recorder: _Recorder, stop: threading.Event | None) -> None:
    """Everything between run_started and classification; exceptions end here as events."""
    phase = "workspace"
    temporary: str | None = None
    try:
        if config.keep_sandbox:
            workspace = where / "workspace"
            workspace.mkdir(parents=True)
        else:
            temporary = tempfile.mkdtemp(prefix="firstrun-ws-")
            workspace = Path(temporary)
        _stop_point(stop)
        phase = "sandbox"
        politeness = config.politeness if config.politeness is not None else Politeness()
        with open_sandbox(task, workspace=str(workspace), config=config, politeness=politeness,
                          on_record=recorder.egress) as enclosure:
            session = enclosure.session
            recorder.emit(SandboxStarted(info=session.info.to_data()))
            budgets = task.spec.budgets
            phase = "setup"
            for step in task.spec.setup:
                _stop_point(stop)
                result = session.exec(step)
                recorder.emit(CommandRan(
                    source=Source.SETUP, command=step, exit_code=result.exit_code,
                    duration_s=round(result.duration_s, 3), timed_out=result.timed_out,
                    stdout=result.stdout.text(), stderr=result.stderr.text(),
                    truncated=result.stdout.truncated or result.stderr.truncated))
                if result.exit_code != 0:
                    return
            _stop_point(stop)
            phase = "agent"
            brief = Brief(task=task.name, goal=task.spec.goal, docs_route=task.docs_route,
                          docs_hosts=task.docs_hosts, budgets=budgets, replay=task.spec.replay)
            tools = RunToolbelt(session=session, reader=enclosure.reader, route=task.docs_route,
                                max_seconds=float(budgets.max_seconds),
                                max_command_seconds=float(budgets.max_command_seconds),
                                emit=recorder.emit, stop=stop)
            try:
                outcome = agent.run(brief, tools)
            except BudgetExhausted as exc:
                outcome = AgentResult(stop=AgentStop.BUDGET_EXHAUSTED,
                                      detail=f"{exc.budget}: {exc.detail}")
            recorder.emit(AgentFinished(stop=outcome.stop, turns=outcome.turns, claim=outcome.claim,
                                        detail=outcome.detail, usage=dict(outcome.usage)))
            if outcome.stop not in _CHECKED:
                return
            _stop_point(stop)
            phase = "check"
            with Workspace(workspace) as handle:
                run_check(task, session=session, workspace=handle,
                          output=agent_output(recorder.events()),
                          timeout_s=float(budgets.max_command_seconds), emit=recorder.emit)
        phase = "teardown"
        recorder.raise_deferred()
    except RunInterrupted:
        recorder.emit(Failure(phase=phase, who="user", error_type="Interrupted",
                              message="the sweep was stopped", infra=True,
                              reason=Reason.INTERRUPTED.value))
    except Exception as exc:
        recorder.emit(failure_event(exc, phase=phase))
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _stop_point(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise RunInterrupted()


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


def build_record(task: Task, *, attempt: int, agent: Agent, verdict: Verdict, events: list[Event],
                 started_at: str, duration_s: float, trace: str) -> RunRecord:
    info = next((e.info for e in events if isinstance(e, SandboxStarted)), None)
    reads = [e for e in events if isinstance(e, DocsRead)]
    finished = next((e for e in events if isinstance(e, AgentFinished)), None)
    check = next((e for e in events if isinstance(e, CheckFinished)), None)
    failure = next((e for e in events if isinstance(e, Failure)), None)
    findings = tuple(
        {"url": e.page["url_requested"], "error": e.page["error"], "status": e.page["status"],
         "detail": e.page["detail"]}
        for e in reads if e.route and e.page.get("error") is not None
    )
    blocked = tuple(e.record for e in events
                    if isinstance(e, Egress) and e.record.get("decision") == "deny")
    failed_setup = next((e for e in events if isinstance(e, CommandRan)
                         and e.source is Source.SETUP and e.exit_code != 0), None)
    if failure is not None:
        detail = failure.message.strip().splitlines()[-1] if failure.message.strip() else ""
    elif failed_setup is not None:
        detail = f"setup step exited {failed_setup.exit_code}: {failed_setup.command}"
    elif check is not None and check.exit_code != 0:
        detail = check.detail or (finished.detail if finished else "")
    else:
        detail = finished.detail if finished is not None else ""
    extra: dict[str, Any] = {}
    if finished is not None:
        extra = {"agent_stop": finished.stop.value, "turns": finished.turns,
                 "usage": finished.usage, "claim": finished.claim}
    if failure is not None:
        extra["failure"] = {"phase": failure.phase, "who": failure.who,
                            "error_type": failure.error_type}
    return RunRecord(
        task=task.name, task_file=task.path, task_sha256=task.sha256, attempt=attempt,
        agent=agent.name, model=agent.model, classification=verdict.classification,
        reason=verdict.reason.value,
        backend=info["backend"] if info else None,
        enforcement=info["enforcement"] if info else None,
        policy_hash=info["policy_hash"] if info else None,
        attestation=tuple(info["attestation"]) if info else (),
        layers=tuple(info["layers"]) if info else (),
        pages=tuple(_page(e.page) for e in reads),
        last_page_before_failure=last_page_before_failure(events),
        route_findings=findings,
        blocked_egress=blocked,
        check_exit=check.exit_code if check is not None else None,
        check_output=check.output if check is not None else "",
        commands=sum(1 for e in events if isinstance(e, CommandRan) and e.source is Source.AGENT),
        started_at=started_at,
        duration_s=round(duration_s, 3),
        trace=trace,
        detail=detail,
        extra=extra,
    )
