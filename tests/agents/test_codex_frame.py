"""What ``--agent codex`` asks of the CLI and of the run, without running the CLI."""

from __future__ import annotations

import gc
import json
import os
import tomllib
from pathlib import Path

import pytest

from firstrun.agents.base import Brief, Budget, BudgetExhausted, CallRefused
from firstrun.agents.cli.codex import CodexAgent, toml
from firstrun.agents.cli.harness_mcp import HARNESS_HOST, HarnessMcp
from firstrun.agents.cli.install import CODEX, CliInstall
from firstrun.agents.prompt import task_message
from firstrun.policy.permissions import (
    PermissionMode,
    PermissionVerdict,
    RuleSet,
    decide,
    parse_rule,
)
from support.agents import greeter_task

pytestmark = pytest.mark.fast


def make(root: str = "/opt/cache/codex") -> CodexAgent:
    return CodexAgent(install=CliInstall(pin=CODEX, root=root), model="gpt-test-1",
                      base_url="https://api.openai.com/v1", pricing=None)


def brief(tmp_path: Path) -> Brief:
    task = greeter_task(tmp_path, budgets={"max_turns": 7})
    return Brief(task=task.name, goal=task.spec.goal, docs_route=task.docs_route,
                 docs_hosts=task.docs_hosts, budgets=task.spec.budgets, replay=())


def overrides(argv: list[str]) -> dict:
    """Every ``-c key=value`` of ``argv``, each value read as the TOML Codex reads it as."""
    found = {}
    for flag, setting in zip(argv, argv[1:], strict=False):
        if flag == "-c":
            key, _, value = setting.partition("=")
            found[key] = tomllib.loads(f"v = {value}")["v"]
    return found


def test_codex_runs_from_flags_alone_with_its_sandbox_off_and_every_call_asked(
        tmp_path: Path) -> None:
    agent = make()
    argv = agent.argv(brief(tmp_path))
    assert argv[:4] == ["/opt/cache/codex/vendor/x86_64-unknown-linux-musl/bin/codex", "exec",
                        "--json", "--color"]
    for flag in ("--ignore-user-config", "--ignore-rules", "--ephemeral",
                 "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust"):
        assert flag in argv
    # The task message, as the built-in agents get it, is the prompt.
    assert argv[-1] == task_message(brief(tmp_path))
    found = overrides(argv)
    assert found["model_provider"] == "firstrun"
    assert found["model_providers.firstrun"] == {
        "name": "firstrun", "base_url": "https://api.openai.com/v1",
        "env_key": "OPENAI_API_KEY", "wire_api": "responses"}
    agent.needs()
    assert found["mcp_servers.firstrun"] == {"url": agent.mcp.url,
                                             "required": True}
    assert found["web_search"] == "disabled" and found["check_for_update_on_startup"] is False
    (group,) = found["hooks.PreToolUse"]
    ask, stop = group["hooks"]
    assert ask == {"type": "mcp_tool", "server": "firstrun", "tool": "pre_tool_use",
                   "input": {"tool_name": "${tool_name}", "command": "${tool_input.command}"}}
    assert stop["type"] == "command" and agent.stop_dir in stop["command"]
    assert "read_docs" in found["developer_instructions"]


def test_the_run_lends_the_install_and_the_stop_mark_read_only_and_holds_the_key(
        tmp_path: Path) -> None:
    agent = make()
    needs = agent.needs()
    assert needs.lend == ("/opt/cache/codex", agent.stop_dir)
    assert needs.allow == ("api.openai.com",)
    assert ("api.openai.com", ("POST",), "/v1/responses") in needs.methods
    # Its OTel logs are posted under the MCP server's own secret path, which the rule covers.
    assert (f"{HARNESS_HOST}:{needs.routes[0].port}", ("POST",), agent.mcp.path) in needs.methods
    assert agent.mcp.logs_url.startswith(f"http://{HARNESS_HOST}:{needs.routes[0].port}"
                                         f"{agent.mcp.path}/")
    assert agent.environment("firstrun-openai-x") == {"OPENAI_API_KEY": "firstrun-openai-x"}
    stop_dir = agent.stop_dir
    agent.stop()
    assert os.listdir(stop_dir) == ["stop"]
    # Gone with the agent, run or not.
    del agent, needs
    gc.collect()
    assert not os.path.exists(stop_dir)


def test_toml_values_keep_quotes_newlines_and_unicode() -> None:
    text = 'say "hi"\nthen \\ stop — done'
    assert tomllib.loads(f"v = {toml(text)}")["v"] == text
    assert tomllib.loads(f"v = {toml({'a': [1, True], 'b': {'c': 'd'}})}")["v"] == \
        {"a": [1, True], "b": {"c": "d"}}


def test_the_hook_is_answered_by_the_rules_and_refuses_once_the_run_is_over() -> None:
    rules = RuleSet(source="task", rules=(
        parse_rule("bash(touch*)", verdict=PermissionVerdict.DENY),))
    server = HarnessMcp()
    asked: list[str] = []

    def permit(command: str) -> None:
        asked.append(command)
        if command == "spent":
            raise BudgetExhausted(Budget.MAX_TURNS, "call 8 past 7")
        decision = decide((rules,), tool="bash", argument=command,
                          mode=PermissionMode.UNATTENDED)
        if decision.verdict is not PermissionVerdict.ALLOW:
            raise CallRefused(tool="bash", argument=command, decision=decision)

    def answer(tool: str, command: str) -> dict:
        text = server.pre_tool_use(tool, command)
        return json.loads(text).get("hookSpecificOutput", {})

    server.bind(read_docs=lambda url: "", permit_bash=permit)
    try:
        assert answer("Bash", "ls") == {}
        refused = answer("Bash", "touch x")
        assert refused["permissionDecision"] == "deny"
        assert "bash(touch*)" in refused["permissionDecisionReason"]
        # Codex's other tools (a running command's stdin, a patch) are not shell commands.
        assert answer("write_stdin", "") == {}
        spent = answer("Bash", "spent")
        assert spent["permissionDecision"] == "deny" and "max_turns" in \
            spent["permissionDecisionReason"]
        # Once a budget is spent every call is refused, the harmless ones too.
        assert answer("Bash", "ls")["permissionDecision"] == "deny"
        assert isinstance(server.ended, BudgetExhausted)
        assert asked == ["ls", "touch x", "spent"]
    finally:
        server._sock.close()
