"""``narrate`` tells a saved trace in order: every event, blocked egress marked, an unfinished run said."""

from __future__ import annotations

from pathlib import Path

import pytest

from egress_support import SavedEgress
from firstrun.agents.base import Origin
from firstrun.errors import UsageError
from firstrun.reports.narrate import Style, narrate_file, trace_paths
from firstrun.results.store import ResultsStore
from firstrun.run.events import (
    AgentFinished,
    AgentStop,
    CheckFinished,
    CommandRan,
    DocsRead,
    RunFinished,
    RunStarted,
    SandboxStarted,
    Source,
    Trace,
)


def _egress(host: str, decision: str, reason: str) -> SavedEgress:
    return SavedEgress(record={
        "channel": "shell", "method": "CONNECT", "host": host, "port": 443, "path": None,
        "decision": decision, "reason": reason, "layer": "allowlist", "would_deny": None, "status": None,
    })


def _write(path: Path, *, finished: bool = True) -> Path:
    trace = Trace(path)
    trace.emit(RunStarted(task="hello", attempt=1, agent="replay", model=None,
                          task_file="tasks/hello.yaml", task_sha256="f" * 64))
    trace.emit(SandboxStarted(info={
        "backend": "linux", "enforcement": "full", "policy_hash": "abc123",
        "attestation": [{"name": "direct_dial_fails", "passed": True, "detail": ""}], "downgrades": [],
    }))
    trace.emit(DocsRead(route=True, page={
        "url_requested": "https://docs.test/start/", "url_final": "https://docs.test/start/",
        "status": 200, "bytes": 321, "title": "Start", "error": None, "from_cache": False,
    }))
    trace.emit(DocsRead(route=True, page={
        "url_requested": "https://docs.test/gone/", "url_final": "https://docs.test/gone/",
        "status": 404, "bytes": 0, "error": "http_error", "detail": "HTTP 404",
    }))
    trace.emit(_egress("pypi.org", "allow", "allowed_by_list"))
    trace.emit(CommandRan(source=Source.AGENT, command="pip install hello", exit_code=0, duration_s=2.5,
                          origin=Origin(page="https://docs.test/start/", block=1)))
    trace.emit(_egress("evil.test", "deny", "not_allowed"))
    trace.emit(CommandRan(source=Source.AGENT, command="curl https://evil.test", exit_code=56,
                          duration_s=0.25, stderr="curl: (56) CONNECT tunnel failed, response 403\n"))
    if finished:
        trace.emit(AgentFinished(stop=AgentStop.STEP_FAILED, turns=2, detail="step 2 failed"))
        trace.emit(CheckFinished(exit_code=1, output="hello.txt missing\n", duration_s=0.1))
        trace.emit(RunFinished(classification="docs_gap", reason="replay_step_failed"))
    trace.close()
    return path


def test_every_event_is_told_in_order(tmp_path: Path) -> None:
    lines = narrate_file(_write(tmp_path / "trace.jsonl"))
    text = [line.text for line in lines]
    order = [
        "run started: task hello attempt 1, agent replay",
        "sandbox started: backend linux, enforcement full, attestation 1/1 passed",
        "docs read (documented route): https://docs.test/start/ \"Start\": 200, 321 bytes",
        "docs read (documented route): https://docs.test/gone/: NOT READ, http_error: HTTP 404",
        "egress allowed (shell): CONNECT pypi.org:443: allowed_by_list",
        "[agent] $ pip install hello  -> exit 0 in 2.50s",
        "from https://docs.test/start/ block 1",
        "egress BLOCKED (shell): CONNECT evil.test:443: not_allowed",
        "[agent] $ curl https://evil.test  -> exit 56 in 0.25s",
        "| curl: (56) CONNECT tunnel failed, response 403",
        "agent finished: step_failed after 2 turns",
        "check: exit 1 in 0.10s",
        "| hello.txt missing",
        "classification: docs_gap (replay_step_failed)",
    ]
    at = 0
    for expected in order:
        found = next((i for i in range(at, len(text)) if expected in text[i]), None)
        assert found is not None, f"{expected!r} not found after line {at}:\n" + "\n".join(text)
        at = found + 1
    blocked = [line for line in lines if "BLOCKED" in line.text]
    assert len(blocked) == 1 and blocked[0].style is Style.BAD
    # A passing command shows no output; a failing one shows its tail.
    assert not any("pip install" in t and "|" in t for t in text)


def test_a_trace_cut_short_says_the_run_never_finished(tmp_path: Path) -> None:
    path = _write(tmp_path / "trace.jsonl", finished=False)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"kind": "command", "torn')  # a crash mid-write
    lines = narrate_file(path)
    assert "never finished" in lines[-1].text
    assert lines[-1].style is Style.BAD


def test_targets_a_file_a_run_directory_or_a_results_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "hello" / "1"
    trace = _write(run_dir / "trace.jsonl")
    store = ResultsStore(tmp_path, meta={})
    store.add({"task": "hello", "trace": "runs/hello/1/trace.jsonl"})
    assert trace_paths(trace) == [trace]
    assert trace_paths(run_dir) == [trace]
    assert trace_paths(tmp_path) == [tmp_path / "runs/hello/1/trace.jsonl"]
    with pytest.raises(UsageError, match="no such trace"):
        trace_paths(tmp_path / "nope")
    with pytest.raises(UsageError, match="neither a trace"):
        trace_paths(tmp_path / "runs")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UsageError, match="not a trace"):
        narrate_file(empty)


def test_model_turns_and_affordance_probes_are_told_not_called_unknown(tmp_path: Path) -> None:
    from firstrun.run.events import AffordancesProbed, ModelTurn

    trace = Trace(tmp_path / "trace.jsonl")
    trace.emit(AffordancesProbed(
        summary={"llms.txt": {"exists": True, "bytes": 120, "urls": []},
                 "llms-full.txt": {"exists": False, "bytes": 0, "urls": []},
                 "md": {"pages": 2, "exist": 0, "bytes": 0}},
        checked=[]))
    trace.emit(ModelTurn(turn=1, text="I will install it.", stop="tool_use", vendor_stop="tool_use",
                         tool_calls=[{"id": "c1", "name": "bash", "arguments": {"command": "pip install x"}},
                                     {"id": "c2", "name": "rm_rf", "arguments": {}, "error": "unknown tool"}],
                         usage={"input_tokens": 900, "output_tokens": 40}, spend="0.0031"))
    trace.close()
    lines = narrate_file(tmp_path / "trace.jsonl")
    text = "\n".join(line.text for line in lines)
    assert "not known to this firstrun version" not in text
    assert "docs affordances probed: llms.txt" in text
    assert "model turn 1: tool_use (900 in, 40 out, spend 0.0031)" in text
    assert "I will install it." in text
    assert "asks bash {'command': 'pip install x'}" in text
    refused = [line for line in lines if "refused: unknown tool" in line.text]
    assert refused and refused[0].style is Style.BAD


def test_what_an_image_lacked_is_told(tmp_path: Path) -> None:
    from firstrun.run.events import ImageLacked

    trace = Trace(tmp_path / "trace.jsonl")
    trace.emit(ImageLacked(image="firstrun/node:24", commands=["make"], libraries=["libGL.so.1"]))
    trace.close()
    (line, *_) = narrate_file(tmp_path / "trace.jsonl")
    assert line.text.endswith("image firstrun/node:24 lacks command make, library libGL.so.1, "
                              "which this host has: not evidence about the docs")
    assert line.style is Style.BAD
