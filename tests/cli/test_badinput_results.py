"""Hostile results directories given to ``show``, ``report`` and ``run --resume``.

Each case once ended in a traceback, a hang, or a file from outside the
results directory printed; now it is one ``firstrun: error:`` line and exit
3, or (for a trace with lines this version never writes) a narration that
says so. A refused ``--resume`` leaves the saved document byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_records import record

from firstrun.results.model import Classification
from support.badinput import TASK, Run, one_error

EVENTS = [
    {"kind": "run_started", "mono": 1.0, "task": "t", "attempt": 1, "agent": "replay"},
    {"kind": "run_finished", "mono": 2.0, "classification": "passed", "reason": "check_passed"},
]


def _results(root: Path, runs: list[Any], *, sweep: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"agent": "replay"}
    if sweep:
        meta["sweep"] = {}
    (root / "results.json").write_text(json.dumps({"schema_version": 1, "meta": meta, "runs": runs}))
    return root


def _run_data(trace: str = "runs/t/1/trace.jsonl") -> dict[str, Any]:
    data = record("t", 1, Classification.PASSED, trace=trace).to_data()
    return json.loads(json.dumps(data, default=str))


def _trace(root: Path, lines: list[str]) -> None:
    path = root / "runs" / "t" / "1" / "trace.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


def test_show_refuses_a_trace_path_that_leads_outside(firstrun: Run, tmp_path: Path) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"kind": "failure", "mono": 1, "detail": "SECRET-CONTENT"}) + "\n")
    root = _results(tmp_path / "out", [_run_data(trace="../secret.jsonl")])
    proc = firstrun("show", str(root))
    err = one_error(proc)
    assert "leads outside the results directory" in err
    assert "SECRET-CONTENT" not in proc.stdout + proc.stderr


def test_show_of_a_run_that_is_not_a_mapping_is_one_line(firstrun: Run, tmp_path: Path) -> None:
    root = _results(tmp_path / "out", [_run_data(), 5])
    _trace(root, [json.dumps(e) for e in EVENTS])
    proc = firstrun("show", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def test_show_narrates_around_lines_that_are_not_events(firstrun: Run, tmp_path: Path) -> None:
    root = _results(tmp_path / "out", [_run_data()])
    _trace(root, [json.dumps(EVENTS[0]), "[1]", "5", '"text"',
                  json.dumps({"kind": "egress", "mono": 1.5, "record": "not a record"}),
                  json.dumps({"kind": "command", "mono": 1.6, "duration_s": "soon"}),
                  json.dumps({"kind": "sandbox_started", "mono": 1.7, "info": [1]}),
                  json.dumps(EVENTS[1])])
    for argv in (["show", str(root)], ["report", str(root), "--out", str(tmp_path / "r.html")]):
        proc = firstrun(*argv)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
    shown = firstrun("show", str(root)).stdout
    assert "(a line that is not an event: [1])" in shown
    assert "malformed 'egress' event" in shown
    assert "malformed 'command' event" in shown
    assert "malformed 'sandbox_started' event" in shown
    assert "classification: passed" in shown


def test_a_trace_that_is_a_fifo_is_refused_not_waited_on(firstrun: Run, tmp_path: Path) -> None:
    root = _results(tmp_path / "out", [_run_data()])
    fifo = root / "runs" / "t" / "1" / "trace.jsonl"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    err = one_error(firstrun("show", str(root), timeout=60))
    assert "not a regular file" in err
    proc = firstrun("report", str(root), "--out", str(tmp_path / "r.html"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "not a regular file" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("command", ["show", "report", "diff"])
def test_results_nested_past_the_recursion_limit_are_one_line(firstrun: Run, tmp_path: Path,
                                                              command: str) -> None:
    root = tmp_path / "out"
    root.mkdir()
    (root / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    argv = {"show": ["show", str(root)], "report": ["report", str(root), "--markdown", "-"],
            "diff": ["diff", str(root), str(root)]}[command]
    assert "nested too deeply" in one_error(firstrun(*argv))


def _resume(firstrun: Run, tmp_path: Path, root: Path) -> subprocess.CompletedProcess[str]:
    task = tmp_path / "t.yaml"
    task.write_text(TASK)
    return firstrun("run", str(task), "--resume", str(root), cwd=str(tmp_path), timeout=120)


@pytest.mark.parametrize("bad", [5, {"task": "t", "attempt": "one"}, {"attempt": 1},
                                 {"task": "t", "attempt": True}],
                         ids=["not-a-mapping", "attempt-text", "no-task", "attempt-bool"])
def test_resume_refuses_a_run_it_could_not_count(firstrun: Run, tmp_path: Path, bad: Any) -> None:
    root = _results(tmp_path / "out", [_run_data(), bad], sweep=True)
    before = (root / "results.json").read_bytes()
    err = one_error(_resume(firstrun, tmp_path, root))
    assert "--resume: " in err and "run 2 is not a run record" in err
    assert (root / "results.json").read_bytes() == before


def test_resume_refuses_a_results_file_that_is_a_fifo(firstrun: Run, tmp_path: Path) -> None:
    root = tmp_path / "out"
    root.mkdir()
    os.mkfifo(root / "results.json")
    err = one_error(_resume(firstrun, tmp_path, root))
    assert "--resume: " in err and "not a regular file" in err
