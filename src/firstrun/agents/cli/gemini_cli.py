"""``--agent gemini-cli``: Google's Gemini CLI itself, as one sandboxed process in the session.

Guarantee: a ``CliAgent`` (its guarantees hold) over the pinned install
``install.GEMINI_CLI``, configured only inside the session's own home. Every
command it runs is first decided by the task's rules through its ``BeforeTool``
hook; its web tools are off, so every page it saw is a ``docs_read``; each model
turn is priced from the tokens its transcript reports, and a spent ``--max-spend``
stops it before its next model call. Its ``stream-json`` is read by ``gemini_stream``.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from firstrun.agents.base import (
    AgentResult,
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    CallRefused,
    TurnRecord,
)
from firstrun.agents.cli.agent import CliAgent, Reading, held_key
from firstrun.agents.cli.frame import LOOPBACK, Needs, ProcessToolbelt, Route
from firstrun.agents.cli.gemini_hooks import HookServer, hook_settings
from firstrun.agents.cli.gemini_stream import (
    Asked,
    Final,
    GeminiStream,
    Init,
    Item,
    ToolOutcome,
    Turn,
)
from firstrun.agents.cli.harness_mcp import HARNESS_HOST, SERVER_NAME
from firstrun.agents.cli.install import GEMINI_CLI, CliInstall
from firstrun.agents.cli.lines import count
from firstrun.agents.prompt import cli_prompt, task_message
from firstrun.agents.spend import FilePrice, Pricing, price_for
from firstrun.agents.vendor import TokenUsage, TurnStop
from firstrun.errors import SandboxUnavailable

# genai-prices files Gemini's prices under "google"; keys.py reads GEMINI_* keys.
VENDOR = "google"
KEYS = "gemini"
KEY_NAME = "GEMINI_API_KEY"
DEFAULT_MODEL = "gemini-3.8-flash"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
SHELL_TOOL = "run_shell_command"
# The CLI names an MCP server's tool mcp_<server>_<tool>.
READ_DOCS_TOOL = f"mcp_{SERVER_NAME}_read_docs"
# Given to the CLI as its global memory (GEMINI.md).
CLI_PROMPT = cli_prompt(f"{READ_DOCS_TOOL} tool")
# Writes the settings and the memory into the session's home, then becomes the CLI:
# nothing of the user's own home is read or written.
_SETUP = ('mkdir -p "$HOME/.gemini" && printf \'%s\' "$1" > "$HOME/.gemini/settings.json" '
          '&& printf \'%s\\n\' "$2" > "$HOME/.gemini/GEMINI.md" && shift 2 && exec "$@"')
# How long a command's hook waits for the stream to show the call (it was
# written before the hook started; this covers a slow reader).
_CATCH_UP_S = 10.0
# The shell tool's report to the model ends with the exit code when it is not 0.
_EXIT = re.compile(r"^Exit Code: (-?\d+)$", re.MULTILINE)


def settings(*, mcp_url: str, hook_url: str, max_turns: int,
             max_retries: int | None, node: str = "node") -> dict[str, Any]:
    """The CLI's settings.json for one run (pure)."""
    general: dict[str, Any] = {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                               "checkpointing": {"enabled": False}}
    if max_retries is not None:
        general["maxAttempts"] = max(1, min(10, max_retries + 1))
    return {
        # The key comes from GEMINI_API_KEY (a placeholder); the API from
        # GOOGLE_GEMINI_BASE_URL. Named here, since the CLI otherwise takes a
        # base URL to mean a key-less gateway it refuses in headless mode.
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        # No usage statistics, telemetry, update checks or its own sandbox: the
        # session is the sandbox, and no side traffic leaves it.
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": general,
        # Its web tools would read pages outside the record; read_docs is the way.
        # Its sub-agents' turns are in neither its stream nor its transcript, so
        # they could be neither recorded nor priced: they are off, and so is their tool.
        "tools": {"sandbox": False,
                  "exclude": ["web_fetch", "google_web_search", "invoke_agent"]},
        "experimental": {"enableAgents": False},
        "model": {"maxSessionTurns": max_turns},
        "mcpServers": {SERVER_NAME: {"httpUrl": mcp_url, "trust": True,
                                     # approve answers Claude Code's prompts; the hooks do it here.
                                     "includeTools": ["read_docs"]}},
        "hooks": hook_settings(hook_url, node),
    }


def exit_code(report: str) -> int:
    """A command's exit code from the shell tool's report to the model (0 when it says none)."""
    # The last: the command's own output, above it, may hold such a line too.
    found = _EXIT.findall(report)
    return int(found[-1]) if found else 0


class GeminiCliAgent(CliAgent):
    name = "gemini-cli"
    vendor = VENDOR
    key_name = KEY_NAME
    # generateContent and streamGenerateContent are POSTs under /v1beta/.
    api_path = "/v1beta/"

    def __init__(self, *, node: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The node it runs on, lent with it (``install.ensure_node``); None: the
        # session's own ``node`` on PATH, which only the host's view has.
        self.node = node
        self._hook_server: HookServer | None = None
        self._max_spend: Decimal | None = None

    @property
    def hooks(self) -> HookServer:
        if self._hook_server is None:
            self._hook_server = HookServer()
        return self._hook_server

    def needs(self, serve_at: str = LOOPBACK) -> Needs:
        if serve_at != LOOPBACK and self.node is None:
            # Behind a backend's own proxy the commands run in a container image,
            # whose node (if any) is not one firstrun lent.
            raise SandboxUnavailable(
                "--agent gemini-cli has no node lent to it, and this backend's container "
                "does not see the host's", who="agents", fix="use --backend linux or gvisor")
        base = super().needs(serve_at)
        if self._hook_server is None or self._hook_server.host != serve_at:
            # Where the backend's proxy reaches harness services, as the MCP server.
            if self._hook_server is not None:
                self._hook_server.close()
            self._hook_server = HookServer(serve_at)
        hook = f"{HARNESS_HOST}:{self.hooks.port}"
        lend = base.lend if self.node is None else (*base.lend, os.path.dirname(self.node))
        return Needs(lend=lend, allow=base.allow, credentials=base.credentials,
                     routes=(*base.routes,
                             Route(host=HARNESS_HOST, port=self.hooks.port, address=serve_at)),
                     methods=(*base.methods, (hook, ("POST",), self.hooks.path)))

    def argv(self, brief: Brief) -> list[str]:
        # Headless mode with the task message. Approvals are off (yolo) because
        # the BeforeTool hook decides every command by the task's rules instead;
        # budgets: turns through maxSessionTurns, spend through the BeforeModel
        # hook, wall seconds through the session's timeout.
        node = self.node or "node"
        config = settings(mcp_url=self.mcp.url, hook_url=self.hooks.url,
                          max_turns=brief.budgets.max_turns, max_retries=self._max_retries,
                          node=node)
        return ["/bin/sh", "-c", _SETUP, "gemini", json.dumps(config), CLI_PROMPT,
                node, self.install.executable, "-p", task_message(brief),
                "--output-format", "stream-json", "--approval-mode", "yolo",
                "--model", str(self.model)]

    def environment(self, placeholder: str) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": self.base_url, KEY_NAME: placeholder,
                # The session's workspace is the one it works in.
                "GEMINI_CLI_TRUST_WORKSPACE": "true",
                # One process: no relaunch of itself with a larger heap.
                "GEMINI_CLI_NO_RELAUNCH": "true"}

    def reading(self, tools: ProcessToolbelt) -> _Reading:
        reading = _Reading(tools=tools, pricing=self.pricing, max_spend=self._max_spend)
        self.hooks.bind(reading.answer)
        return reading

    def run(self, brief: Brief, tools: ProcessToolbelt) -> AgentResult:  # type: ignore[override]
        self._max_spend = brief.max_spend
        with self.hooks:
            return super().run(brief, tools)

    def ending(self, reading: Reading, exit_code: int | None,
               stderr: str) -> tuple[AgentStop, str]:
        assert isinstance(reading, _Reading)
        if isinstance(reading.ended, BudgetExhausted):
            return AgentStop.BUDGET_EXHAUSTED, f"{reading.ended.budget}: {reading.ended.detail}"
        if reading.ended is not None:
            raise reading.ended
        return ending(reading.final, exit_code, stderr)

    def usage(self, reading: Reading, brief: Brief) -> dict[str, Any]:
        record = super().usage(reading, brief)
        assert isinstance(reading, _Reading)
        final = reading.final
        # The CLI's own totals win: a turn whose tokens no hook saw has none per turn.
        if final is not None:
            record.update(input_tokens=final.usage.input_tokens,
                          output_tokens=final.usage.output_tokens,
                          cached_tokens=final.usage.cached_tokens)
        return record


def ending(final: Final | None, exit_code: int | None, stderr: str) -> tuple[AgentStop, str]:
    """Why the agent stopped, from the CLI's result line (None: it wrote none) and its exit."""
    if final is None:
        return AgentStop.INFRA_ERROR, (f"gemini-cli ended (exit {exit_code}) without a result: "
                                       f"{stderr.strip()[-500:]}")
    if final.error_type == "FatalTurnLimitedError":
        return AgentStop.BUDGET_EXHAUSTED, f"{Budget.MAX_TURNS}: gemini-cli stopped ({final.error_type})"
    if not final.ok:
        return AgentStop.INFRA_ERROR, (f"gemini-cli ended with {final.error_type}: "
                                       f"{final.error_message[:300]}")
    return AgentStop.FINISHED, ""


class _Reading(Reading):
    """The stream (turns, commands, the end) and the hooks (decisions, tokens, exit codes).

    The hooks answer on the harness's threads while the stream is read on the
    session's: both meet under ``_lock``. The CLI waits for each hook's answer,
    so what a hook reports is here before the stream line that follows it; and
    it writes each call to the stream before that call's hook, so a command's
    hook waits for the stream to show it, then ends its turn: the turn is in the
    record before the decision on its command.
    """

    def __init__(self, *, tools: ProcessToolbelt, pricing: Pricing | None,
                 max_spend: Decimal | None) -> None:
        super().__init__(tools=tools, pricing=pricing)
        self._parser = GeminiStream()
        self._max_spend = max_spend
        self._lock = threading.Lock()
        self._caught_up = threading.Condition(self._lock)
        # Shell calls the stream has shown, and shell hooks that have asked.
        self._shell_asked = 0
        self._shell_hooks = 0
        self.final: Final | None = None
        self.model: str | None = None
        # Each model turn's tokens, in turn order, as the CLI's transcript has them.
        self._reported: list[tuple[TokenUsage, str | None]] = []
        # Per command, the exit codes of its runs not yet matched to the stream.
        self._exits: dict[str, list[int]] = {}
        self.ended: BaseException | None = None

    # -- the stream

    def take(self, line: str) -> None:
        with self._lock:
            self._items(self._parser.feed(line))
            self._caught_up.notify_all()

    def _items(self, items: list[Item]) -> None:
        for item in items:
            if isinstance(item, Final):
                # The result line closes the last turn: its totals price it.
                self.final = item
        for item in items:
            if isinstance(item, Init):
                self.model = item.model
            elif isinstance(item, Asked) and item.name == SHELL_TOOL:
                self._shell_asked += 1
            elif isinstance(item, Turn):
                self._turn(item)
            elif isinstance(item, ToolOutcome) and item.name == SHELL_TOOL:
                self._command(item)

    def _turn(self, turn: Turn) -> None:
        usage, model = self._usage_of(len(self.per_turn))
        stop = TurnStop.TOOL_USE if turn.tool_calls else TurnStop.END
        calls = [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]}
                 for c in turn.tool_calls]
        if usage is not None:
            self.turn(usage=usage, model=model or self.model, text=turn.text,
                      tool_calls=calls, stop=stop, vendor_stop=None)
            return
        # No hook saw this turn end and no total covers it (its only calls were to
        # tools the CLI does not have): its tokens are unknown, in the trace as None
        # and here as 0 beside ``usage_known``; the run's totals are the CLI's own.
        self.per_turn.append({"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0,
                              "cache_write_tokens": 0, "model": self.model, "spend": None,
                              "usage_known": False})
        self.spend = None
        if turn.text:
            self.last_text = turn.text
        unknown: dict[str, int | None] = {"input_tokens": None, "output_tokens": None,
                                          "cached_tokens": None, "cache_write_tokens": None}
        self.tools.record_turn(TurnRecord(
            turn=len(self.per_turn), text=turn.text, tool_calls=tuple(calls), stop=stop.value,
            vendor_stop=None, usage=unknown, spend=None))

    def _usage_of(self, index: int) -> tuple[TokenUsage | None, str | None]:
        if index < len(self._reported):
            return self._reported[index]
        final = self.final
        if final is None or index != len(self._reported):
            return None, None
        # The last turn: the CLI's totals less every turn before it.
        before = self._reported[:index]
        return TokenUsage(
            input_tokens=final.usage.input_tokens - sum(u.input_tokens for u, _ in before),
            output_tokens=final.usage.output_tokens - sum(u.output_tokens for u, _ in before),
            cached_tokens=final.usage.cached_tokens - sum(u.cached_tokens for u, _ in before),
        ), None

    def _command(self, outcome: ToolOutcome) -> None:
        command = str(outcome.arguments.get("command", ""))
        runs = self._exits.get(command)
        # No AfterTool report: the command never ran (a rule refused it, or the
        # CLI turned the call down itself).
        if not runs:
            return
        self.tools.record_command(command=command, exit_code=runs.pop(0),
                                  stdout=outcome.output, stderr="")

    @property
    def claim(self) -> str:
        return self.last_text

    # -- the hooks

    def answer(self, hook: dict[str, Any]) -> dict[str, Any]:
        """One hook's output for its input (``firstrun_turns`` added by the relay)."""
        event = hook.get("hook_event_name")
        with self._lock:
            self._report(hook.get("firstrun_turns"))
            if event == "AfterTool":
                if hook.get("tool_name") == SHELL_TOOL:
                    response = hook.get("tool_response") or {}
                    command = str((hook.get("tool_input") or {}).get("command", ""))
                    self._exits.setdefault(command, []).append(
                        exit_code(str(response.get("llmContent") or "")))
                return {}
            if self.ended is not None:
                return _stop("the run is over")
            if event == "BeforeModel":
                return self._spend_check()
            if event != "BeforeTool" or hook.get("tool_name") != SHELL_TOOL:
                return {}
            self._shell_hooks += 1
            mine = self._shell_hooks
            # Bounded: a stream that never shows the call (a CLI change) must not
            # hang the CLI; its turn then ends at the call's result instead.
            self._caught_up.wait_for(lambda: self._shell_asked >= mine, timeout=_CATCH_UP_S)
            self._items(self._parser.close())
        return self._permit(str((hook.get("tool_input") or {}).get("command", "")))

    def _report(self, turns: Any) -> None:
        if not isinstance(turns, list) or len(turns) < len(self._reported):
            return
        self._reported = [
            (TokenUsage(input_tokens=count(t.get("input")),
                        # Thinking is billed as output.
                        output_tokens=count(t.get("output")) + count(t.get("thoughts")),
                        cached_tokens=count(t.get("cached"))),
             t.get("model") if isinstance(t.get("model"), str) else None)
            for t in turns if isinstance(t, dict)]

    def _spend_check(self) -> dict[str, Any]:
        if self._max_spend is None or self._pricing is None:
            return {}
        spent = Decimal(0)
        for n, (usage, _) in enumerate(self._reported, start=1):
            cost = self._pricing.cost(usage)
            if cost is None:
                self.ended = BudgetExhausted(Budget.MAX_SPEND, f"turn {n} has no price")
                return _stop(str(self.ended))
            spent += cost
        if spent >= self._max_spend:
            self.ended = BudgetExhausted(Budget.MAX_SPEND,
                                         f"spent {spent} of {self._max_spend} USD")
            return _stop(f"budget max_spend spent: {self.ended.detail}")
        return {}

    def _permit(self, command: str) -> dict[str, Any]:
        # Outside the lock: the decision is recorded through the toolbelt, which
        # may wait on the run.
        try:
            self.tools.permit("bash", command)
        except CallRefused as exc:
            return {"decision": "deny", "reason": exc.message}
        except BudgetExhausted as exc:
            with self._lock:
                self.ended = exc
            return _stop(f"budget {exc.budget} spent: {exc.detail}")
        except BaseException as exc:  # a stopped sweep (RunInterrupted) and harness faults
            with self._lock:
                self.ended = exc
            return _stop("the run is over")
        return {"decision": "allow"}


def _stop(reason: str) -> dict[str, Any]:
    """A hook's answer that ends the CLI's whole loop."""
    return {"continue": False, "stopReason": reason, "decision": "deny", "reason": reason}


def make_gemini_cli(*, model: str | None = None, base_url: str | None = None,
                    price_file: Mapping[str, FilePrice] | None = None,
                    install: CliInstall | None = None, routes: Sequence[Route] = (),
                    max_retries: int | None = None,
                    environ: Mapping[str, str] | None = None,
                    node: str | None = None) -> GeminiCliAgent:
    """``--agent gemini-cli``; installs the pinned CLI into the cache first if need be.

    Its key: as ``held_key`` says (an ``https`` API needs one the harness holds).
    ``node``: the node to lend it; by default the host's, copied into the cache.
    """
    from firstrun.agents.cli.install import ensure, ensure_node

    chosen = model or DEFAULT_MODEL
    url = base_url or DEFAULT_BASE_URL
    # A missing key is said before the CLI is downloaded.
    key_variable = held_key(KEYS, agent="gemini-cli", base_url=url, environ=environ)
    return GeminiCliAgent(install=install or ensure(GEMINI_CLI), model=chosen, base_url=url,
                          pricing=price_for(VENDOR, chosen, price_file), routes=routes,
                          max_retries=max_retries, key_variable=key_variable,
                          node=node or ensure_node())
