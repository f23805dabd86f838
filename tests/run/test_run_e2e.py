"""Whole runs: the replay agent, the real linux backend, the real proxy, fixture docs on a mirror.

Each classification is reached for real, and each claim is judged by
evidence: the trace's events, files on the host, the workspace's content.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import DOCS_HOST, fixture_task, write_task

from firstrun.agents import AgentResult, AgentStop, Brief, ReplayAgent, Toolbelt
from firstrun.results.model import Classification
from firstrun.run.events import (
    AgentFinished,
    CheckFinished,
    CommandRan,
    DocsRead,
    Egress,
    Event,
    Failure,
    RunFinished,
    Source,
    read_trace,
)
from firstrun.run.runner import RunConfig, run_task


def run(name: str, config: RunConfig, **kwargs: object):
    events: list[Event] = []
    record = run_task(fixture_task(name), attempt=1, agent=ReplayAgent(), config=config,
                      on_event=events.append, **kwargs)
    return record, events


def trace_of(config: RunConfig, record) -> list[dict]:
    return read_trace(config.out_dir / record.trace)


def test_a_passing_run_records_the_route_in_order_and_the_session(config: RunConfig) -> None:
    record, events = run("pass", config)
    assert (record.classification, record.reason) == (Classification.PASSED, "passed")
    assert [p.url_requested for p in record.pages] == [
        f"http://{DOCS_HOST}/", f"http://{DOCS_HOST}/serve.html"]
    assert all(p.status == 200 and p.sha256 for p in record.pages)
    assert [e.route for e in events if isinstance(e, DocsRead)] == [True, True]
    assert record.backend == "linux" and record.enforcement == "enforced"
    assert record.policy_hash and record.policy_hash.startswith("sha256:")
    assert record.attestation and all(c["passed"] for c in record.attestation)
    assert record.check_exit == 0 and record.commands == 2
    assert record.last_page_before_failure is None
    assert record.task_sha256 == fixture_task("pass").sha256
    kinds = [line["kind"] for line in trace_of(config, record)]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.index("sandbox_started") < kinds.index("docs_read") < kinds.index("command")
    assert kinds.index("agent_finished") < kinds.index("check_finished")


def test_a_failing_check_is_a_docs_gap_naming_the_last_page(config: RunConfig) -> None:
    record, _ = run("check-fails", config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    assert record.check_exit == 1
    assert "greeting.txt lacks the greeting" in record.check_output
    assert record.detail == "check failed: greeting.txt lacks the greeting"
    assert record.last_page_before_failure == f"http://{DOCS_HOST}/"


def test_a_failing_replay_step_stops_the_replay(config: RunConfig) -> None:
    record, events = run("step-fails", config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP,
                                                      "replay_step_failed")
    agent_commands = [e.command for e in events
                      if isinstance(e, CommandRan) and e.source is Source.AGENT]
    assert agent_commands == ["printf 'hello, reader\\n' > greeting.txt", "greeter-cli --init"]
    assert record.detail == "step 2 exited 127: greeter-cli --init"
    assert record.last_page_before_failure == f"http://{DOCS_HOST}/serve.html"


def test_no_replay_block_is_skipped_without_running_a_check(config: RunConfig) -> None:
    record, events = run("no-replay", config)
    assert (record.classification, record.reason) == (Classification.SKIPPED, "no_replay")
    assert not any(isinstance(e, (CheckFinished, DocsRead)) for e in events)


def test_a_failing_setup_step_is_infra_and_the_agent_never_runs(config: RunConfig) -> None:
    record, events = run("setup-fails", config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR, "setup_failed")
    assert not any(isinstance(e, (AgentFinished, CheckFinished)) for e in events)
    assert not any(isinstance(e, CommandRan) and e.source is Source.AGENT for e in events)


def test_the_wall_budget_ends_the_agent_phase(config: RunConfig) -> None:
    record, events = run("wall-budget", config)
    assert (record.classification, record.reason) == (Classification.BUDGET_EXHAUSTED,
                                                      "budget_exhausted")
    slow = [e for e in events if isinstance(e, CommandRan) and e.command.startswith("sleep")]
    assert len(slow) == 1 and slow[0].timed_out
    assert record.extra["agent_stop"] == "budget_exhausted"


def test_qs_serve_and_qs_wait_http_against_a_real_server_in_the_sandbox(config: RunConfig) -> None:
    record, _ = run("serve-script", config)
    assert (record.classification, record.check_exit) == (Classification.PASSED, 0)


def test_declared_serve_and_wait_http_with_json_pairs(config: RunConfig) -> None:
    record, _ = run("serve-declared", config)
    assert (record.classification, record.check_exit) == (Classification.PASSED, 0)


def test_wait_http_gives_up_with_the_last_answer_and_the_server_log(config: RunConfig) -> None:
    record, _ = run("serve-declared-fails", config)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    assert "did not answer as expected within 3s" in record.check_output
    assert '"ready": false' in record.check_output
    # http.server logs each GET; the tail is dumped when polling gives up.
    assert "--- server log" in record.check_output and "GET /status.json" in record.check_output


def test_expect_output_matches_only_what_successful_agent_commands_printed(
    config: RunConfig,
) -> None:
    record, _ = run("expect-output", config)
    assert (record.classification, record.check_exit) == (Classification.PASSED, 0)
    failing, _ = run("expect-output-fails", config)
    # "total 99.00" was printed by setup and by a failing step: neither counts.
    assert failing.classification is Classification.DOCS_GAP
    assert "nothing the run printed matches contains 'total 99.00'" in failing.check_output


def test_the_check_file_never_reaches_the_workspace(config: RunConfig, tmp_path: Path) -> None:
    source = fixture_task("check-file")
    assert "ANSWER-KEY-7f3c" in source.check
    # Same task, plus a first step that hunts for the answer key while the
    # agent works: finding it would fail the step and the run.
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "answer-key.sh").write_text(source.check)
    text = Path(source.path).read_text().replace(
        "replay:\n", "replay:\n  - \"! grep -rqs ANSWER-KEY-7f3c /workspace /tmp /home\"\n")
    task = write_task(tmp_path, "check-file", text)
    kept = replace(config, keep_sandbox=True)
    record = run_task(task, attempt=1, agent=ReplayAgent(), config=kept)
    assert (record.classification, record.commands) == (Classification.PASSED, 2)
    workspace = kept.out_dir / "runs" / task.name / "1" / "workspace"
    files = list(workspace.rglob("*"))
    # Only what the agent made: no check, and no agent-output file left behind.
    assert [p.name for p in files] == ["greeting.txt"]
    assert not any(b"ANSWER-KEY" in p.read_bytes() for p in files if p.is_file())
