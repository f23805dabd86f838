"""What ``--agent claude-code`` asks of the CLI and of the run, without running the CLI."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from firstrun.agents.base import AgentStop, Brief
from firstrun.agents.cli.claude_code import ClaudeCodeAgent, ending, make_claude_code
from firstrun.agents.cli.claude_stream import ClaudeStream, Final
from firstrun.agents.cli.frame import Route
from firstrun.agents.cli.harness_mcp import APPROVE_TOOL, HARNESS_HOST, HarnessMcp
from firstrun.agents.cli.install import CLAUDE_CODE, CliInstall
from firstrun.errors import UsageError
from firstrun.policy.methods import InspectionPolicy, inspects
from firstrun.policy.network import NetworkPolicy
from firstrun.results.model import Classification
from firstrun.run.events import Event, Failure
from firstrun.run.runner import RunConfig, run_task
from firstrun.run.sandbox import granted
from support.agents import greeter_task


def make(root: str = "/opt/cache/claude-code") -> ClaudeCodeAgent:
    return ClaudeCodeAgent(install=CliInstall(pin=CLAUDE_CODE, root=root), model="claude-test-1",
                           base_url="https://api.anthropic.com", pricing=None)


def brief(tmp_path: Path, max_spend: Decimal | None = None) -> Brief:
    task = greeter_task(tmp_path, budgets={"max_turns": 7})
    return Brief(task=task.name, goal=task.spec.goal, docs_route=task.docs_route,
                 docs_hosts=task.docs_hosts, budgets=task.spec.budgets, replay=(),
                 max_spend=max_spend)


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def config(linux_config: RunConfig) -> RunConfig:
    """Claude Code runs as a process in the session, so its runs are judged on linux's."""
    return linux_config


def test_the_cli_is_told_the_budgets_the_mcp_server_and_to_ask_for_every_command(
        tmp_path: Path) -> None:
    agent = make()
    # As a run does: the needs first (the backend's proxy reached at loopback), then the CLI.
    port = agent.needs().routes[0].port
    argv = agent.argv(brief(tmp_path))
    assert argv[:2] == ["/opt/cache/claude-code/claude", "-p"]
    assert option(argv, "--max-turns") == "7" and "--max-budget-usd" not in argv
    assert option(argv, "--permission-prompt-tool") == APPROVE_TOOL
    settings = json.loads(option(argv, "--settings"))
    assert settings["permissions"]["ask"] == ["Bash"]
    # WebFetch goes through the proxy (a page read); WebSearch runs out of reach.
    assert settings["permissions"]["deny"] == ["WebSearch"]
    assert settings["skipWebFetchPreflight"] is True
    servers = json.loads(option(argv, "--mcp-config"))["mcpServers"]
    assert servers == {"firstrun": {"type": "http", "url": agent.mcp.url}}
    assert agent.mcp.url.startswith(f"http://{HARNESS_HOST}:{port}/mcp/")
    assert "--strict-mcp-config" in argv
    assert option(make().argv(brief(tmp_path, Decimal("1.25"))), "--max-budget-usd") == "1.25"
    # Behind a backend's own proxy (docker's sidecar) no docs reader answers its fetches.
    sidecar = make()
    assert sidecar.needs("172.17.0.1").pages is None
    settings = json.loads(option(sidecar.argv(brief(tmp_path)), "--settings"))
    assert settings["permissions"]["deny"] == ["WebSearch", "WebFetch"]


def test_the_mcp_server_answers_only_at_the_path_the_cli_is_told() -> None:
    read: list[str] = []
    call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "read_docs", "arguments": {"url": "http://x/"}}}).encode()

    def post(server: HarnessMcp, path: str) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}{path}", data=call, method="POST",
            headers={"host": f"{HARNESS_HOST}:{server.port}", "content-type": "application/json",
                     "accept": "application/json, text/event-stream"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    with HarnessMcp() as server:
        server.bind(read_docs=lambda url: read.append(url) or "page",
                    permit_bash=lambda command: None)
        assert post(server, "/mcp") == 404 and read == []
        assert post(server, server.path) == 200 and read == ["http://x/"]


def test_the_run_lends_the_install_and_routes_only_the_harness(tmp_path: Path) -> None:
    agent = make()
    needs = agent.needs()
    assert needs.lend == ("/opt/cache/claude-code",)
    assert [(r.host, r.address) for r in needs.routes] == [(HARNESS_HOST, "127.0.0.1")]
    assert needs.allow == ("api.anthropic.com",) and needs.credentials == ()
    env = agent.environment("firstrun-anthropic-00")
    assert env["ANTHROPIC_API_KEY"] == "firstrun-anthropic-00"
    assert env["ANTHROPIC_BASE_URL"] == "https://api.anthropic.com"


def refusal(config: RunConfig, agent: ClaudeCodeAgent, tmp_path: Path) -> Failure:
    events: list[Event] = []
    record = run_task(greeter_task(tmp_path), attempt=1, agent=agent, config=config,
                      on_event=events.append)
    assert record.classification is Classification.INFRA_ERROR
    assert not [e for e in events if e.kind == "sandbox_started"]
    (failure,) = [e for e in events if isinstance(e, Failure)]
    return failure


def test_a_backend_that_cannot_lend_the_install_refuses_the_run_before_it_starts(
        config: RunConfig, tmp_path: Path) -> None:
    failure = refusal(replace(config, backend="microvm"), make(), tmp_path)
    assert failure.who == "microvm" and failure.reason == "sandbox_refused"
    assert "cannot run an agent CLI: its guest sees the workspace" in failure.message


def test_a_route_the_sidecar_cannot_reach_refuses_the_run(config: RunConfig,
                                                          tmp_path: Path) -> None:
    # The sidecar's loopback is its own: a scripted server there would be unreachable.
    agent = ClaudeCodeAgent(install=CliInstall(pin=CLAUDE_CODE, root=str(tmp_path)),
                            model="claude-test-1", base_url="http://api.anthropic.test:9",
                            pricing=None,
                            routes=(Route(host="api.anthropic.test", port=9, address="127.0.0.1"),))
    failure = refusal(replace(config, backend="docker"), agent, tmp_path)
    assert failure.who == "docker" and failure.reason == "sandbox_refused"
    assert "cannot reach api.anthropic.test on the host's loopback" in failure.message


def test_an_https_api_needs_a_key_which_the_proxy_then_holds() -> None:
    install = CliInstall(pin=CLAUDE_CODE, root="/opt/cache/claude-code")
    with pytest.raises(UsageError, match="FIRSTRUN_ANTHROPIC_API_KEY or ANTHROPIC_API_KEY"):
        make_claude_code(install=install, environ={})
    agent = make_claude_code(install=install, environ={"ANTHROPIC_API_KEY": "sk-x"})
    assert agent.needs().credentials == (("ANTHROPIC_API_KEY", "api.anthropic.com",
                                          "ANTHROPIC_API_KEY"),)
    # A plain-HTTP server (a test's) takes the placeholder as it comes: no key is needed.
    plain = make_claude_code(install=install, base_url="http://api.anthropic.test:8080",
                             environ={})
    assert plain.needs().credentials == () and plain.needs().allow == ("api.anthropic.test:8080",)


def test_a_held_key_inspects_the_api_host_alone_unless_the_run_inspects_all() -> None:
    agent = make_claude_code(install=CliInstall(pin=CLAUDE_CODE, root="/opt/cache/claude-code"),
                             environ={"FIRSTRUN_ANTHROPIC_API_KEY": "sk-x"})
    base = NetworkPolicy.build()
    scoped = granted(base, agent.needs())
    # The API host is the agent channel's, not the shell's allow-list.
    assert [str(p) for p in scoped.agent] == ["api.anthropic.com"]
    assert scoped.allow == base.allow
    assert scoped.inspection is not None
    assert [str(p) for p in scoped.inspection.scope or ()] == ["api.anthropic.com"]
    assert [c.name for c in scoped.inspection.credentials] == ["ANTHROPIC_API_KEY"]
    assert inspects(scoped.inspection, "api.anthropic.com", 443)
    assert not inspects(scoped.inspection, "pypi.org", 443)
    # Under --inspect-tls every host stays inspected, the key's host with them.
    everything = granted(base.with_inspection(InspectionPolicy()), agent.needs())
    assert everything.inspection is not None and everything.inspection.scope is None
    assert inspects(everything.inspection, "pypi.org", 443)
    assert [c.name for c in everything.inspection.credentials] == ["ANTHROPIC_API_KEY"]
    # A plain-HTTP test server takes no key: only the docs hosts its WebFetch
    # reaches are inspected, each fetch served by the docs reader.
    plain = make_claude_code(install=CliInstall(pin=CLAUDE_CODE, root="/opt/cache/claude-code"),
                             base_url="http://api.anthropic.test:8080", environ={})
    assert plain.needs().pages is not None
    served = granted(NetworkPolicy.build(docs=["docs.test"]), plain.needs())
    assert served.serve_docs and served.inspection is not None
    assert [str(p) for p in served.inspection.scope or ()] == ["docs.test"]
    assert not inspects(served.inspection, "api.anthropic.test", 8080)
    # An agent without a fetch of its own: nothing is served, nothing inspected.
    quiet = replace(plain.needs(), pages=None)
    assert granted(base, quiet).inspection is None and not granted(base, quiet).serve_docs


@pytest.mark.parametrize(("name", "stop", "detail"), [
    ("pass.jsonl", AgentStop.FINISHED, ""),
    ("max_turns.jsonl", AgentStop.BUDGET_EXHAUSTED, "max_turns"),
    ("max_budget.jsonl", AgentStop.BUDGET_EXHAUSTED, "max_spend"),
    ("unauthorized.jsonl", AgentStop.INFRA_ERROR, "the model API failed (status 401)"),
])
def test_how_the_cli_ended_is_the_agents_stop(name: str, stop: AgentStop, detail: str) -> None:
    stream = ClaudeStream()
    lines = (Path(__file__).parent / "fixtures" / "claude_code" / name).read_text().splitlines()
    (final,) = [i for line in lines for i in stream.feed(line) if isinstance(i, Final)]
    got, said = ending(final, 1, "")
    assert got is stop and said.startswith(detail)


def test_a_cli_that_ends_without_a_result_is_an_infra_error() -> None:
    stop, detail = ending(None, 137, "Killed\n")
    assert stop is AgentStop.INFRA_ERROR and "exit 137" in detail and "Killed" in detail
