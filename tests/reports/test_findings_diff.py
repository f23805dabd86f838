"""Two sweeps' findings compared: appeared, grew, shrank, disappeared; and through ``firstrun diff``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from report_support import firstrun, record

from firstrun.reports.findings import RunTrace, findings
from firstrun.reports.findings_report import Change, compare_findings
from firstrun.results.model import Classification
from firstrun.results.store import ResultsStore
from firstrun.run.events import CheckFinished, CommandRan, DocsRead, RunFinished, Source, Trace

pytestmark = pytest.mark.fast

PAGE = "https://docs.test/quickstart"
BLOCKS = [{"page": PAGE, "index": 0, "language": "console", "kind": "shell", "text": "$ pip install tabulate",
           "steps": [{"command": "pip install tabulate", "output": [], "placeholders": []}],
           "file": None, "file_source": None, "skip": False, "placeholders": []}]


def _events(commands: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"kind": "docs_read", "page": {"url_requested": PAGE, "error": None,
                                                                   "blocks": BLOCKS}}]
    return events + [{"kind": "command", "source": "agent", "command": c, "exit_code": e, "stderr": err}
                     for c, e, err in commands]


def _run(attempt: int, failing: str | None, improvised: bool) -> RunTrace:
    commands = [("pip install wheel", 0, "")] if improvised else []
    commands.append(("pip install tabulate", 1 if failing else 0, failing or ""))
    kind = Classification.DOCS_GAP if failing else Classification.PASSED
    return RunTrace(record=record("t", attempt, kind), events=tuple(_events(commands)))


def test_appeared_grew_shrank_disappeared() -> None:
    before = findings([_run(1, "E: old", True), _run(2, "E: old", True), _run(3, "E: shared", False),
                       _run(4, None, False)])
    after = findings([_run(1, "E: new", True), _run(2, "E: shared", False), _run(3, "E: shared", False),
                      _run(4, None, False)])
    changes = {(c.change, c.finding.what): (c.before, c.after) for c in compare_findings(before, after)}
    assert changes == {
        (Change.APPEARED, "E: new"): (None, (1, 4)),
        (Change.GREW, "E: shared"): ((1, 4), (2, 4)),
        (Change.SHRANK, "pip install wheel"): ((2, 4), (1, 4)),
        (Change.DISAPPEARED, "E: old"): ((2, 4), None),
    }
    # A finding whose share held is not a change.
    assert compare_findings(before, before) == ()


def _sweep(out: Path, failing: list[str | None]) -> Path:
    store = ResultsStore(out, meta={"agent": "replay", "model": None})
    store.flush()
    for attempt, error in enumerate(failing, start=1):
        r = record("t", attempt, Classification.DOCS_GAP if error else Classification.PASSED)
        trace = Trace(out / r.trace)
        trace.emit(DocsRead(page={"url_requested": PAGE, "error": None, "blocks": BLOCKS}, route=True))
        trace.emit(CommandRan(source=Source.AGENT, command="pip install tabulate", exit_code=1 if error else 0,
                              duration_s=1, stderr=error or ""))
        trace.emit(CheckFinished(exit_code=1 if error else 0))
        trace.emit(RunFinished(classification=r.classification.value, reason=r.reason))
        trace.close()
        store.add(r.to_data())
    return out


def test_firstrun_diff_says_which_findings_changed(tmp_path: Path) -> None:
    before = _sweep(tmp_path / "before", ["E: gone", None, None])
    after = _sweep(tmp_path / "after", ["E: fresh", "E: fresh", None])
    proc = firstrun("diff", str(before), str(after))
    assert proc.returncode == 0, proc.stderr
    assert "APPEARED: t: 2 of 3 runs broke at block 0 of https://docs.test/quickstart: E: fresh " \
           "(none -> 2/3 runs)" in proc.stdout
    assert "DISAPPEARED: t: 1 of 3 runs broke at block 0 of https://docs.test/quickstart: E: gone " \
           "(1/3 runs -> none)" in proc.stdout
    same = firstrun("diff", str(before), str(before))
    assert "Findings: no change." in same.stdout
