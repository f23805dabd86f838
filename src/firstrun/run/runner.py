"""One run of one task: workspace, proxy, attested session, setup, agent, check, record.

Guarantee: ``run_task`` always returns a ``RunRecord`` and never raises for
anything that happens inside the run: the sandbox, attestation, the proxy and the
docs reader failing are ``infra_error``, any other exception a firstrun bug,
``harness_error``, with its traceback in the trace. The check runs in the
agent's session and workspace, after it. The classification comes from the
typed events alone, and the trace is complete before it is made.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from decimal import Decimal
from pathlib import Path

from firstrun.agents.base import Agent, AgentResult, AgentStop, Brief, BudgetExhausted
from firstrun.agents.cli.frame import ProcessAgent
from firstrun.docs import Politeness, probe_affordances
from firstrun.errors import SandboxError
from firstrun.proxy.records import now_iso
from firstrun.results.model import RunRecord
from firstrun.run.check import agent_output, run_check
from firstrun.run.classify import RunReason, classify_run
from firstrun.run.config import RunConfig
from firstrun.run.events import (
    TRACE_FILE,
    AffordancesProbed,
    AgentFinished,
    CommandRan,
    Event,
    Failure,
    RunFinished,
    RunStarted,
    SandboxStarted,
    Source,
    Trace,
    WorkspaceDisk,
)
from firstrun.run.lacking import image_lacked
from firstrun.run.record import Recorder, build_record, failure_event
from firstrun.run.sandbox import open_sandbox
from firstrun.run.toolbelt import RunInterrupted, RunToolbelt
from firstrun.run.workspace import Workspace
from firstrun.sandbox.base import Session
from firstrun.sandbox.disk import DiskBound, SizedWorkspace, open_sized_workspace
from firstrun.tasks.model import Task

__all__ = ["RunConfig", "run_task", "run_dir"]

# Agent stops after which the check can still decide the run.
_CHECKED = frozenset({AgentStop.FINISHED, AgentStop.STEP_FAILED, AgentStop.BUDGET_EXHAUSTED})
# How soon a stop reaches a command that is running; only bounds the watcher's sleep.
_STOP_POLL_S = 0.2


def run_dir(config: RunConfig, task_name: str, attempt: int) -> Path:
    return config.out_dir / "runs" / task_name / str(attempt)


def fresh_run_dir(config: RunConfig, task_name: str, attempt: int) -> Path:
    """The attempt's directory, with whatever an earlier sweep into the same --out left
    there removed (rmtree removes symlinks a kept workspace holds, never follows them)."""
    where = run_dir(config, task_name, attempt)
    if where.exists():
        shutil.rmtree(where)
    return where


def run_task(
    task: Task,
    *,
    attempt: int,
    agent: Agent,
    config: RunConfig,
    on_event: Callable[[Event], None] | None = None,
    stop: threading.Event | None = None,
    max_spend: Decimal | None = None,
) -> RunRecord:
    """Run ``task`` once. ``stop`` (set on Ctrl-C) ends the run at the next call boundary.

    ``max_spend`` is the run's spend limit in USD (its ``--max-spend``
    reservation), handed to the agent in its brief.
    """
    where = fresh_run_dir(config, task.name, attempt)
    trace = Trace(where / TRACE_FILE)
    recorder = Recorder(trace, on_event)
    started_at, started = now_iso(), time.monotonic()
    try:
        recorder.emit(RunStarted(task=task.name, attempt=attempt, agent=agent.name,
                                 model=agent.model, task_file=task.path, task_sha256=task.sha256))
        _carry_out(task, agent=agent, config=config, where=where, recorder=recorder, stop=stop,
                   max_spend=max_spend)
        # Only now: egress records were written as the proxy made them, and the
        # session and proxy are closed, so their last records are in.
        outcome = classify_run(trace.events())
        recorder.emit(RunFinished(classification=outcome.classification.value,
                                  reason=outcome.reason.value))
        return build_record(task, attempt=attempt, agent_name=agent.name, model=agent.model,
                            outcome=outcome,
                            events=trace.events(), started_at=started_at,
                            duration_s=time.monotonic() - started,
                            trace=str((where / TRACE_FILE).relative_to(config.out_dir)))
    finally:
        trace.close()


def _carry_out(task: Task, *, agent: Agent, config: RunConfig, where: Path,
               recorder: Recorder, stop: threading.Event | None,
               max_spend: Decimal | None = None) -> None:
    """Everything between run_started and classification; exceptions end here as events."""
    phase = "workspace"
    temporary: str | None = None
    disk: SizedWorkspace | DiskBound | None = None
    try:
        budgets = task.spec.budgets
        disk = open_sized_workspace(budgets.max_disk_mb, asked=budgets.disk_asked)
        if isinstance(disk, SizedWorkspace):
            # Kept by copying out once the session is over (see _give_back_disk).
            workspace = Path(disk.path)
        elif config.keep_sandbox:
            workspace = where / "workspace"
            workspace.mkdir(parents=True)
        else:
            # Private and thrown away unless keep_sandbox keeps it at
            # out_dir/runs/<task>/<attempt>/workspace.
            temporary = tempfile.mkdtemp(prefix="firstrun-ws-")
            workspace = Path(temporary)
        _stop_point(stop)
        phase = "sandbox"
        politeness = config.politeness if config.politeness is not None else Politeness()
        with ExitStack() as stack:
            enclosure = stack.enter_context(open_sandbox(
                task, workspace=str(workspace), config=config, politeness=politeness,
                on_record=recorder.egress, protect=False,
                needs=agent.needs if isinstance(agent, ProcessAgent) else None))
            session = enclosure.session
            stack.enter_context(_interrupt_on(stop, session))
            recorder.emit(SandboxStarted(info=session.info.to_data()))
            if config.probe_affordances:
                phase = "docs_probe"
                probe = probe_affordances(enclosure.reader, task.docs_route)
                recorder.emit(AffordancesProbed(**probe.to_data()))
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
                    # infra_error (run.classify); the agent never runs.
                    return
            _stop_point(stop)
            phase = "agent"
            brief = Brief(task=task.name, goal=task.spec.goal, docs_route=task.docs_route,
                          docs_hosts=task.docs_hosts, budgets=budgets, replay=task.spec.replay_steps,
                          replay_docs=task.spec.replay_docs, mutation=task.mutation,
                          max_spend=max_spend)
            tools = RunToolbelt(session=session, reader=enclosure.reader, route=task.docs_route,
                                max_seconds=float(budgets.max_seconds),
                                max_command_seconds=float(budgets.max_command_seconds),
                                emit=recorder.emit, stop=stop,
                                permissions=(*config.permissions, task.permissions),
                                refusals=recorder.refusals)
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
                checked = run_check(task, session=session, workspace=handle,
                                    output=agent_output(recorder.events()),
                                    timeout_s=float(budgets.max_command_seconds),
                                    emit=recorder.emit)
            # A stop that came while the check ran may have killed what it
            # judged (a Ctrl-C reaches a command and the sweep in either
            # order): its verdict is no evidence either way.
            _stop_point(stop)
            if checked.exit_code != 0:
                phase = "image_probe"
                lacked = image_lacked(session, session.info.image, recorder.events(),
                                      task.spec.success.script or "")
                if lacked is not None:
                    recorder.emit(lacked)
        phase = "teardown"
        recorder.raise_deferred()
    except RunInterrupted:
        recorder.emit(_interrupted(phase))
    except Exception as exc:
        # Every exception is mapped once, here, by its type (failure_event): who
        # failed is named in a failure event. A command cut short by the stop fails with a SandboxError; that is
        # the interrupt, not a sandbox fault.
        interrupted = stop is not None and stop.is_set() and isinstance(exc, SandboxError)
        recorder.emit(_interrupted(phase) if interrupted else failure_event(exc, phase=phase))
    finally:
        if disk is not None:
            _give_back_disk(disk, keep=where / "workspace" if config.keep_sandbox else None,
                            recorder=recorder)
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _give_back_disk(disk: SizedWorkspace | DiskBound, *, keep: Path | None,
                    recorder: Recorder) -> None:
    """Record what bounded the workspace, keep a copy if asked, and unmount it."""
    if isinstance(disk, DiskBound):
        recorder.emit(WorkspaceDisk(**disk.to_data()))
        return
    try:
        recorder.emit(WorkspaceDisk(**disk.bound().to_data()))
        if keep is not None:
            disk.copy_to(str(keep))
    except SandboxError as exc:
        recorder.emit(failure_event(exc, phase="teardown"))
    finally:
        disk.close()


def _interrupted(phase: str) -> Failure:
    return Failure(phase=phase, who="user", error_type="Interrupted",
                   message="the sweep was stopped", infra=True, reason=RunReason.INTERRUPTED.value)


@contextmanager
def _interrupt_on(stop: threading.Event | None, session: Session) -> Iterator[None]:
    """While the block runs, a set ``stop`` interrupts ``session`` at once.

    Without this, Ctrl-C would wait for the running command's own timeout
    (minutes, for an install) before the sweep could end.
    """
    if stop is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if stop.wait(_STOP_POLL_S):
                session.interrupt()
                return

    watcher = threading.Thread(target=watch, name="firstrun-stop-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _stop_point(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise RunInterrupted()
