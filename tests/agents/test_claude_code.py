"""``--agent claude-code``: the real Claude Code CLI (installed from npm) inside the linux
sandbox, driven by a scripted, streaming Messages API server, through the real runner,
proxy and harness MCP server. Judged by the trace, the server's requests and the check."""

from __future__ import annotations

from pathlib import Path

import support.anthropic_wire as wire
import pytest
from claude_code_support import agent, bash, read_docs, served
from support.vendor import VendorServer

from firstrun.agents.cli.install import CLAUDE_CODE, CliInstall, ensure
from firstrun.examples import example_mirrors, find_example
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, DocsRead, Event, ModelTurn, PermissionDecided, Source
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.load import load_task

EXAMPLE = find_example("python-tabulate")
DOCS = "https://python-tabulate.docs.example"
PLANETS = '''from tabulate import tabulate

planets = [
    ["Mercury", 2440, 0],
    ["Venus", 6052, 0],
    ["Earth", 6371, 1],
    ["Mars", 3390, 2],
]

print(tabulate(planets, headers=["Planet", "Radius (km)", "Moons"], tablefmt="github"))
'''
WRITE = f"cat > planets.py <<'EOF'\n{PLANETS}EOF"


@pytest.fixture(scope="session")
def claude_code(tmp_path_factory: pytest.TempPathFactory) -> CliInstall:
    return ensure(CLAUDE_CODE, tmp_path_factory.mktemp("agent-cache"))


@pytest.fixture
def example_config(tmp_path: Path) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend="linux",
                     docs_mirrors=example_mirrors([EXAMPLE]))


def run(task, the_agent, config: RunConfig):
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=the_agent, config=config, on_event=events.append)
    return record, events


def of(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def test_the_tabulate_quickstart_passes_through_claude_code(
        claude_code: CliInstall, example_config: RunConfig) -> None:
    transcript = served(
        wire.message(wire.text("Reading the guide."), read_docs(f"{DOCS}/index.html")),
        wire.message(read_docs(f"{DOCS}/install.html")),
        wire.message(bash("python3 -m venv .venv && .venv/bin/pip install tabulate")),
        wire.message(read_docs(f"{DOCS}/first-table.html")),
        wire.message(bash(WRITE)),
        wire.message(bash(".venv/bin/python planets.py")),
        wire.message(wire.text("Done: planets.py prints the table.")),
    )
    with VendorServer(transcript) as server:
        record, events = run(load_task(EXAMPLE.task_path), agent(claude_code, server.url),
                             example_config)
    assert (record.classification, record.reason) == (Classification.PASSED, "passed"), \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    assert record.agent == "claude-code"
    # The docs came through the harness's read_docs, recorded as route reads.
    reads = of(events, DocsRead)
    assert [r.page["url_requested"] for r in reads] == [f"{DOCS}/index.html", f"{DOCS}/install.html",
                                               f"{DOCS}/first-table.html"]
    assert all(r.route for r in reads)
    # Every command the CLI ran is recorded with its exit code, each asked for first.
    commands = [e for e in of(events, CommandRan) if e.source is Source.AGENT]
    assert [c.exit_code for c in commands] == [0, 0, 0]
    assert "| Earth    |          6371 |       1 |" in commands[-1].stdout
    asked = [p.argument for p in of(events, PermissionDecided) if p.tool == "bash"]
    assert asked == [c.command for c in commands]
    turns = of(events, ModelTurn)
    assert len(turns) == 7 and turns[-1].text == "Done: planets.py prints the table."
    usage = [e for e in events if e.kind == "agent_finished"][0].usage
    assert usage["agent_cli"] == {"name": "claude-code", "package": "@anthropic-ai/claude-code",
                                  "version": "2.1.332"}
    # The CLI spoke the streaming wire format with a placeholder, never a key.
    first = server.seen()[0]
    assert first.body["stream"] is True and first.body["model"] == wire.MODEL
    assert wire.api_key(first).startswith("firstrun-anthropic-")
