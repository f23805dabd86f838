"""``--agent claude-code``: Claude Code itself, as one sandboxed process in the session.

Guarantee: the CLI is the pinned install (``install.CLAUDE_CODE``), lent
read-only and run through the toolbelt, so it and every child it starts are
under the session's backend, layers and egress proxy. It never holds the API
key, reads docs only through the harness (each page a ``docs_read``), has every
command decided by the task's rules, and its stream becomes firstrun's events
as it arrives: each model turn with tokens and spend, each command, the report.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from firstrun.agents.base import AgentResult, AgentStop, Brief, BudgetExhausted, TurnRecord
from firstrun.agents.cli.claude_stream import ClaudeStream, Final, Init, Item, ToolOutcome, Turn
from firstrun.agents.cli.frame import Needs, ProcessToolbelt, Route
from firstrun.agents.cli.harness_mcp import (
    APPROVE_TOOL,
    HARNESS_HOST,
    READ_DOCS_TOOL,
    SERVER_NAME,
    HarnessMcp,
)
from firstrun.agents.cli.install import CLAUDE_CODE, CliInstall
from firstrun.agents.keys import KEY_VARIABLES, require_key
from firstrun.agents.loop import page_text
from firstrun.agents.prompt import task_message
from firstrun.agents.spend import FilePrice, Pricing, price_for
from firstrun.agents.vendor import TokenUsage, TurnStop

VENDOR = "anthropic"
# The variable the CLI reads its key from; inside, it only ever holds a placeholder.
KEY_NAME = "ANTHROPIC_API_KEY"
DEFAULT_MODEL = "claude-sonnet-4-5"
DEFAULT_BASE_URL = "https://api.anthropic.com"
# What firstrun adds to the CLI's own system prompt; its version is recorded.
CLI_PROMPT_VERSION = "cli-1"
CLI_PROMPT = f"""\
You are a developer trying a project for the first time by following its documentation.
Your shell is sandboxed and cannot reach the documentation hosts; read documentation pages \
with the {READ_DOCS_TOOL} tool, the only way to them here. Work only from the documentation, \
not from anything you already know about this project. When the goal is reached, or you are \
sure it cannot be reached from these docs, stop and reply with a short final report: what \
you did, whether the goal is reached, and where the docs were missing or wrong."""

_STOPS = {"end_turn": TurnStop.END, "stop_sequence": TurnStop.END,
          "tool_use": TurnStop.TOOL_USE, "max_tokens": TurnStop.MAX_OUTPUT,
          "refusal": TurnStop.REFUSAL, "pause_turn": TurnStop.PAUSED,
          "model_context_window_exceeded": TurnStop.CONTEXT_FULL}
# How the CLI's result line says a budget it was told ended the run.
_BUDGET_ENDS = {"error_max_turns": "max_turns", "error_max_budget_usd": "max_spend"}


class ClaudeCodeAgent:
    name = "claude-code"

    def __init__(self, *, install: CliInstall, model: str, base_url: str,
                 pricing: Pricing | None, routes: Sequence[Route] = (),
                 max_retries: int | None = None, key_variable: str | None = None) -> None:
        self.install = install
        self.model: str | None = model
        self.base_url = base_url
        self.pricing = pricing
        self._routes = tuple(routes)
        self._max_retries = max_retries
        # Where the harness holds the key; None: no key is put into requests (a
        # plain-HTTP test server takes the placeholder as it comes).
        self._key_variable = key_variable
        # Made when the run first asks for it: an agent built only to check the
        # flags (the sweep does that once, up front) holds no port.
        self._server: HarnessMcp | None = None

    @property
    def _mcp(self) -> HarnessMcp:
        if self._server is None:
            self._server = HarnessMcp()
        return self._server

    @property
    def key_held(self) -> bool:
        return self._key_variable is not None

    @property
    def version(self) -> str:
        return self.install.pin.version

    def needs(self) -> Needs:
        api = urlsplit(self.base_url)
        host = f"{api.hostname}:{api.port}" if api.port is not None else str(api.hostname)
        return Needs(lend=(self.install.root,),
                     routes=(Route(host=HARNESS_HOST, port=self._mcp.port, address="127.0.0.1"),
                             *self._routes),
                     allow=(host,),
                     credentials=((KEY_NAME, host, self._key_variable),)
                     if self._key_variable is not None else (),
                     # The Messages API (and its token counting) is POSTs under /v1/,
                     # and so is every MCP call: an inspecting proxy refuses POSTs no
                     # rule names, on plain HTTP too.
                     methods=((host, ("POST",), "/v1/"),
                              (f"{HARNESS_HOST}:{self._mcp.port}", ("POST",), "/mcp")))

    def argv(self, brief: Brief) -> list[str]:
        """The CLI's command line for ``brief`` (pure but for the server's port)."""
        # Print mode with the task message. Docs come from the harness's
        # read_docs over MCP and the CLI's own web tools are refused, so every
        # page the agent saw is a docs_read; its permission prompts go to the
        # harness (--permission-prompt-tool). Budgets: turns through --max-turns,
        # spend through --max-budget-usd (the run's --max-spend share); wall
        # seconds are the session's timeout, which ends the CLI's whole tree.
        mcp = {"mcpServers": {SERVER_NAME: {"type": "http", "url": self._mcp.url}}}
        # Every command is asked for, so the task's rules see each one, the
        # read-only ones the CLI would otherwise run unasked included.
        settings = {"permissions": {"ask": ["Bash"], "deny": ["WebFetch", "WebSearch"]}}
        argv = [self.install.executable, "-p", task_message(brief),
                "--output-format", "stream-json", "--verbose", "--include-partial-messages",
                "--model", str(self.model), "--max-turns", str(brief.budgets.max_turns),
                "--mcp-config", json.dumps(mcp), "--strict-mcp-config",
                "--permission-prompt-tool", APPROVE_TOOL,
                "--settings", json.dumps(settings),
                "--append-system-prompt", CLI_PROMPT]
        if brief.max_spend is not None:
            argv += ["--max-budget-usd", str(brief.max_spend)]
        return argv

    def environment(self, placeholder: str) -> dict[str, str]:
        # Where the proxy holds the key, the session's own placeholder for it
        # wins over this one (a command's env adds, never replaces).
        env = {"ANTHROPIC_BASE_URL": self.base_url, KEY_NAME: placeholder,
               # No telemetry, error reports, update checks or other side traffic.
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
        if self._max_retries is not None:
            env["CLAUDE_CODE_MAX_RETRIES"] = str(self._max_retries)
        return env

    def run(self, brief: Brief, tools: ProcessToolbelt) -> AgentResult:  # type: ignore[override]
        reading = _Reading(tools=tools, pricing=self.pricing)

        def read_docs(url: str) -> str:
            return page_text(tools.read_docs(url))

        self._mcp.bind(read_docs=read_docs, permit_bash=lambda c: tools.permit("bash", c))
        # The CLI's credential: a fresh placeholder, never the key (see the README).
        # The real key stays with the proxy, which puts it into the CLI's requests
        # to the API host alone; it must decrypt them for that (--inspect-tls).
        placeholder = f"firstrun-anthropic-{secrets.token_hex(16)}"
        stop: AgentStop | None = None
        detail = ""
        with self._mcp:
            try:
                result = tools.run_process(self.argv(brief), env=self.environment(placeholder),
                                           on_output=reading.feed)
            except BudgetExhausted as exc:
                stop, detail, result = AgentStop.BUDGET_EXHAUSTED, f"{exc.budget}: {exc.detail}", None
        reading.flush()
        ended = self._mcp.ended
        if isinstance(ended, BudgetExhausted):
            stop, detail = AgentStop.BUDGET_EXHAUSTED, f"{ended.budget}: {ended.detail}"
        elif ended is not None:
            raise ended
        final = reading.final
        if stop is None:
            stop, detail = ending(final, result.exit_code if result is not None else None,
                                   result.stderr.text() if result is not None else "")
        return AgentResult(stop=stop, turns=reading.turns,
                           claim=final.result if final is not None else reading.last_text,
                           detail=detail, usage=self._usage(reading, brief))

    def _usage(self, reading: _Reading, brief: Brief) -> dict[str, Any]:
        turns = reading.per_turn
        return {
            "vendor": VENDOR, "model": self.model,
            "served_models": sorted({t["model"] for t in turns if t.get("model")}),
            "prompt_version": CLI_PROMPT_VERSION,
            "agent_cli": {"name": self.name, "package": self.install.pin.package,
                          "version": reading.version or self.version},
            "turns": len(turns), "per_turn": turns,
            "input_tokens": sum(t["input_tokens"] for t in turns),
            "output_tokens": sum(t["output_tokens"] for t in turns),
            "cached_tokens": sum(t["cached_tokens"] for t in turns),
            "spend": None if reading.spend is None else str(reading.spend),
            "currency": "USD",
            "price_source": None if self.pricing is None else self.pricing.source,
            "max_spend": None if brief.max_spend is None else str(brief.max_spend),
        }


def ending(final: Final | None, exit_code: int | None, stderr: str) -> tuple[AgentStop, str]:
    """Why the agent stopped, from the CLI's result line (None: it wrote none) and its exit."""
    if final is None:
        return AgentStop.INFRA_ERROR, (f"claude-code ended (exit {exit_code}) without a result: "
                                       f"{stderr.strip()[-500:]}")
    budget = _BUDGET_ENDS.get(final.subtype)
    if budget is not None:
        return AgentStop.BUDGET_EXHAUSTED, f"{budget}: claude-code stopped ({final.subtype})"
    if final.terminal_reason == "api_error" or final.api_error_status is not None:
        return AgentStop.INFRA_ERROR, (f"the model API failed (status {final.api_error_status}): "
                                       f"{final.result[:300]}")
    if final.is_error or final.subtype != "success":
        return AgentStop.INFRA_ERROR, f"claude-code ended with {final.subtype}: {final.result[:300]}"
    return AgentStop.FINISHED, ""


class _Reading:
    """The stream as it arrives: lines to items, items to the toolbelt's records."""

    def __init__(self, *, tools: ProcessToolbelt, pricing: Pricing | None) -> None:
        self._tools = tools
        self._pricing = pricing
        self._parser = ClaudeStream()
        self._buffer = b""
        self.final: Final | None = None
        self.version: str | None = None
        self.per_turn: list[dict[str, Any]] = []
        self.spend: Decimal | None = Decimal(0) if pricing is not None else None
        self.last_text = ""

    @property
    def turns(self) -> int:
        return len(self.per_turn)

    def feed(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            for item in self._parser.feed(line.decode("utf-8", errors="replace")):
                self._take(item)

    def flush(self) -> None:
        if self._buffer:
            line, self._buffer = self._buffer, b""
            for item in self._parser.feed(line.decode("utf-8", errors="replace")):
                self._take(item)

    def _take(self, item: Item) -> None:
        if isinstance(item, Init):
            self.version = item.version
        elif isinstance(item, Turn):
            self._turn(item)
        elif isinstance(item, ToolOutcome) and item.name == "Bash" and item.ran:
            self._tools.record_command(
                command=str(item.arguments.get("command", "")),
                exit_code=item.exit_code if item.exit_code is not None else -1,
                stdout=item.stdout if item.stdout is not None else item.content,
                stderr=item.stderr or "")
        elif isinstance(item, Final):
            self.final = item

    def _turn(self, turn: Turn) -> None:
        usage = TokenUsage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens,
                           cached_tokens=turn.cached_tokens,
                           cache_write_tokens=turn.cache_write_tokens)
        cost = self._pricing.cost(usage) if self._pricing is not None else None
        self.spend = None if cost is None or self.spend is None else self.spend + cost
        counts = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "cached_tokens": usage.cached_tokens,
                  "cache_write_tokens": usage.cache_write_tokens}
        self.per_turn.append({**counts, "model": turn.model,
                              "spend": None if cost is None else str(cost)})
        if turn.text:
            self.last_text = turn.text
        stop = _STOPS.get(turn.vendor_stop or "", TurnStop.OTHER)
        self._tools.record_turn(TurnRecord(
            turn=len(self.per_turn), text=turn.text, tool_calls=turn.tool_calls,
            stop=stop.value, vendor_stop=turn.vendor_stop, usage=counts,
            spend=None if cost is None else str(cost)))


def make_claude_code(*, model: str | None = None, base_url: str | None = None,
                     price_file: Mapping[str, FilePrice] | None = None,
                     install: CliInstall | None = None, routes: Sequence[Route] = (),
                     max_retries: int | None = None,
                     environ: Mapping[str, str] | None = None) -> ClaudeCodeAgent:
    """``--agent claude-code``; installs the pinned CLI into the cache first if need be.

    An ``https`` API takes the key: the harness must hold one (``UsageError``
    naming the variables otherwise), and the proxy puts it into the CLI's
    requests to that host. A plain ``http`` one (a test server) gets none.
    """
    from firstrun.agents.cli.install import ensure

    chosen = model or DEFAULT_MODEL
    url = base_url or DEFAULT_BASE_URL
    key_variable = None
    if urlsplit(url).scheme == "https":
        require_key(VENDOR, agent="claude-code", environ=environ)
        env = os.environ if environ is None else environ
        key_variable = next(n for n in KEY_VARIABLES[VENDOR] if env.get(n, "").strip())
    return ClaudeCodeAgent(install=install or ensure(CLAUDE_CODE), model=chosen, base_url=url,
                           pricing=price_for(VENDOR, chosen, price_file), routes=routes,
                           max_retries=max_retries, key_variable=key_variable)
