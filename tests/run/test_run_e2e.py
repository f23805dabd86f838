"""Whole runs: the replay agent, the real linux backend, the real proxy, fixture docs on a mirror.

Each classification is reached for real, and each claim is judged by
evidence: the trace's events, files on the host, the workspace's content.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from run_support import fixture_task, write_task

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
from firstrun.run.workspace import Workspace, WorkspaceError
from support.agents import DOCS_HOST


@pytest.fixture
def config(linux_config: RunConfig) -> RunConfig:
    """These runs judge the session too (its attestation, the workspace's isolation): linux's."""
    return linux_config


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
        "replay:\n", "replay:\n  - run: \"! grep -rqs ANSWER-KEY-7f3c /workspace /tmp /home\"\n"
        "    undocumented: a fixture step, not the guide's\n")
    task = write_task(tmp_path, "check-file", text)
    kept = replace(config, keep_sandbox=True)
    record = run_task(task, attempt=1, agent=ReplayAgent(), config=kept)
    assert (record.classification, record.commands) == (Classification.PASSED, 2)
    workspace = kept.out_dir / "runs" / task.name / "1" / "workspace"
    files = list(workspace.rglob("*"))
    # Only what the agent made: no check, and no agent-output file left behind.
    assert [p.name for p in files] == ["greeting.txt"]
    assert not any(b"ANSWER-KEY" in p.read_bytes() for p in files if p.is_file())


GREETER_HEAD = f"""
goal: Create greeting.txt holding the greeting the quickstart shows.
docs:
  entrypoint: http://{DOCS_HOST}/
success:
  script: |
    grep -q 'hello, reader' greeting.txt || qs_fail "greeting.txt lacks the greeting"
"""


def test_symlinks_planted_by_the_agent_never_lead_the_harness_out(
    config: RunConfig, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "canary.txt").write_text("untouched\n")
    # The links point at host paths the sandbox cannot see; only a harness
    # that followed them (writing the output log, cleaning up) would reach them.
    task = write_task(tmp_path, "trap", f"name: greeter-symlink-trap\n{GREETER_HEAD}"
                      "replay:\n"
                      "  - printf 'hello, reader\\n' > greeting.txt\n"
                      f"  - run: ln -s {canary} results && ln -s {canary}/canary.txt canary-link\n"
                      "    undocumented: a fixture step, not the guide's\n"
                      f"  - run: mkdir -p deep/er && ln -s {canary} deep/er/link\n"
                      "    undocumented: a fixture step, not the guide's\n")
    record = run_task(task, attempt=1, agent=ReplayAgent(), config=config)
    assert record.classification is Classification.PASSED
    # The temporary workspace, links and all, was removed; the targets were not.
    assert sorted(p.name for p in canary.iterdir()) == ["canary.txt"]
    assert (canary / "canary.txt").read_text() == "untouched\n"
    # Kept, the planted links are still there, and harness writes refuse them.
    kept = replace(config, keep_sandbox=True)
    assert run_task(task, attempt=1, agent=ReplayAgent(), config=kept).evidential
    workspace = kept.out_dir / "runs" / task.name / "1" / "workspace"
    assert (workspace / "results").is_symlink()
    with Workspace(workspace) as handle:
        for path in ("results/out.log", "canary-link", "deep/er/link/x"):
            with pytest.raises(WorkspaceError):
                handle.write_new(path, b"escaped")
    assert sorted(p.name for p in canary.iterdir()) == ["canary.txt"]
    assert (canary / "canary.txt").read_text() == "untouched\n"


class WaitsForItsEgress:
    """Makes one denied request, then waits until the run's on_event has seen its record."""

    name = "egress-watcher"
    model = None

    def __init__(self, seen: threading.Event) -> None:
        self.seen = seen
        self.seen_during_agent_phase = False

    def run(self, brief: Brief, tools: Toolbelt) -> AgentResult:
        tools.bash(f"curl -sS -o /dev/null -w '%{{http_code}}' http://{DOCS_HOST}/")
        # A synchronisation bound, not a timing assertion.
        self.seen_during_agent_phase = self.seen.wait(30)
        tools.bash("printf 'hello, reader\\n' > greeting.txt")
        return AgentResult(stop=AgentStop.FINISHED, turns=2)


def test_egress_reaches_the_trace_while_the_run_is_live(config: RunConfig, tmp_path: Path) -> None:
    task = write_task(tmp_path, "egress", f"name: greeter-egress\n{GREETER_HEAD}")
    seen = threading.Event()
    events: list[Event] = []

    def on_event(event: Event) -> None:
        events.append(event)
        if isinstance(event, Egress) and event.record.host == DOCS_HOST:
            seen.set()

    agent = WaitsForItsEgress(seen)
    record = run_task(task, attempt=1, agent=agent, config=config, on_event=on_event)
    assert agent.seen_during_agent_phase
    assert record.classification is Classification.PASSED
    # The docs host is refused to the shell, and that refusal is on record.
    (blocked,) = record.blocked_egress
    assert (blocked["host"], blocked["channel"], blocked["reason"]) == (
        DOCS_HOST, "shell", "docs_host_on_shell")
    egress = next(i for i, e in enumerate(events) if isinstance(e, Egress))
    finished = next(i for i, e in enumerate(events) if isinstance(e, AgentFinished))
    assert egress < finished < len(events) - 1
    assert isinstance(events[-1], RunFinished)


def test_a_redirect_off_the_docs_hosts_is_refused_and_a_route_finding(
    config: RunConfig, tmp_path: Path
) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from firstrun.docs import Mirror

    class Redirects(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/robots.txt":
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(302)
            self.send_header("Location", "http://elsewhere.test/landing")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirects)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        mirrored = replace(config, docs_mirrors={
            **config.docs_mirrors,
            "moved.greeter.test": Mirror(host="moved.greeter.test", base_url=base)})
        task = write_task(tmp_path, "redirect", f"""name: greeter-redirect
goal: Create greeting.txt holding the greeting the quickstart shows.
docs:
  path:
    - http://moved.greeter.test/start
    - http://{DOCS_HOST}/
replay:
  - printf 'hello, reader\\n' > greeting.txt
success:
  script: grep -q 'hello, reader' greeting.txt || qs_fail "no greeting"
""")
        record = run_task(task, attempt=1, agent=ReplayAgent(), config=mirrored)
    finally:
        server.shutdown()
        server.server_close()
    # The finding is shown, and the check alone decides.
    assert record.classification is Classification.PASSED
    (finding,) = record.route_findings
    assert (finding["url"], finding["error"]) == ("http://moved.greeter.test/start",
                                                  "redirect_not_allowed")
    first = trace_of(mirrored, record)
    read = next(line for line in first if line["kind"] == "docs_read")
    assert read["page"]["hops"] == ["http://moved.greeter.test/start",
                                    "http://elsewhere.test/landing"]


def test_a_refused_sandbox_is_infra_error(config: RunConfig) -> None:
    record, events = run("pass", replace(config, backend="local"))
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR,
                                                      "sandbox_refused")
    (failure,) = [e for e in events if isinstance(e, Failure)]
    assert failure.infra and failure.phase == "sandbox" and failure.who == "local"


class Broken:
    name = "broken"
    model = None

    def run(self, brief: Brief, tools: Toolbelt) -> AgentResult:
        tools.bash("true")
        return {}["no such key"]


class Refuses:
    name = "refuses"
    model = None

    def run(self, brief: Brief, tools: Toolbelt) -> AgentResult:
        return AgentResult(stop=AgentStop.REFUSED, claim="I will not do that")


def test_a_bug_in_the_agent_is_a_harness_error_with_its_traceback(config: RunConfig) -> None:
    events: list[Event] = []
    record = run_task(fixture_task("pass"), attempt=1, agent=Broken(), config=config,
                      on_event=events.append)
    assert (record.classification, record.reason) == (Classification.HARNESS_ERROR,
                                                      "harness_error")
    (failure,) = [line for line in trace_of(config, record) if line["kind"] == "failure"]
    assert failure["error_type"] == "KeyError" and not failure["infra"]
    assert "Traceback" in failure["message"] and "no such key" in failure["message"]


def test_an_agent_refusal_is_its_own_classification(config: RunConfig) -> None:
    record = run_task(fixture_task("pass"), attempt=1, agent=Refuses(), config=config)
    assert (record.classification, record.reason) == (Classification.AGENT_REFUSAL,
                                                      "agent_refused")
    assert record.check_exit is None


def test_recheck_reruns_only_the_check_over_a_kept_workspace(config: RunConfig) -> None:
    from firstrun.run.check import recheck

    kept = replace(config, keep_sandbox=True)
    record, _ = run("expect-output", kept)
    assert record.classification is Classification.PASSED
    workspace = kept.out_dir / "runs" / "greeter-expect-output" / "1" / "workspace"
    again = recheck(fixture_task("expect-output"), sandbox_dir=workspace, config=kept)
    assert (again.classification, again.check_exit) == (Classification.PASSED, 0)
    kinds = [line["kind"] for line in read_trace(kept.out_dir / again.trace)]
    assert "command" in kinds and "agent_finished" not in kinds
    (workspace / "greeting.txt").unlink()
    failing = recheck(fixture_task("pass"), sandbox_dir=workspace, config=kept)
    assert failing.classification is Classification.DOCS_GAP
    refused = recheck(fixture_task("pass"), sandbox_dir=workspace,
                      config=replace(kept, backend="local"))
    assert (refused.classification, refused.reason) == (Classification.INFRA_ERROR,
                                                        "sandbox_refused")
