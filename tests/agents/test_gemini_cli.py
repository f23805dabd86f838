"""``--agent gemini-cli``: the real Gemini CLI (installed from npm) inside the linux sandbox,
driven by a scripted, streaming Gemini API server, through the real runner, proxy, harness
MCP server and hook relay. Judged by the trace, the server's requests and the check."""

from __future__ import annotations

import os
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from claude_code_support import api_tls
from gemini_cli_support import API_HOST, agent, bash, read_docs, served

import support.gemini_wire as wire
from firstrun.agents.cli.install import GEMINI_CLI, CliInstall, ensure
from firstrun.examples import example_mirrors, find_example
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, DocsRead, Event, ModelTurn, PermissionDecided, Source
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.load import load_task
from support.agents import DOCS as DOCS_GREETER
from support.agents import greeter_task
from support.vendor import VendorServer

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
GREET = "printf 'hello, reader\\n' > greeting.txt"


@pytest.fixture
def config(linux_config: RunConfig) -> RunConfig:
    """Gemini CLI runs as a process in the session, so its runs are judged on linux's."""
    return linux_config


@pytest.fixture(scope="session")
def gemini_cli(tmp_path_factory: pytest.TempPathFactory) -> CliInstall:
    return ensure(GEMINI_CLI, tmp_path_factory.mktemp("agent-cache"))


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


def test_the_tabulate_quickstart_passes_through_gemini_cli(
        gemini_cli: CliInstall, example_config: RunConfig) -> None:
    transcript = served(
        wire.response(wire.text("Reading the guide."), read_docs(f"{DOCS}/index.html")),
        wire.response(read_docs(f"{DOCS}/install.html")),
        wire.response(bash("python3 -m venv .venv && .venv/bin/pip install tabulate")),
        wire.response(read_docs(f"{DOCS}/first-table.html")),
        wire.response(bash(WRITE)),
        wire.response(bash(".venv/bin/python planets.py"), tokens=(400, 30), cached=100),
        wire.response(wire.text("Done: planets.py prints the table."), tokens=(500, 12)),
    )
    with VendorServer(transcript) as server:
        record, events = run(load_task(EXAMPLE.task_path), agent(gemini_cli, server.url),
                             example_config)
    assert (record.classification, record.reason) == (Classification.PASSED, "passed"), \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    assert record.agent == "gemini-cli"
    # The docs came through the harness's read_docs, recorded as route reads.
    reads = of(events, DocsRead)
    assert [r.page["url_requested"] for r in reads] == [
        f"{DOCS}/index.html", f"{DOCS}/install.html", f"{DOCS}/first-table.html"]
    assert all(r.route for r in reads)
    # Every command the CLI ran is recorded with its exit code, each decided first.
    commands = [e for e in of(events, CommandRan) if e.source is Source.AGENT]
    assert [c.exit_code for c in commands] == [0, 0, 0]
    assert "| Earth    |          6371 |       1 |" in commands[-1].stdout
    asked = [p.argument for p in of(events, PermissionDecided) if p.tool == "bash"]
    assert asked == [c.command for c in commands]
    # In the record, as it happened: the turn that asked, the decision, the command.
    told = [e.kind for e in events if e.kind in ("model_turn", "command")
            or isinstance(e, PermissionDecided) and e.tool == "bash"]
    decided = [n for n, kind in enumerate(told) if kind == "permission"]
    assert len(decided) == 3
    assert all(told[n - 1:n + 2] == ["model_turn", "permission", "command"] for n in decided)
    # Each turn with the tokens the API reported for it, and its price.
    turns = of(events, ModelTurn)
    assert len(turns) == 7 and turns[-1].text == "Done: planets.py prints the table."
    assert [t.usage["input_tokens"] for t in turns] == [100, 100, 100, 100, 100, 400, 500]
    assert turns[5].usage["cached_tokens"] == 100 and turns[6].usage["output_tokens"] == 12
    assert turns[0].spend is not None
    usage = [e for e in events if e.kind == "agent_finished"][0].usage
    assert usage["agent_cli"] == {"name": "gemini-cli", "package": "@google/gemini-cli",
                                  "version": "0.61.0"}
    assert (usage["input_tokens"], usage["output_tokens"]) == (1400, 142)
    # The CLI spoke the streaming wire format with a placeholder, never a key.
    first = server.seen()[0]
    offered = {f["name"] for t in first.body["tools"] for f in t.get("functionDeclarations", ())}
    assert {"mcp_firstrun_read_docs", "run_shell_command"} <= offered
    assert not offered & {"web_fetch", "google_web_search", "invoke_agent",
                          "mcp_firstrun_approve"}
    assert first.path.endswith(f"/models/{wire.MODEL}:streamGenerateContent?alt=sse")
    assert wire.api_key(first).startswith("firstrun-google-")


def test_a_run_the_check_fails_is_a_docs_gap_and_the_key_is_nowhere(
        gemini_cli: CliInstall, config: RunConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The harness holds a key; the run must show no trace of it anywhere.
    canary = "AIza-canary-" + "5c1e88d0f3"
    for name in ("GEMINI_API_KEY", "FIRSTRUN_GEMINI_API_KEY"):
        monkeypatch.setenv(name, canary)
    # The pattern is not the literal, so the searching processes' own command lines
    # do not match it.
    look = ("env; if grep -rqs 'AIza-canar[y]' /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
            "/workspace /home /tmp; then echo key-found; else echo key-absent; fi; "
            "printf 'hello\\n' > greeting.txt")
    transcript = served(
        wire.response(read_docs(DOCS_GREETER)),
        wire.response(bash(look)),
        wire.response(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True)
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(gemini_cli, server.url), kept)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed"), \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    (ran,) = [e for e in of(events, CommandRan) if e.source is Source.AGENT]
    assert ran.command == look and "GEMINI_API_KEY=firstrun-google-" in ran.stdout
    # By evidence: not in the sandbox's environment or files (the command above looked),
    # not in what the CLI sent, not in any file the run left.
    assert "key-absent" in ran.stdout and canary not in ran.stdout + ran.stderr
    for request in server.seen():
        assert canary not in repr(request.headers) + repr(request.body)
    for path in kept.out_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert canary.encode() not in path.read_bytes(), path


def test_the_turn_budget_stops_the_cli_mid_run(gemini_cli: CliInstall, config: RunConfig,
                                               tmp_path: Path) -> None:
    transcript = served(
        wire.response(read_docs(DOCS_GREETER)),
        wire.response(bash("touch started")),
        wire.response(bash(GREET)),
        wire.response(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path, budgets={"max_turns": 2}),
                             agent(gemini_cli, server.url), config)
    assert record.classification is Classification.BUDGET_EXHAUSTED
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert finished.detail.startswith("max_turns")
    # The greeting was never written: the CLI stopped before its third turn.
    assert GREET not in [e.command for e in of(events, CommandRan)]
    assert len(server.seen()) == 2


def test_the_spend_budget_stops_the_cli_before_its_next_model_call(
        gemini_cli: CliInstall, config: RunConfig, tmp_path: Path) -> None:
    # 1 USD per million input tokens: the first turn costs 0.5 USD.
    transcript = served(
        wire.response(bash("touch started"), tokens=(500_000, 10)),
        wire.response(bash(GREET)),
        wire.response(wire.text("Done.")),
    )
    with VendorServer(transcript) as server:
        the_agent = agent(gemini_cli, server.url)
        events: list[Event] = []
        record = run_task(greeter_task(tmp_path), attempt=1, agent=the_agent, config=config,
                          on_event=events.append, max_spend=Decimal("0.4"))
    assert record.classification is Classification.BUDGET_EXHAUSTED, \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert finished.detail.startswith("max_spend")
    assert [e.command for e in of(events, CommandRan) if e.source is Source.AGENT] == [
        "touch started"]
    # Its second model call was never made.
    assert len(server.seen()) == 1


def test_a_vendor_error_is_an_infra_error(gemini_cli: CliInstall, config: RunConfig,
                                         tmp_path: Path) -> None:
    with VendorServer(served(wire.bad_key())) as server:
        record, events = run(greeter_task(tmp_path), agent(gemini_cli, server.url), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR, "agent_infra_error")
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert "API key not valid" in finished.detail
    assert of(events, CommandRan) == []


def test_a_permission_rule_refuses_a_command_the_cli_asked_for(
        gemini_cli: CliInstall, config: RunConfig, tmp_path: Path) -> None:
    path = tmp_path / "greeter.yaml"
    path.write_text(
        "name: greeter\ngoal: Create greeting.txt holding the greeting.\n"
        f"docs:\n  entrypoint: {DOCS_GREETER}\n"
        "success:\n  script: grep -q 'hello, reader' greeting.txt\n"
        "firstrun:\n  permissions:\n    deny:\n      - bash(touch*)\n", encoding="utf-8")
    transcript = served(
        wire.response(bash("touch refused-ran")),
        wire.response(bash(GREET)),
        wire.response(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True)
    with VendorServer(transcript) as server:
        record, events = run(load_task(path), agent(gemini_cli, server.url), kept)
    assert record.classification is Classification.PASSED, \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    decisions = [(e.argument, e.verdict, e.rule) for e in of(events, PermissionDecided)]
    assert decisions == [("touch refused-ran", "deny", "bash(touch*)"), (GREET, "allow", None)]
    assert [e.command for e in of(events, CommandRan) if e.source is Source.AGENT] == [GREET]
    workspace = kept.out_dir / "runs" / "greeter" / "1" / "workspace"
    assert not (workspace / "refused-ran").exists()
    # The model was told, as the call's result, which rule refused it.
    (refused,) = wire.function_responses(
        next(r for r in server.seen() if wire.model_turns(r) == 1))
    assert "bash(touch*)" in str(refused["response"])


def test_the_proxy_puts_the_key_into_api_requests_and_nowhere_else(
        gemini_cli: CliInstall, config: RunConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "AIza-canary-" + "9e02b6c4d1"
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setenv("FIRSTRUN_GEMINI_API_KEY", canary)
    context, cafile = api_tls(tmp_path, API_HOST)
    # The proxy verifies the scripted API's certificate like any server's.
    trust = tmp_path / "trust.pem"
    system = os.environ.get("SSL_CERT_FILE")
    trust.write_bytes((Path(system).read_bytes() if system else b"") + cafile.read_bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(trust))
    look = ("env | grep ^GEMINI_API_KEY=; if grep -rqs 'AIza-canar[y]' /proc/[0-9]*/environ "
            "/proc/[0-9]*/cmdline /workspace /home /tmp; then echo key-found; "
            f"else echo key-absent; fi; {GREET}")
    transcript = served(
        wire.response(bash(look)),
        wire.response(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True, inspect_tls=True)
    with VendorServer(transcript, tls=context) as server:
        record, events = run(greeter_task(tmp_path), agent(gemini_cli, server.url), kept)
    assert record.classification is Classification.PASSED, \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    # Every request reached the API with the real key: the proxy swapped it in.
    api = server.seen()
    assert api and all(wire.api_key(r) == canary for r in api)
    swapped = [e.record for e in events if e.kind == "egress" and e.record.host == API_HOST]
    assert swapped and all(r.credentials == ("GEMINI_API_KEY",) for r in swapped
                           if r.credentials)
    # Inside, only the placeholder: in the CLI's environment, in no process or file.
    (ran,) = [e for e in of(events, CommandRan) if e.source is Source.AGENT]
    assert ran.stdout.startswith("GEMINI_API_KEY=firstrun-")
    assert "key-absent" in ran.stdout and canary not in ran.stdout + ran.stderr
    for path in kept.out_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert canary.encode() not in path.read_bytes(), path
