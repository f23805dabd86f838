"""Permission rules in whole replay runs: the real proxy and fixture docs, on the fake backend
(the rules are the harness's, asked before a command reaches any backend).

Every claim is judged by evidence left in the kept workspace (a canary file
a refused command would have created, a ref a push would have written)
beside the trace. The last test is the rule NOT stopping a command it was
written against: a rule sees a string, and this layer is no boundary.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import pytest
from run_support import write_task

from firstrun.agents import ReplayAgent
from firstrun.reports.narrate import narrate_file
from firstrun.results.model import Classification
from firstrun.run.events import (
    CheckFinished,
    CommandRan,
    Event,
    PermissionDecided,
    Source,
    read_trace,
)
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.model import Task
from support.agents import DOCS_HOST

pytestmark = pytest.mark.fast

CURL_STEP = "curl -s http://127.0.0.1:9/ ; touch curl-ran"


def greeter(tmp_path: Path, *, replay: list[str], permissions: str = "") -> Task:
    # The steps are the test's, not the fixture guide's: marked, so no drift stops them.
    steps = "".join(f"  - {{run: {json.dumps(step)}, undocumented: a test step}}\n" for step in replay)
    text = (f"name: perm\ngoal: Create greeting.txt holding the greeting.\n"
            f"docs:\n  entrypoint: http://{DOCS_HOST}/\n"
            f"replay:\n{steps}"
            f"success:\n  script: grep -q 'hello, reader' greeting.txt\n"
            + (f"firstrun:\n  permissions:\n{permissions}" if permissions else ""))
    return write_task(tmp_path, "perm", text)


def line_of(task: Task, text: str) -> int:
    lines = Path(task.path).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, start=1) if text in line)


def run(task: Task, config: RunConfig) -> tuple[object, list[Event], Path]:
    kept = replace(config, keep_sandbox=True)
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=ReplayAgent(), config=kept, on_event=events.append)
    return record, events, kept.out_dir / "runs" / task.name / "1" / "workspace"


def test_a_denied_replay_step_never_runs_and_the_run_is_skipped(config: RunConfig,
                                                                tmp_path: Path) -> None:
    task = greeter(tmp_path, replay=["printf 'hello, reader\\n' > greeting.txt", CURL_STEP],
                   permissions="    deny:\n      - bash(curl*)\n")
    record, events, workspace = run(task, config)
    # Evidence: the step before it ran; the refused step's canary was never made.
    assert (workspace / "greeting.txt").is_file()
    assert not (workspace / "curl-ran").exists()
    ran = [e.command for e in events if isinstance(e, CommandRan) and e.source is Source.AGENT]
    assert ran == ["printf 'hello, reader\\n' > greeting.txt"]
    decisions = [e for e in events if isinstance(e, PermissionDecided)]
    assert [(e.tool, e.verdict, e.reason) for e in decisions] == [
        ("read_docs", "allow", "no_rule"), ("bash", "allow", "no_rule"),
        ("bash", "deny", "deny_rule")]
    refused = decisions[-1]
    origin = f"{task.path}:{line_of(task, '- bash(curl*)')}"
    assert (refused.argument, refused.rule, refused.origin, refused.mode, refused.source) == (
        CURL_STEP, "bash(curl*)", origin, "unattended", "task")
    # The task forbids what its quickstart needs: nothing is learnt about the
    # docs, so the run is skipped, not a docs gap, and no check runs.
    assert (record.classification, record.reason) == (Classification.SKIPPED,
                                                      "permission_denied")
    assert not any(isinstance(e, CheckFinished) for e in events)
    assert record.extra["agent_stop"] == "permission_denied"
    assert record.detail == ("step 2 not run, refused by the task permission deny rule "
                             f"bash(curl*): {CURL_STEP}")
    assert record.extra["permissions"] == {
        "allowed": 2, "refused": 1,
        "refusals": [{"tool": "bash", "argument": CURL_STEP, "reason": "deny_rule",
                      "rule": "bash(curl*)", "origin": origin}]}
    # The saved trace holds the same decisions, in order, before what they allowed.
    saved = read_trace(config.out_dir / record.trace)
    kinds = [line["kind"] for line in saved]
    assert kinds.count("permission") == 3
    assert kinds.index("permission") < kinds.index("docs_read")
    shown = [line.text for line in narrate_file(config.out_dir / record.trace)]
    assert any("permission REFUSED: bash " in text and "task deny rule bash(curl*)" in text
               and f"({origin})" in text for text in shown)


def test_the_same_step_without_the_rule_runs(config: RunConfig, tmp_path: Path) -> None:
    # The control: the canary above is absent because of the rule, not the step.
    task = greeter(tmp_path, replay=["printf 'hello, reader\\n' > greeting.txt", CURL_STEP])
    record, events, workspace = run(task, config)
    assert (workspace / "curl-ran").is_file()
    assert record.classification is Classification.PASSED
    assert record.extra["permissions"] == {"allowed": 3, "refused": 0, "refusals": []}


def test_ask_is_deny_in_an_unattended_run(config: RunConfig, tmp_path: Path) -> None:
    task = greeter(tmp_path, replay=["touch asked"],
                   permissions="    ask:\n      - bash(touch*)\n")
    record, events, workspace = run(task, config)
    assert not (workspace / "asked").exists()
    (decision,) = [e for e in events if isinstance(e, PermissionDecided) and e.tool == "bash"]
    assert (decision.verdict, decision.reason, decision.mode) == ("deny", "ask_rule",
                                                                  "unattended")
    assert (record.classification, record.reason) == (Classification.SKIPPED,
                                                      "permission_denied")


def test_a_route_page_off_the_allow_list_stops_replay_before_any_step(
        config: RunConfig, tmp_path: Path) -> None:
    task = greeter(tmp_path, replay=["touch stepped"],
                   permissions="    allow:\n      - read_docs(https://elsewhere.test/*)\n")
    record, events, workspace = run(task, config)
    assert not (workspace / "stepped").exists()
    assert record.pages == ()
    (decision,) = [e for e in events if isinstance(e, PermissionDecided)]
    assert (decision.tool, decision.verdict, decision.reason) == (
        "read_docs", "deny", "not_on_allow_list")
    assert (record.classification, record.reason) == (Classification.SKIPPED,
                                                      "permission_denied")
    assert record.detail.startswith(f"route page http://{DOCS_HOST}/ not read")


def test_a_rule_sees_a_string_so_an_encoded_git_push_walks_past_it(
        config: RunConfig, tmp_path: Path) -> None:
    """Documents the weakness; not a boundary test. ``bash(git push*)`` refuses the
    literal push and lets the same push, base64-encoded, run: only the kernel
    layers (here, the push stays inside the workspace) limit what it can reach."""
    encoded = base64.b64encode(b"git push -q origin HEAD:refs/heads/main").decode()
    git = "git -c user.email=t@t.test -c user.name=t"
    task = greeter(tmp_path, permissions="    deny:\n      - bash(git push*)\n", replay=[
        f"git init -q --bare remote.git && git init -q . && {git} commit -q --allow-empty -m x"
        " && git remote add origin remote.git",
        f'bash -c "$(echo {encoded} | base64 -d)"',
        "git push -q origin HEAD:refs/heads/literal",
    ])
    record, events, workspace = run(task, config)
    decisions = [(e.argument, e.verdict) for e in events
                 if isinstance(e, PermissionDecided) and e.tool == "bash"]
    assert [verdict for _, verdict in decisions] == ["allow", "allow", "deny"]
    # The encoded push ran and pushed: the rule never saw "git push".
    assert (workspace / "remote.git" / "refs" / "heads" / "main").is_file()
    # The literal one was refused, and its ref was never written.
    assert not (workspace / "remote.git" / "refs" / "heads" / "literal").exists()
    assert record.reason == "permission_denied"
