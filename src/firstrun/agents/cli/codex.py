"""``--agent codex``: OpenAI's Codex CLI itself, as one sandboxed process in the session.

Guarantee: a ``CliAgent`` (its guarantees hold) over the pinned install
``install.CODEX``, configured by flags alone (no config file is read). Before
every tool call Codex runs, its PreToolUse hook asks the harness over MCP, so
each command is decided by the task's rules and counted against ``max_turns``;
its own sandbox, approvals and web search are off (the session is the
boundary, every page it saw is a ``docs_read``); ``codex exec --json`` is read
by ``codex_stream``. A spent budget refuses the call and stops the CLI.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from firstrun.agents.base import AgentResult, AgentStop, Brief, Budget, BudgetExhausted
from firstrun.agents.cli.agent import CliAgent, Reading, held_key
from firstrun.agents.cli.codex_stream import (
    CodexStream,
    Command,
    Failed,
    Item,
    McpCall,
    Message,
    TurnUsage,
    logged_calls,
)
from firstrun.agents.cli.frame import LOOPBACK, Needs, ProcessToolbelt, Route
from firstrun.agents.cli.harness_mcp import HOOK_TOOL, SERVER_NAME
from firstrun.agents.cli.install import CODEX, CliInstall
from firstrun.agents.loop import page_text
from firstrun.agents.prompt import cli_prompt, task_message
from firstrun.agents.spend import FilePrice, Pricing, price_for
from firstrun.agents.vendor import TokenUsage, TurnStop

VENDOR = "openai"
# The variable the CLI reads its key from; inside, it only ever holds a placeholder.
KEY_NAME = "OPENAI_API_KEY"
DEFAULT_MODEL = "gpt-5.5"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# The model provider firstrun configures (Codex's own ``openai`` one would log in).
PROVIDER = "firstrun"
CLI_PROMPT = cli_prompt("read_docs tool of the firstrun MCP server")
# The file whose presence tells the CLI's stop hook to interrupt it.
STOP_FILE = "stop"


def toml(value: Any) -> str:
    """``value`` as a TOML value, for a ``-c key=value`` override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # A JSON string's escapes are all TOML basic-string escapes.
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {value!r}")


class CodexAgent(CliAgent):
    name = "codex"
    vendor = VENDOR
    key_name = KEY_NAME

    @property
    def api_path(self) -> str:  # type: ignore[override]
        # The Responses API: POSTs to <base_url>/responses, and only there. With
        # its OpenTelemetry log on, Codex also asks the API host what each turn
        # cost (POST <base_url>/analytics/codex/turn-costs); the proxy refuses that.
        return urlsplit(self.base_url).path.rstrip("/") + "/responses"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # A host directory lent read-only: the harness marks it when a budget is
        # spent, and the CLI's stop hook, seeing the mark, interrupts the CLI.
        self._stop_dir: str | None = None
        self._max_turns: int | None = None
        self._max_spend: Decimal | None = None
        self._asked = 0
        # Each model call's usage, from Codex's OpenTelemetry logs as they arrive.
        self._calls = 0
        self._logged_spend: Decimal | None = Decimal(0) if self.pricing is not None else None

    @property
    def stop_dir(self) -> str:
        if self._stop_dir is None:
            self._stop_dir = tempfile.mkdtemp(prefix="firstrun-codex-")
            os.chmod(self._stop_dir, 0o755)
            # Gone with the agent even when its run never started (a failed setup).
            weakref.finalize(self, shutil.rmtree, self._stop_dir, ignore_errors=True)
        return self._stop_dir

    def needs(self, serve_at: str = LOOPBACK) -> Needs:
        # Its OTel logs are posted under the MCP server's path, which its rule covers.
        needs = super().needs(serve_at)
        return replace(needs, lend=(*needs.lend, self.stop_dir))

    def argv(self, brief: Brief) -> list[str]:
        # exec mode with the task message, every setting a -c override and no
        # config file read (--ignore-user-config, --ignore-rules), nothing kept
        # (--ephemeral). Codex's sandbox and approvals are off: the session is
        # the boundary (Codex's own bubblewrap cannot nest in it), and every
        # call is decided by the harness through the PreToolUse hook instead.
        # The hooks are firstrun's own flags, so they run without Codex's review
        # of a hook's hash (--dangerously-bypass-hook-trust); a project's .codex/
        # is not trusted, so not loaded. Budgets: Codex takes no turn or spend limit, so the
        # hook counts calls (max_turns) and the stop hook ends the CLI; wall
        # seconds are the session's timeout, which ends its whole tree.
        provider: dict[str, Any] = {"name": PROVIDER, "base_url": self.base_url,
                                    "env_key": KEY_NAME, "wire_api": "responses"}
        if self._max_retries is not None:
            provider |= {"request_max_retries": self._max_retries,
                         "stream_max_retries": self._max_retries}
        ask = {"type": "mcp_tool", "server": SERVER_NAME, "tool": HOOK_TOOL,
               "input": {"tool_name": "${tool_name}", "command": "${tool_input.command}"}}
        stop = {"type": "command",
                "command": f"if test -e {shlex.quote(os.path.join(self.stop_dir, STOP_FILE))}; "
                           "then kill -INT $PPID; fi; exit 0"}
        overrides = {
            "model_provider": PROVIDER,
            f"model_providers.{PROVIDER}": provider,
            # Required: Codex's hooks let a call through when their MCP server cannot
            # be reached, so Codex must not start without it.
            f"mcp_servers.{SERVER_NAME}": {"url": self.mcp.url, "required": True},
            "hooks.PreToolUse": [{"hooks": [ask, stop]}],
            "web_search": "disabled",
            "otel.exporter": {"otlp-http": {"endpoint": self.mcp.logs_url,
                                            "protocol": "json"}},
            "otel.metrics_exporter": "none",
            "otel.trace_exporter": "none",
            "check_for_update_on_startup": False,
            "analytics.enabled": False,
            "developer_instructions": CLI_PROMPT,
        }
        argv = [self.install.executable, "exec", "--json", "--color", "never",
                "--skip-git-repo-check", "--ephemeral", "--ignore-user-config", "--ignore-rules",
                "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust",
                "--model", str(self.model)]
        for key, value in overrides.items():
            argv += ["-c", f"{key}={toml(value)}"]
        return [*argv, task_message(brief)]

    def environment(self, placeholder: str) -> dict[str, str]:
        # Where the proxy holds the key, the session's own placeholder for it
        # wins over this one (a command's env adds, never replaces).
        return {KEY_NAME: placeholder}

    def reading(self, tools: ProcessToolbelt) -> _Reading:
        return _Reading(tools=tools, pricing=self.pricing, model=self.model)

    def bind(self, tools: ProcessToolbelt) -> None:
        self.mcp.bind(read_docs=lambda url: page_text(tools.read_docs(url)),
                      permit_bash=lambda command: self._permit(tools, command),
                      logs=self._take_logs)

    def _take_logs(self, body: dict[str, Any]) -> None:
        for call in logged_calls(body):
            self._calls += 1
            cost = self.pricing.cost(TokenUsage(
                input_tokens=call.input_tokens, output_tokens=call.output_tokens,
                cached_tokens=call.cached_tokens,
                cache_write_tokens=call.cache_write_tokens)) if self.pricing else None
            self._logged_spend = None if cost is None or self._logged_spend is None \
                else self._logged_spend + cost
            if self._max_spend is not None and self._logged_spend is not None \
                    and self._logged_spend > self._max_spend:
                self.stop()
                raise BudgetExhausted(Budget.MAX_SPEND,
                                      f"codex's {self._calls} model calls cost "
                                      f"{self._logged_spend} of {self._max_spend}")

    def _permit(self, tools: ProcessToolbelt, command: str) -> None:
        # Each command Codex asks for follows a model turn, so the count of
        # calls reaches max_turns no later than the turns do (parallel calls
        # count one each).
        self._asked += 1
        if self._max_turns is not None and self._asked > self._max_turns:
            self.stop()
            raise BudgetExhausted(Budget.MAX_TURNS,
                                  f"codex asked for call {self._asked} past {self._max_turns}")
        try:
            tools.permit("bash", command)
        except BudgetExhausted:
            self.stop()
            raise

    def stop(self) -> None:
        """Have the CLI's stop hook interrupt it at its next call."""
        with open(os.path.join(self.stop_dir, STOP_FILE), "w", encoding="utf-8"):
            pass

    def run(self, brief: Brief, tools: ProcessToolbelt) -> AgentResult:  # type: ignore[override]
        self._max_turns = brief.budgets.max_turns
        self._max_spend = brief.max_spend
        try:
            return super().run(brief, tools)
        finally:
            shutil.rmtree(self.stop_dir, ignore_errors=True)

    def ending(self, reading: Reading, exit_code: int | None,
               stderr: str) -> tuple[AgentStop, str]:
        assert isinstance(reading, _Reading)
        if reading.failed is not None:
            return AgentStop.INFRA_ERROR, f"the model API failed: {reading.failed[:300]}"
        if exit_code != 0 or not reading.per_turn:
            return AgentStop.INFRA_ERROR, (f"codex ended (exit {exit_code}) without finishing its "
                                           f"turn: {stderr.strip()[-500:]}")
        return AgentStop.FINISHED, ""

    def usage(self, reading: Reading, brief: Brief) -> dict[str, Any]:
        usage = super().usage(reading, brief)
        assert isinstance(reading, _Reading)
        # Codex's stream reports usage only when its turn ends: an interrupted
        # turn's spend is unknown. What the model calls its log reported cost is
        # beside it, a floor (the log comes in batches, the last may be lost).
        if reading.open_turn:
            usage["spend"] = None
        usage["logged_spend"] = None if self._logged_spend is None else str(self._logged_spend)
        usage["calls_asked"] = self._asked
        usage["model_calls"] = self._calls
        return usage


class _Reading(Reading):
    def __init__(self, *, tools: ProcessToolbelt, pricing: Pricing | None,
                 model: str | None) -> None:
        super().__init__(tools=tools, pricing=pricing)
        self._parser = CodexStream()
        self._model = model
        self._calls: list[dict[str, Any]] = []
        self._text = ""
        self.failed: str | None = None
        # Something happened since the last completed turn (its usage is not in yet).
        self.open_turn = False

    @property
    def claim(self) -> str:
        # A turn cut short never completes: its last message is the report there is.
        return self._text or self.last_text

    def take(self, line: str) -> None:
        for item in self._parser.feed(line):
            self._take(item)

    def _take(self, item: Item) -> None:
        if isinstance(item, Command):
            self.open_turn = True
            self._calls.append({"name": "bash", "arguments": {"command": item.script}})
            self.tools.record_command(
                command=item.script, exit_code=item.exit_code if item.exit_code is not None else -1,
                stdout=item.output, stderr="")
        elif isinstance(item, McpCall):
            self.open_turn = True
            self._calls.append({"name": f"mcp__{item.server}__{item.tool}",
                                "arguments": item.arguments})
        elif isinstance(item, Message):
            self.open_turn = True
            self._text = item.text
        elif isinstance(item, TurnUsage):
            # One turn of the conversation: every model call it made, summed.
            self.turn(usage=TokenUsage(input_tokens=item.input_tokens,
                                       output_tokens=item.output_tokens,
                                       cached_tokens=item.cached_tokens,
                                       cache_write_tokens=item.cache_write_tokens),
                      model=self._model, text=self._text, tool_calls=self._calls,
                      stop=TurnStop.END, vendor_stop=None)
            self._calls, self._text, self.open_turn = [], "", False
        elif isinstance(item, Failed):
            self.failed = item.message


def make_codex(*, model: str | None = None, base_url: str | None = None,
               price_file: Mapping[str, FilePrice] | None = None,
               install: CliInstall | None = None, routes: Sequence[Route] = (),
               max_retries: int | None = None,
               environ: Mapping[str, str] | None = None) -> CodexAgent:
    """``--agent codex``; installs the pinned CLI into the cache first if need be.

    Its key: as ``held_key`` says (an ``https`` API needs one the harness holds).
    """
    from firstrun.agents.cli.install import ensure

    chosen = model or DEFAULT_MODEL
    url = base_url or DEFAULT_BASE_URL
    return CodexAgent(install=install or ensure(CODEX), model=chosen, base_url=url,
                      pricing=price_for(VENDOR, chosen, price_file), routes=routes,
                      max_retries=max_retries,
                      key_variable=held_key(VENDOR, agent="codex", base_url=url,
                                            environ=environ))
