"""A model agent under permission rules, through the Claude SDK against a scripted server.

The model must be told: a refused call comes back to it as that call's
error result naming the rule, the conversation goes on, and the check still
decides the run. Judged by what the server received, the trace, and the
kept workspace (the refused command's canary is absent).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, Event, PermissionDecided
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.load import load_task
from support import anthropic_wire as wire
from support.agents import DOCS, claude
from support.vendor import VendorServer

pytestmark = pytest.mark.fast

CURL = "curl -s http://127.0.0.1:9/ ; touch curl-ran"
GREET = "printf 'hello, reader\\n' > greeting.txt"


def test_the_model_receives_the_refusal_as_the_calls_result_and_carries_on(
        config: RunConfig, tmp_path: Path) -> None:
    path = tmp_path / "greeter.yaml"
    path.write_text(
        "name: greeter\ngoal: Create greeting.txt holding the greeting.\n"
        f"docs:\n  entrypoint: {DOCS}\n"
        "success:\n  script: grep -q 'hello, reader' greeting.txt\n"
        "firstrun:\n  permissions:\n    deny:\n      - bash(curl*)\n", encoding="utf-8")
    task = load_task(path)
    transcript = wire.script(
        wire.message(wire.bash(CURL), wire.bash(GREET)),
        wire.message(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True)
    events: list[Event] = []
    with VendorServer(transcript) as server:
        record = run_task(task, attempt=1, agent=claude(server.url), config=kept,
                          on_event=events.append)
    refused, greeted = wire.tool_results(server.seen()[1])
    assert refused["is_error"] is True
    assert refused["content"] == ("error: bash call not run: refused by the task permission "
                                  "deny rule bash(curl*)")
    assert "is_error" not in greeted
    assert "exit code: 0" in str(greeted["content"])
    workspace = kept.out_dir / "runs" / task.name / "1" / "workspace"
    assert not (workspace / "curl-ran").exists() and (workspace / "greeting.txt").is_file()
    assert [e.command for e in events if isinstance(e, CommandRan)
            and e.source == "agent"] == [GREET]
    decisions = [(e.argument, e.verdict, e.rule) for e in events
                 if isinstance(e, PermissionDecided)]
    assert decisions == [(CURL, "deny", "bash(curl*)"), (GREET, "allow", None)]
    # The model went another way and the check passed: a refusal is not a verdict.
    assert record.classification is Classification.PASSED
    assert record.extra["permissions"]["refused"] == 1
