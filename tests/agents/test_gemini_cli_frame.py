"""What ``--agent gemini-cli`` asks of the CLI and of the run, and how it answers the CLI's
hooks, without running the CLI."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from firstrun.agents.base import AgentStop, Brief, Budget, BudgetExhausted, CallRefused
from firstrun.agents.cli.gemini_cli import (
    GeminiCliAgent,
    _Reading,
    ending,
    make_gemini_cli,
)
from firstrun.agents.cli.gemini_hooks import HOOK_PATH
from firstrun.agents.cli.gemini_stream import Final, GeminiStream
from firstrun.agents.cli.harness_mcp import HARNESS_HOST
from firstrun.agents.cli.install import GEMINI_CLI, CliInstall, default_cache, ensure_node
from firstrun.agents.spend import FilePrice
from firstrun.errors import UsageError
from firstrun.policy.permissions import (
    PermissionMode,
    PermissionVerdict,
    RuleSet,
    decide,
    parse_rule,
)
from firstrun.results.model import Classification
from firstrun.run.events import Event, Failure
from firstrun.run.runner import RunConfig, run_task
from support.agents import greeter_task

ROOT = "/opt/cache/gemini-cli"
PRICE = FilePrice(model="gemini-test-1", input=Decimal(1), output=Decimal(4), cached=Decimal("0.25"))


def make() -> GeminiCliAgent:
    return GeminiCliAgent(install=CliInstall(pin=GEMINI_CLI, root=ROOT), model="gemini-test-1",
                          base_url="https://generativelanguage.googleapis.com", pricing=None)


def brief(tmp_path: Path) -> Brief:
    task = greeter_task(tmp_path, budgets={"max_turns": 7})
    return Brief(task=task.name, goal=task.spec.goal, docs_route=task.docs_route,
                 docs_hosts=task.docs_hosts, budgets=task.spec.budgets, replay=(), max_spend=None)


def test_the_cli_is_configured_in_the_sessions_home_with_budgets_mcp_and_hooks(
        tmp_path: Path) -> None:
    agent = make()
    argv = agent.argv(brief(tmp_path))
    # A shell writes the settings and the memory into $HOME/.gemini, then becomes the CLI.
    assert argv[:2] == ["/bin/sh", "-c"] and '"$HOME/.gemini/settings.json"' in argv[2]
    settings = json.loads(argv[4])
    # No node lent (a frame test): the session's own node runs the bundle.
    assert argv[6:9] == ["node", f"{ROOT}/bundle/gemini.js", "-p"]
    assert argv[argv.index("--approval-mode") + 1] == "yolo"
    assert argv[argv.index("--output-format") + 1] == "stream-json"
    assert settings["model"] == {"maxSessionTurns": 7}
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["tools"]["exclude"] == ["web_fetch", "google_web_search", "invoke_agent"]
    assert settings["experimental"]["enableAgents"] is False
    ports = {r.port for r in agent.needs().routes}
    (server,) = settings["mcpServers"].values()
    assert server["trust"] is True and server["includeTools"] == ["read_docs"]
    assert server["httpUrl"] == agent.mcp.url
    hooks = settings["hooks"]
    assert [h["matcher"] for h in hooks["BeforeTool"]] == ["run_shell_command"]
    relay = hooks["BeforeTool"][0]["hooks"][0]
    assert relay["env"]["FIRSTRUN_HOOK_URL"] == agent.hooks.url
    assert {agent.mcp.port, agent.hooks.port} == ports


def test_the_run_lends_the_install_and_routes_only_the_harness() -> None:
    agent = make()
    needs = agent.needs()
    assert needs.lend == (ROOT,)
    assert {(r.host, r.address) for r in needs.routes} == {(HARNESS_HOST, "127.0.0.1")}
    assert needs.allow == ("generativelanguage.googleapis.com",) and needs.credentials == ()
    assert (f"{HARNESS_HOST}:{agent.hooks.port}", ("POST",), agent.hooks.path) in needs.methods
    assert agent.hooks.url.startswith(f"http://{HARNESS_HOST}:{agent.hooks.port}{HOOK_PATH}/")
    env = agent.environment("firstrun-google-00")
    assert env["GEMINI_API_KEY"] == "firstrun-google-00"
    assert env["GOOGLE_GEMINI_BASE_URL"] == "https://generativelanguage.googleapis.com"


def test_an_https_api_needs_a_key_which_the_proxy_then_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(UsageError, match="FIRSTRUN_GEMINI_API_KEY or GEMINI_API_KEY"):
        make_gemini_cli(environ={})
    # Said before the CLI was downloaded.
    assert list(tmp_path.iterdir()) == []
    install = CliInstall(pin=GEMINI_CLI, root=ROOT)
    agent = make_gemini_cli(install=install, environ={"GEMINI_API_KEY": "AIza-x"})
    assert agent.needs().credentials == (("GEMINI_API_KEY", "generativelanguage.googleapis.com",
                                          "GEMINI_API_KEY"),)


@pytest.fixture
def config(linux_config: RunConfig) -> RunConfig:
    """Gemini CLI runs as a process in the session, so its runs are judged on linux's."""
    return linux_config


def test_a_backend_with_its_own_proxy_refuses_the_run(config: RunConfig, tmp_path: Path) -> None:
    events: list[Event] = []
    record = run_task(greeter_task(tmp_path), attempt=1, agent=make(),
                      config=replace(config, backend="docker"), on_event=events.append)
    assert record.classification is Classification.INFRA_ERROR
    (failure,) = [e for e in events if isinstance(e, Failure)]
    assert "has no node lent to it" in failure.message
    assert not [e for e in events if e.kind == "sandbox_started"]


@pytest.mark.parametrize(("name", "stop", "detail"), [
    ("commands.jsonl", AgentStop.FINISHED, ""),
    ("turn_limit.jsonl", AgentStop.BUDGET_EXHAUSTED, "max_turns"),
    ("api_error.jsonl", AgentStop.INFRA_ERROR, "gemini-cli ended with unknown: [API Error"),
])
def test_how_the_cli_ended_is_the_agents_stop(name: str, stop: AgentStop, detail: str) -> None:
    stream = GeminiStream()
    lines = (Path(__file__).parent / "fixtures" / "gemini" / name).read_text().splitlines()
    (final,) = [i for line in lines for i in stream.feed(line) if isinstance(i, Final)]
    got, said = ending(final, 1, "")
    assert got is stop and said.startswith(detail)


class Tools:
    """The toolbelt calls a reading makes, recorded; ``refuse`` and ``spent`` script them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refuse: set[str] = set()
        self.spent = False

    def permit(self, tool: str, argument: str) -> None:
        if self.spent:
            raise BudgetExhausted(Budget.MAX_SECONDS, "the agent phase used its 60s")
        self.calls.append(("permit", argument))
        if argument in self.refuse:
            rules = RuleSet(source="task", rules=(
                parse_rule("bash(touch*)", verdict=PermissionVerdict.DENY),))
            decision = decide([rules], tool=tool, argument=argument,
                              mode=PermissionMode.UNATTENDED)
            raise CallRefused(tool=tool, argument=argument, decision=decision)

    def record_turn(self, turn: Any) -> None:
        self.calls.append(("turn", turn))

    def record_command(self, **command: Any) -> None:
        self.calls.append(("command", command))


def reported(*turns: tuple[int, int, int]) -> list[dict[str, Any]]:
    return [{"model": "gemini-test-1", "input": i, "output": o, "cached": c, "thoughts": 0,
             "tool": 0, "total": i + o} for i, o, c in turns]


def test_each_command_is_decided_and_a_refusal_is_told_to_the_model() -> None:
    tools = Tools()
    tools.refuse.add("touch x")
    reading = _Reading(tools=tools, pricing=None, max_spend=None)  # type: ignore[arg-type]
    ask = {"hook_event_name": "BeforeTool", "tool_name": "run_shell_command"}

    def asked(command: str) -> dict[str, Any]:
        # As the CLI does: the call is in the stream before its hook runs.
        reading.take(json.dumps({"type": "tool_use", "tool_name": "run_shell_command",
                                 "tool_id": command, "parameters": {"command": command}}))
        return {**ask, "tool_input": {"command": command}}

    assert reading.answer(asked("ls")) == {"decision": "allow"}
    refused = reading.answer(asked("touch x"))
    assert refused["decision"] == "deny" and "bash(touch*)" in refused["reason"]
    # Other tools are not the rules' to decide.
    assert reading.answer({**ask, "tool_name": "read_file", "tool_input": {}}) == {}
    tools.spent = True
    stopped = reading.answer(asked("ls"))
    assert stopped["continue"] is False and isinstance(reading.ended, BudgetExhausted)


def test_a_commands_turn_is_recorded_before_the_decision_on_it() -> None:
    tools = Tools()
    reading = _Reading(tools=tools, pricing=PRICE, max_spend=None)  # type: ignore[arg-type]
    stream = (Path(__file__).parent / "fixtures" / "gemini" / "commands.jsonl").read_text()
    for line in stream.splitlines()[:4]:
        reading.take(line)
    reading.answer({"hook_event_name": "BeforeTool", "tool_name": "run_shell_command",
                    "tool_input": {"command": "echo out; echo err >&2; exit 3"},
                    "firstrun_turns": reported((100, 20, 0))})
    assert [c[0] for c in tools.calls] == ["turn", "permit"]
    assert tools.calls[0][1].usage["input_tokens"] == 100


def test_turns_take_the_tokens_the_hooks_reported_and_the_last_the_rest_of_the_totals() -> None:
    tools = Tools()
    reading = _Reading(tools=tools, pricing=PRICE, max_spend=None)  # type: ignore[arg-type]
    lines = (Path(__file__).parent / "fixtures" / "gemini" / "commands.jsonl").read_text()
    stream = lines.splitlines()
    # Before the first command's result, its AfterTool hook reported turn 1 and the code.
    for line in stream[:4]:
        reading.take(line)
    reading.answer({"hook_event_name": "AfterTool", "tool_name": "run_shell_command",
                    "tool_input": {"command": "echo out; echo err >&2; exit 3"},
                    "tool_response": {"llmContent": "Output: out\nerr\nExit Code: 3\n"},
                    "firstrun_turns": reported((100, 20, 0))})
    reading.take(stream[4])
    reading.answer({"hook_event_name": "AfterTool", "tool_name": "run_shell_command",
                    "tool_input": {"command": "echo two"},
                    "tool_response": {"llmContent": "Output: two\n"},
                    "firstrun_turns": reported((100, 20, 0), (100, 20, 0), (100, 20, 0))})
    for line in stream[5:]:
        reading.take(line)
    turns = [c[1] for c in tools.calls if c[0] == "turn"]
    commands = [c[1] for c in tools.calls if c[0] == "command"]
    assert [c["command"] for c in commands] == ["echo out; echo err >&2; exit 3", "echo two"]
    assert [c["exit_code"] for c in commands] == [3, 0]
    assert [t.usage["input_tokens"] for t in turns] == [100, 100, 100, 300]
    assert turns[-1].usage["cached_tokens"] == 100 and turns[-1].usage["output_tokens"] == 5
    assert turns[0].spend == str(Decimal(100) / 10**6 + Decimal(20 * 4) / 10**6)
    # The touch was refused by a hook: no AfterTool for it, so no command recorded.
    assert "touch denied-file" not in [c["command"] for c in commands]


def test_spend_past_the_limit_stops_the_cli_before_its_next_model_call() -> None:
    reading = _Reading(tools=Tools(), pricing=PRICE,  # type: ignore[arg-type]
                       max_spend=Decimal("0.001"))
    assert reading.answer({"hook_event_name": "BeforeModel",
                           "firstrun_turns": reported((500, 10, 0))}) == {}
    stopped = reading.answer({"hook_event_name": "BeforeModel",
                              "firstrun_turns": reported((500, 10, 0), (600, 10, 0))})
    assert stopped["continue"] is False
    assert isinstance(reading.ended, BudgetExhausted) and reading.ended.budget is Budget.MAX_SPEND


def test_a_turn_no_hook_saw_has_unknown_tokens_and_the_run_keeps_the_clis_totals(
        tmp_path: Path) -> None:
    tools = Tools()
    reading = _Reading(tools=tools, pricing=PRICE, max_spend=None)  # type: ignore[arg-type]
    # The first turn's hook saw it; the unknown-tool turn (no hook fires) and what
    # follows were seen by none.
    stream = (Path(__file__).parent / "fixtures" / "gemini" / "commands.jsonl").read_text()
    lines = stream.splitlines()
    for line in lines[:4]:
        reading.take(line)
    reading.answer({"hook_event_name": "AfterTool", "tool_name": "run_shell_command",
                    "tool_input": {"command": "echo out; echo err >&2; exit 3"},
                    "tool_response": {"llmContent": "Exit Code: 3"},
                    "firstrun_turns": reported((100, 20, 0))})
    for line in lines[4:]:
        reading.take(line)
    turns = [c[1] for c in tools.calls if c[0] == "turn"]
    assert turns[0].usage["input_tokens"] == 100 and turns[0].spend is not None
    assert all(t.usage["input_tokens"] is None and t.spend is None for t in turns[1:])
    assert [t.get("usage_known", True) for t in reading.per_turn] == [True, False, False, False]
    usage = make().usage(reading, brief(tmp_path))
    assert (usage["input_tokens"], usage["output_tokens"], usage["cached_tokens"]) == (600, 65, 100)
    assert usage["spend"] is None


def test_the_hosts_node_is_copied_once_by_its_hash_and_runs(tmp_path: Path) -> None:
    node = ensure_node(tmp_path)
    assert Path(node).parent.parent == tmp_path and Path(node).parent.name.startswith("node-")
    assert ensure_node(tmp_path) == node and len(list(tmp_path.iterdir())) == 1
    ran = subprocess.run([node, "-e", "process.stdout.write(process.version)"],
                         capture_output=True, text=True, check=True)
    assert int(ran.stdout.lstrip("v").split(".")[0]) >= 20
    # Given one, the agent lends its directory and runs the CLI and its hooks on it.
    agent = make_gemini_cli(install=CliInstall(pin=GEMINI_CLI, root=ROOT), node=node,
                            base_url="http://api.gemini.test:1", environ={})
    assert str(Path(node).parent) in agent.needs("172.17.0.1").lend


def test_the_default_cache_is_outside_roots_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    if os.geteuid() == 0:
        assert default_cache() == Path("/var/cache/firstrun/agents")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert default_cache() == Path("/somewhere/firstrun/agents")
