"""``--agent codex``: the real Codex CLI (installed from npm) inside the linux sandbox,
driven by a scripted, streaming Responses API server, through the real runner, proxy
and harness MCP server. Judged by the trace, the server's requests and the check."""

from __future__ import annotations

import os
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from claude_code_support import api_tls
from codex_support import API_HOST, agent, bash, read_docs, served

import support.responses_wire as wire
from firstrun.agents.cli.install import CODEX, CliInstall, ensure
from firstrun.examples import example_mirrors, find_example
from firstrun.results.model import Classification
from firstrun.run.events import CommandRan, DocsRead, Event, ModelTurn, PermissionDecided, Source
from firstrun.run.runner import RunConfig, run_task
from firstrun.tasks.load import load_task
from support.agent_clis import serving
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
    """Codex runs as a process in the session, so its runs are judged on linux's."""
    return linux_config


@pytest.fixture(scope="session")
def codex(tmp_path_factory: pytest.TempPathFactory) -> CliInstall:
    return ensure(CODEX, tmp_path_factory.mktemp("agent-cache"))


@pytest.fixture
def example_config(tmp_path: Path, backend: str) -> RunConfig:
    return RunConfig(out_dir=tmp_path / "out", backend=backend,
                     docs_mirrors=example_mirrors([EXAMPLE]))


def run(task, the_agent, config: RunConfig):
    events: list[Event] = []
    record = run_task(task, attempt=1, agent=the_agent, config=config, on_event=events.append)
    return record, events


def of(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def model_calls(server: VendorServer) -> list:
    """The requests for a model response (Codex also asks its API host what a turn cost)."""
    return [r for r in server.seen() if r.path == "/v1/responses"]


def agent_commands(events: list[Event]) -> list[CommandRan]:
    return [e for e in of(events, CommandRan) if e.source is Source.AGENT]


# The harness's proxy, and docker's sidecar, which follows the CLI's routes to the host.
@pytest.mark.parametrize("backend", ["linux", "docker"])
def test_the_tabulate_quickstart_passes_through_codex(codex: CliInstall, example_config: RunConfig,
                                                      backend: str) -> None:
    transcript = served(
        wire.response(wire.text("Reading the guide."), read_docs(f"{DOCS}/index.html")),
        wire.response(read_docs(f"{DOCS}/install.html")),
        wire.response(bash("python3 -m venv .venv && .venv/bin/pip install tabulate")),
        wire.response(read_docs(f"{DOCS}/first-table.html")),
        wire.response(bash(WRITE)),
        wire.response(bash(".venv/bin/python planets.py")),
        wire.response(wire.text("Done: planets.py prints the table.")),
    )
    with VendorServer(transcript, host=serving(backend)) as server:
        record, events = run(load_task(EXAMPLE.task_path), agent(codex, server.url),
                             example_config)
    assert (record.classification, record.reason) == (Classification.PASSED, "passed"), \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    assert record.agent == "codex" and record.backend == backend
    # The docs came through the harness's read_docs, recorded as route reads.
    reads = of(events, DocsRead)
    assert [r.page["url_requested"] for r in reads] == [
        f"{DOCS}/index.html", f"{DOCS}/install.html", f"{DOCS}/first-table.html"]
    assert all(r.route for r in reads)
    # Every command the CLI ran is recorded as the model wrote it, with its exit code,
    # each asked for first through the hook.
    commands = agent_commands(events)
    assert [c.command for c in commands] == [
        "python3 -m venv .venv && .venv/bin/pip install tabulate", WRITE,
        ".venv/bin/python planets.py"]
    assert [c.exit_code for c in commands] == [0, 0, 0]
    assert "| Earth    |          6371 |       1 |" in commands[-1].stdout
    asked = [p.argument for p in of(events, PermissionDecided) if p.tool == "bash"]
    assert asked == [c.command for c in commands]
    # Codex reports one turn of the conversation, its seven model calls' usage summed.
    (turn,) = of(events, ModelTurn)
    assert turn.text == "Done: planets.py prints the table."
    assert turn.usage["input_tokens"] == 700 and turn.usage["output_tokens"] == 140
    assert [c["name"] for c in turn.tool_calls].count("bash") == 3
    usage = [e for e in events if e.kind == "agent_finished"][0].usage
    assert usage["agent_cli"] == {"name": "codex", "package": "@openai/codex",
                                  "version": "0.171.0"}
    assert usage["spend"] is not None and usage["calls_asked"] == 3
    # The CLI spoke the streaming wire format with a placeholder, never a key.
    first = model_calls(server)[0]
    assert first.body["stream"] is True and first.body["model"] == wire.MODEL
    assert wire.api_key(first).startswith("firstrun-openai-")
    # Its own web search is off: every page it saw is a docs_read.
    assert not [t for t in first.body["tools"] if t.get("type") == "web_search"]


def test_a_run_the_check_fails_is_a_docs_gap_and_the_key_is_nowhere(
        codex: CliInstall, config: RunConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The harness holds a key; the run must show no trace of it anywhere.
    canary = "sk-proj-canary-" + "5e1f0a9c3b"
    for name in ("OPENAI_API_KEY", "FIRSTRUN_OPENAI_API_KEY"):
        monkeypatch.setenv(name, canary)
    # The pattern is not the literal, so the searching processes' own command lines
    # do not match it.
    look = ("env; if grep -rqs 'sk-proj-canar[y]' /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
            "/workspace /home /tmp; then echo key-found; else echo key-absent; fi; "
            "printf 'hello\\n' > greeting.txt")
    transcript = served(
        wire.response(read_docs(DOCS_GREETER)),
        wire.response(bash(look)),
        wire.response(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True)
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path), agent(codex, server.url), kept)
    assert (record.classification, record.reason) == (Classification.DOCS_GAP, "check_failed")
    (ran,) = agent_commands(events)
    assert ran.command == look and "OPENAI_API_KEY=firstrun-openai-" in ran.stdout
    # By evidence: not in the sandbox's environment or files (the command above looked),
    # not in what the CLI sent, not in any file the run left.
    assert "key-absent" in ran.stdout and canary not in ran.stdout + ran.stderr
    for request in server.seen():
        assert canary not in repr(request.headers) + repr(request.body)
    for path in kept.out_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert canary.encode() not in path.read_bytes(), path


def test_the_turn_budget_stops_the_cli_mid_run(codex: CliInstall, config: RunConfig,
                                               tmp_path: Path) -> None:
    transcript = served(
        wire.response(read_docs(DOCS_GREETER)),
        wire.response(bash("touch started")),
        wire.response(bash("touch second")),
        wire.response(bash(GREET)),
        wire.response(bash("touch fourth")),
        wire.response(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True)
    with VendorServer(transcript) as server:
        record, events = run(greeter_task(tmp_path, budgets={"max_turns": 2}),
                             agent(codex, server.url), kept)
    assert record.classification is Classification.BUDGET_EXHAUSTED
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert finished.detail.startswith("max_turns")
    # The third command was refused and the CLI stopped, at that call or (its stop hook
    # runs beside the asking one) at the next: nothing past the budget ran, and the
    # model was never asked past the call after it.
    assert [c.command for c in agent_commands(events)] == ["touch started", "touch second"]
    workspace = kept.out_dir / "runs" / "greeter" / "1" / "workspace"
    assert not (workspace / "greeting.txt").exists() and not (workspace / "fourth").exists()
    assert len(model_calls(server)) in (4, 5)
    # The interrupted turn's usage never came: its spend is unknown, not zero.
    assert finished.usage["spend"] is None


def test_the_spend_budget_stops_the_cli_from_its_logged_model_calls(
        codex: CliInstall, config: RunConfig, tmp_path: Path) -> None:
    # 100 tokens in and 20 out per call at OPENAI_PRICE: $0.00036 a call, so the
    # third call's usage passes $0.0008. Codex's stream reports usage only at the
    # end of its turn; each call's comes in its OpenTelemetry log, sent to the harness.
    steps = [wire.response(bash(f"sleep 2; touch step{n}")) for n in range(1, 9)]
    transcript = served(*steps, wire.response(wire.text("Done.")))
    kept = replace(config, keep_sandbox=True)
    with VendorServer(transcript) as server:
        events: list[Event] = []
        record = run_task(greeter_task(tmp_path), attempt=1, agent=agent(codex, server.url),
                          config=kept, on_event=events.append, max_spend=Decimal("0.0008"))
    assert record.classification is Classification.BUDGET_EXHAUSTED
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert finished.detail.startswith("max_spend"), finished.detail
    # Stopped mid-run: the script's end was never reached. The cut turn's spend is
    # unknown; what its logged calls cost, past the budget, is on record beside it.
    ran = [c.command for c in agent_commands(events)]
    assert 3 <= len(ran) < 8 and "Done." not in finished.claim
    assert len(model_calls(server)) < 9
    assert finished.usage["spend"] is None
    assert Decimal(finished.usage["logged_spend"]) > Decimal("0.0008")
    assert finished.usage["model_calls"] >= 3


def test_a_vendor_error_is_an_infra_error(codex: CliInstall, config: RunConfig,
                                         tmp_path: Path) -> None:
    with VendorServer(served(wire.unauthorized())) as server:
        record, events = run(greeter_task(tmp_path), agent(codex, server.url), config)
    assert (record.classification, record.reason) == (Classification.INFRA_ERROR, "agent_infra_error")
    (finished,) = [e for e in events if e.kind == "agent_finished"]
    assert "401" in finished.detail
    assert agent_commands(events) == []


def test_a_permission_rule_refuses_a_command_codex_asked_for(
        codex: CliInstall, config: RunConfig, tmp_path: Path) -> None:
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
        record, events = run(load_task(path), agent(codex, server.url), kept)
    assert record.classification is Classification.PASSED
    decisions = [(e.argument, e.verdict, e.rule) for e in of(events, PermissionDecided)]
    assert decisions == [("touch refused-ran", "deny", "bash(touch*)"), (GREET, "allow", None)]
    assert [e.command for e in agent_commands(events)] == [GREET]
    workspace = kept.out_dir / "runs" / "greeter" / "1" / "workspace"
    assert not (workspace / "refused-ran").exists()
    # The model was told, as the call's result, which rule refused it.
    (refused,) = wire.function_outputs(model_calls(server)[1])
    assert "bash(touch*)" in str(refused["output"])


def test_the_proxy_puts_the_key_into_api_requests_and_nowhere_else(
        codex: CliInstall, config: RunConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "sk-proj-canary-" + "8c2a61f0d7"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("FIRSTRUN_OPENAI_API_KEY", canary)
    context, cafile = api_tls(tmp_path, API_HOST)
    # The proxy verifies the scripted API's certificate like any server's.
    trust = tmp_path / "trust.pem"
    system = os.environ.get("SSL_CERT_FILE")
    trust.write_bytes((Path(system).read_bytes() if system else b"") + cafile.read_bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(trust))
    look = ("env | grep ^OPENAI_API_KEY=; if grep -rqs 'sk-proj-canar[y]' /proc/[0-9]*/environ "
            "/proc/[0-9]*/cmdline /workspace /home /tmp; then echo key-found; "
            f"else echo key-absent; fi; {GREET}")
    transcript = served(
        wire.response(bash(look)),
        wire.response(wire.text("Done.")),
    )
    kept = replace(config, keep_sandbox=True, inspect_tls=True)
    with VendorServer(transcript, tls=context) as server:
        record, events = run(greeter_task(tmp_path), agent(codex, server.url), kept)
    assert record.classification is Classification.PASSED, \
        [e for e in events if e.kind in ("failure", "agent_finished")]
    # Every request reached the API with the real key: the proxy swapped it in. Only
    # model calls reached it: Codex's question of what a turn cost was refused.
    api = server.seen()
    assert api and all(wire.api_key(r) == canary for r in api)
    assert {r.path for r in api} == {"/v1/responses"}
    swapped = [e.record for e in events if e.kind == "egress" and e.record.host == API_HOST]
    assert swapped and all(r.credentials == ("OPENAI_API_KEY",) for r in swapped
                           if r.credentials)
    # Inside, only the placeholder: in the CLI's environment, in no process or file.
    (ran,) = agent_commands(events)
    assert ran.stdout.startswith("OPENAI_API_KEY=firstrun-openai_api_key-")
    assert "key-absent" in ran.stdout and canary not in ran.stdout + ran.stderr
    for path in kept.out_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert canary.encode() not in path.read_bytes(), path
