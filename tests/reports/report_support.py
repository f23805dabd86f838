"""Saved results for report tests: real ``RunRecord``s in a real store, real traces.

Results directories are written the way a sweep writes them: ``ResultsStore``
for ``results.json`` and ``Trace`` with the runner's typed events for each
``trace.jsonl``, so the reports read exactly what a run would have saved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from egress_support import SavedEgress
from firstrun.agents.base import AgentStop
from firstrun.docs.blocks import extract
from firstrun.results.model import Classification, PageRead, RunRecord
from firstrun.results.store import ResultsStore
from firstrun.run.events import (
    AgentFinished,
    CheckFinished,
    CommandRan,
    DocsRead,
    RunFinished,
    RunStarted,
    Source,
    Trace,
)

FIRSTRUN = Path(sys.executable).parent / "firstrun"

# A quickstart whose one block pins a tabulate that does not exist.
PIN_PAGE = "https://docs.test/quickstart"
PIN_BLOCKS = [b.to_data() for b in extract(
    '<pre><code class="language-console">$ pip install tabulate==0.0.999\n$ python app.py</code></pre>',
    url=PIN_PAGE)]

ROUTE = ("https://docs.test/a", "https://docs.test/b", "https://docs.test/c")

# Text an attacker controls in a task file, a docs site or an agent's output.
HOSTILE = "<script>alert(\"x\")</script>'\"><img src=x onerror=alert(1)>&amp;"


def page(url: str, *, error: str | None = None) -> PageRead:
    return PageRead(url_requested=url, url_final=None if error else url, status=None if error else 200,
                    error=error, bytes=0 if error else 100, sha256=None if error else "c" * 64)


def record(task: str, attempt: int, classification: Classification, **fields: Any) -> RunRecord:
    base: dict[str, Any] = {
        "task": task,
        "task_file": f"tasks/{task}.yaml",
        "task_sha256": "ab" * 32,
        "attempt": attempt,
        "agent": "replay",
        "model": None,
        "classification": classification,
        "reason": {Classification.PASSED: "passed", Classification.DOCS_GAP: "check_failed"}.get(
            classification, "sandbox_failed"),
        "backend": "linux",
        "enforcement": "enforced",
        "policy_hash": "sha256:" + "p" * 16,
        "docs_route": ROUTE,
        "pages": tuple(page(u) for u in ROUTE),
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 1.5,
        "trace": f"runs/{task}/{attempt}/trace.jsonl",
    }
    base.update(fields)
    return RunRecord(**base)


def runs(task: str, passed: int, gaps: int, *, start: int = 1, **fields: Any) -> list[RunRecord]:
    kinds = [Classification.PASSED] * passed + [Classification.DOCS_GAP] * gaps
    return [record(task, start + i, c, **fields) for i, c in enumerate(kinds)]


def write_trace(out: Path, r: RunRecord, *, command: str = "pip install tabulate") -> None:
    """The trace a run like ``r`` leaves: its reads, a command, its blocked egress, the check."""
    trace = Trace(out / r.trace)
    try:
        trace.emit(RunStarted(task=r.task, attempt=r.attempt, agent=r.agent, model=r.model,
                              task_file=r.task_file, task_sha256=r.task_sha256))
        for p in r.pages:
            trace.emit(DocsRead(page={"url_requested": p.url_requested, "url_final": p.url_final,
                                      "status": p.status, "error": p.error, "detail": "", "bytes": p.bytes},
                                route=p.url_requested in r.docs_route))
        failed = r.classification is not Classification.PASSED
        trace.emit(CommandRan(source=Source.AGENT, command=command, exit_code=1 if failed else 0,
                              duration_s=0.5, stderr=f"error: {command}\n" if failed else ""))
        for b in r.blocked_egress:
            trace.emit(SavedEgress(record={**b, "decision": "deny"}))
        trace.emit(AgentFinished(stop=AgentStop.FINISHED, turns=2))
        trace.emit(CheckFinished(exit_code=1 if failed else 0, output="check output\n", duration_s=0.1))
        trace.emit(RunFinished(classification=r.classification.value, reason=r.reason))
    finally:
        trace.close()


def write_results(out: Path, records: list[RunRecord], *, traces: bool = True,
                  meta: dict[str, Any] | None = None) -> Path:
    """A results directory holding ``records`` (and, by default, a trace for each)."""
    store = ResultsStore(out, meta=meta or {"agent": "replay", "model": None,
                                            "started_at": "2026-01-01T00:00:00+00:00"})
    store.flush()
    for r in records:
        if traces and r.trace:
            write_trace(out, r)
        store.add(r.to_data())
    return out


def firstrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, never through a shell, stdin closed."""
    assert FIRSTRUN.exists(), f"{FIRSTRUN} missing: run scripts/install"
    return subprocess.run([str(FIRSTRUN), *args], check=False, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120,
                          env=env if env is not None else dict(os.environ))


def pin_sweep(out: Path, *, no_dist: str, meta: dict[str, Any], missing: bool = False,
              **fields: Any) -> Path:
    """Three runs break at PIN_PAGE's pinned block with ``no_dist``, every run ran
    ``pip install wheel`` (no page gives it), the fourth passes. ``missing``: run 1 has no
    trace. ``fields`` go to each ``record``."""
    store = ResultsStore(out, meta=meta)
    store.flush()
    kinds = [Classification.DOCS_GAP] * 3 + [Classification.PASSED]
    for attempt, kind in enumerate(kinds, start=1):
        failed = kind is Classification.DOCS_GAP
        r = record("pin", attempt, kind, commands=2, **fields)
        if not (missing and attempt == 1):
            trace = Trace(out / r.trace)
            trace.emit(DocsRead(page={"url_requested": PIN_PAGE, "url_final": PIN_PAGE, "status": 200,
                                      "error": None, "blocks": PIN_BLOCKS}, route=True))
            trace.emit(CommandRan(source=Source.AGENT, command="pip install wheel", exit_code=0,
                                  duration_s=1))
            trace.emit(CommandRan(source=Source.AGENT, command="pip install tabulate==0.0.999",
                                  exit_code=1 if failed else 0, duration_s=1,
                                  stderr=no_dist if failed else ""))
            trace.emit(AgentFinished(stop=AgentStop.FINISHED, turns=2))
            trace.emit(CheckFinished(exit_code=1 if failed else 0))
            trace.emit(RunFinished(classification=kind.value, reason=r.reason))
            trace.close()
        store.add(r.to_data())
    return out
