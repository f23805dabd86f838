"""The success check: one bash script, generated, run in the session after the agent.

Guarantee: before a ``clean`` check starts (every check but a local ``wait_http``
with no ``serve``), every process setup and the agent left is killed and gone,
and how many is recorded, so nothing from the agent phase can watch, read,
signal or disturb the check; a ``shared`` check runs beside them and the run
says so. No program the agent planted answers for one the check runs, no agent
can read the script, and exit status 0 is a pass and nothing else is.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import time
import zlib
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from firstrun.docs import Politeness
from firstrun.errors import UsageError
from firstrun.proxy.records import now_iso
from firstrun.results.model import RunRecord
from firstrun.run.classify import classify_run
from firstrun.run.config import RunConfig
from firstrun.run.events import (
    CheckFinished,
    CheckIsolated,
    CommandRan,
    Event,
    RunFinished,
    RunStarted,
    SandboxStarted,
    Source,
    Trace,
    read_trace,
)
from firstrun.run.record import Recorder, build_record, failure_event
from firstrun.run.sandbox import open_sandbox
from firstrun.run.workspace import Workspace
from firstrun.sandbox.base import ExecResult, Session
from firstrun.tasks.model import CheckIsolation, JsonScalar, Task

RECHECK_AGENT = "check"

# As quickstarted: above the ports quickstarts document (3000, 5173, 8000,
# 8080), stable per task name so a failure reproduces by hand.
PORT_BASE = 21000
PORT_SPAN = 20000

OUTPUT_EXCERPT_CHARS = 4000


def check_port(task_name: str) -> int:
    return PORT_BASE + zlib.crc32(task_name.encode("utf-8")) % PORT_SPAN


def prelude() -> str:
    return resources.files("firstrun.run").joinpath("prelude.sh").read_text(encoding="utf-8")


# First in every check: only PATH entries no command could have written. Every
# entry that is relative or lies where the sandbox lets commands write (the
# workspace, HOME, TMPDIR, /tmp, /var/tmp, /dev/shm) is taken out, so no program
# the agent planted answers for a system one; a tool the workspace holds runs
# only where the check names it (.venv/bin/python).
TRUSTED_PATH = """\
# ---- the check's PATH: the session's, less every place commands may write
_qs_path=""
IFS=: read -r -a _qs_entries <<< "$PATH"
for _qs_entry in "${_qs_entries[@]}"; do
  case "$_qs_entry" in /*) ;; *) continue ;; esac
  for _qs_root in "$PWD" "$HOME" "${TMPDIR:-/tmp}" /tmp /var/tmp /dev/shm; do
    [ -n "$_qs_root" ] && [ "$_qs_root" != / ] || continue
    case "${_qs_entry%/}/" in "${_qs_root%/}/"*) continue 2 ;; esac
  done
  _qs_path="${_qs_path:+$_qs_path:}$_qs_entry"
done
PATH=$_qs_path
export PATH
unset _qs_path _qs_entries _qs_entry _qs_root
hash -r"""


def _json_text(value: JsonScalar) -> str:
    # As the body spells it: JSON's literals, not Python's.
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return str(value)


def _declared(task: Task) -> list[str]:
    success = task.spec.success
    lines: list[str] = []
    if success.serve is not None:
        # The author's command line, as written: it may use $QS_PORT and quoting.
        lines.append(f"qs_serve {success.serve.strip()}")
    wait = success.wait_http
    if wait is not None:
        # The model guarantees one of the two; url wins, as quickstarted had it.
        target = wait.url if wait.url is not None else wait.path
        assert target is not None
        args = [target]
        args += ["--status", str(wait.status), "--timeout", str(wait.timeout)]
        for text in wait.contains:
            args += ["--contains", text]
        for pattern in wait.matches:
            args += ["--matches", pattern]
        for key, value in wait.json_pairs:
            args += ["--json", f"{key}={_json_text(value)}"]
        lines.append("qs_wait_http " + " ".join(shlex.quote(a) for a in args))
    expect = success.expect_output
    if expect is not None:
        args = []
        for text in expect.contains:
            args += ["--contains", text]
        for pattern in expect.matches:
            args += ["--matches", pattern]
        lines.append("qs_expect_output " + " ".join(shlex.quote(a) for a in args))
    return lines


def build_check_script(task: Task, *, port: int) -> str:
    """The complete check for ``task``, as bash text. Pure."""
    # The PATH, then the helpers (qs_fail, qs_serve, qs_wait_http,
    # qs_expect_output, $QS_PORT), which run their own tools so no rc file the
    # agent left in HOME steers them; then the declared criteria in the order
    # serve, wait_http, expect_output; then the task's own script or file text,
    # in a subshell so its exit, set -e and traps stay its own while the helpers
    # still clean up.
    parts = [TRUSTED_PATH, f"QS_PORT={port}", prelude().rstrip("\n"), "# ---- the task's criteria"]
    parts += _declared(task)
    if task.check.strip():
        parts += ["(", task.check.rstrip("\n"), ")"]
    return "\n".join(parts) + "\n"


def agent_output(events: Sequence[Event]) -> bytes:
    """What ``expect_output`` matches: the output of agent commands that exited 0."""
    # Stdout and stderr only: not setup's, not the commands' text.
    return _joined(
        [e.stdout, e.stderr]
        for e in events
        if isinstance(e, CommandRan) and e.source is Source.AGENT and e.exit_code == 0
    )


def agent_output_from_trace(lines: Sequence[dict[str, Any]]) -> bytes:
    """``agent_output`` of a run read back from its ``trace.jsonl``."""
    return _joined(
        [line.get("stdout", ""), line.get("stderr", "")]
        for line in lines
        if line.get("kind") == CommandRan.kind
        and line.get("source") == Source.AGENT.value
        and line.get("exit_code") == 0
    )


def _joined(pairs: Any) -> bytes:
    chunks = [c for pair in pairs for c in pair if c]
    return "".join(c if c.endswith("\n") else c + "\n" for c in chunks).encode()


def _excerpt(result: ExecResult) -> str:
    text = result.stdout.text() + result.stderr.text()
    return text[-OUTPUT_EXCERPT_CHARS:]


def run_check(
    task: Task,
    *,
    session: Session,
    workspace: Workspace,
    output: bytes,
    timeout_s: float,
    emit: Callable[[Event], None],
) -> CheckFinished:
    """Run the check in ``session`` over ``workspace``; emit and return its result.

    A ``clean`` check first has the session kill everything left running.
    """
    isolation = task.spec.success.isolation()
    killed = session.kill_all() if isolation is CheckIsolation.CLEAN else None
    emit(CheckIsolated(isolation=isolation.value, killed=killed))
    # The agent output is written host-side under an unguessable name only now,
    # after the kill, and removed right after the check.
    log_name = f".firstrun-output-{secrets.token_hex(8)}.log"
    workspace.write_new(log_name, output)
    script = build_check_script(task, port=check_port(task.name))
    started = time.monotonic()
    try:
        # An argument of bash -c, never written into the workspace, so no agent
        # can read the answer key. A timeout (the task's per-command limit), a
        # signal or a lost session is a failure: only exit 0 passes.
        result = session.exec(
            ["/bin/bash", "-c", script, "firstrun-check"],
            timeout=timeout_s,
            env={"QS_SESSION_LOG": log_name},
        )
    finally:
        workspace.remove(log_name)
    emit(
        CommandRan(
            source=Source.CHECK,
            command="<success check>",
            exit_code=result.exit_code,
            duration_s=result.duration_s,
            timed_out=result.timed_out,
            stdout=result.stdout.text(),
            stderr=result.stderr.text(),
            truncated=result.stdout.truncated or result.stderr.truncated,
        )
    )
    if result.timed_out:
        detail = f"timed out after {timeout_s:g}s"
    else:
        # qs_fail prints its reason last, so the last line says why.
        lines = [line for line in result.stdout.text().splitlines() if line.strip()]
        detail = lines[-1] if lines and result.exit_code != 0 else ""
    finished = CheckFinished(
        exit_code=None if result.timed_out else result.exit_code,
        output=_excerpt(result),
        duration_s=round(time.monotonic() - started, 3),
        detail=detail,
    )
    emit(finished)
    return finished


def recheck(task: Task, *, sandbox_dir: Path, config: RunConfig,
            allow_write: tuple[str, ...] = ()) -> RunRecord:
    """Run only the check of ``task`` against a kept workspace, on ``config``'s backend.

    The kept directory is not this process's own, so its protected entries
    are held read-only during the check, less ``allow_write``.

    The backend is chosen exactly as for a run, so ``local`` is refused
    unless unenforced execution was allowed. ``expect_output`` matches the
    agent output recorded in the run's ``trace.jsonl`` beside the workspace
    (``--keep-sandbox`` puts it there); without that trace it matches
    nothing. The recheck's own trace is ``out_dir/runs/<task>/check/trace.jsonl``.
    """
    if not sandbox_dir.is_dir():
        raise UsageError(f"--sandbox: {os.fspath(sandbox_dir)!r} is not a directory")
    workspace = sandbox_dir.resolve()
    beside = workspace.parent / "trace.jsonl"
    output = agent_output_from_trace(read_trace(beside)) if beside.is_file() else b""
    where = config.out_dir / "runs" / task.name / RECHECK_AGENT
    if where.exists():
        shutil.rmtree(where)
    trace = Trace(where / "trace.jsonl")
    recorder = Recorder(trace, None)
    started_at, started = now_iso(), time.monotonic()
    try:
        recorder.emit(RunStarted(task=task.name, attempt=0, agent=RECHECK_AGENT, model=None,
                                 task_file=task.path, task_sha256=task.sha256))
        phase = "sandbox"
        try:
            with open_sandbox(task, workspace=str(workspace), config=config,
                              politeness=config.politeness or Politeness(),
                              on_record=recorder.egress, protect=True,
                              lift=allow_write) as enclosure:
                recorder.emit(SandboxStarted(info=enclosure.session.info.to_data()))
                phase = "check"
                with Workspace(workspace) as handle:
                    run_check(task, session=enclosure.session, workspace=handle, output=output,
                              timeout_s=float(task.spec.budgets.max_command_seconds),
                              emit=recorder.emit)
            recorder.raise_deferred()
        except Exception as exc:
            recorder.emit(failure_event(exc, phase=phase))
        outcome = classify_run(trace.events())
        recorder.emit(RunFinished(classification=outcome.classification.value,
                                  reason=outcome.reason.value))
        return build_record(task, attempt=0, agent_name=RECHECK_AGENT, model=None,
                            outcome=outcome, events=trace.events(), started_at=started_at,
                            duration_s=time.monotonic() - started,
                            trace=str((where / "trace.jsonl").relative_to(config.out_dir)))
    finally:
        trace.close()
