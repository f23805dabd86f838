"""``--agent claude-code``: Claude Code itself, as one sandboxed process in the session.

Guarantee: a ``CliAgent`` (its guarantees hold) over the pinned install
``install.CLAUDE_CODE``. Every command it runs is first asked of the harness and
decided by the task's rules; its WebFetch reaches a docs host only as a page
read the proxy serves (WebSearch, run by the vendor, is refused), so every page
it saw is a ``docs_read``; its ``stream-json`` is read by ``claude_stream``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from firstrun.agents.base import AgentStop, Brief
from firstrun.agents.cli.agent import CliAgent, Reading, held_key
from firstrun.agents.cli.claude_stream import ClaudeStream, Final, Init, Item, ToolOutcome, Turn
from firstrun.agents.cli.frame import ProcessToolbelt, Route
from firstrun.agents.cli.harness_mcp import APPROVE_TOOL, READ_DOCS_TOOL, SERVER_NAME
from firstrun.agents.cli.install import CLAUDE_CODE, CliInstall
from firstrun.agents.prompt import cli_prompt, task_message
from firstrun.agents.spend import FilePrice, Pricing, price_for
from firstrun.agents.vendor import TokenUsage, TurnStop

VENDOR = "anthropic"
# The variable the CLI reads its key from; inside, it only ever holds a placeholder.
KEY_NAME = "ANTHROPIC_API_KEY"
DEFAULT_MODEL = "claude-sonnet-4-5"
DEFAULT_BASE_URL = "https://api.anthropic.com"
CLI_PROMPT = cli_prompt(f"{READ_DOCS_TOOL} tool")

_STOPS = {"end_turn": TurnStop.END, "stop_sequence": TurnStop.END,
          "tool_use": TurnStop.TOOL_USE, "max_tokens": TurnStop.MAX_OUTPUT,
          "refusal": TurnStop.REFUSAL, "pause_turn": TurnStop.PAUSED,
          "model_context_window_exceeded": TurnStop.CONTEXT_FULL}
# How the CLI's result line says a budget it was told ended the run.
_BUDGET_ENDS = {"error_max_turns": "max_turns", "error_max_budget_usd": "max_spend"}


class ClaudeCodeAgent(CliAgent):
    name = "claude-code"
    vendor = VENDOR
    key_name = KEY_NAME
    # The Messages API (and its token counting) is POSTs under /v1/.
    api_path = "/v1/"
    # WebFetch fetches from the CLI's own process, then has a small model read the page.
    web_fetch = True

    def argv(self, brief: Brief) -> list[str]:
        # Print mode with the task message. Docs come from the harness's
        # read_docs over MCP, or from WebFetch, whose fetch of a docs host the
        # proxy answers from the same reader; WebSearch (run on the vendor's side,
        # out of the record's reach) is refused. So every page the agent saw is a
        # docs_read. Its permission prompts go to the
        # harness (--permission-prompt-tool). Budgets: turns through --max-turns,
        # spend through --max-budget-usd (the run's --max-spend share); wall
        # seconds are the session's timeout, which ends the CLI's whole tree.
        mcp = {"mcpServers": {SERVER_NAME: {"type": "http", "url": self.mcp.url}}}
        # Every command is asked for, so the task's rules see each one, the
        # read-only ones the CLI would otherwise run unasked included.
        # WebFetch's preflight would ask the vendor whether the docs host may be
        # fetched: the task's route already says so.
        settings = {"permissions": {"ask": ["Bash"], "deny": [
                        "WebSearch", *(() if self.fetches_pages else ("WebFetch",))]},
                    "skipWebFetchPreflight": True}
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

    def reading(self, tools: ProcessToolbelt) -> _Reading:
        return _Reading(tools=tools, pricing=self.pricing)

    def ending(self, reading: Reading, exit_code: int | None,
               stderr: str) -> tuple[AgentStop, str]:
        assert isinstance(reading, _Reading)
        return ending(reading.final, exit_code, stderr)


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


class _Reading(Reading):
    def __init__(self, *, tools: ProcessToolbelt, pricing: Pricing | None) -> None:
        super().__init__(tools=tools, pricing=pricing)
        self._parser = ClaudeStream()
        self.final: Final | None = None

    @property
    def claim(self) -> str:
        return self.final.result if self.final is not None else self.last_text

    def take(self, line: str) -> None:
        for item in self._parser.feed(line):
            self._take(item)

    def _take(self, item: Item) -> None:
        if isinstance(item, Init):
            self.version = item.version
        elif isinstance(item, Turn):
            self.turn(usage=TokenUsage(input_tokens=item.input_tokens,
                                       output_tokens=item.output_tokens,
                                       cached_tokens=item.cached_tokens,
                                       cache_write_tokens=item.cache_write_tokens),
                      model=item.model, text=item.text, tool_calls=item.tool_calls,
                      stop=_STOPS.get(item.vendor_stop or "", TurnStop.OTHER),
                      vendor_stop=item.vendor_stop)
        elif isinstance(item, ToolOutcome) and item.name == "Bash" and item.ran:
            self.tools.record_command(
                command=str(item.arguments.get("command", "")),
                exit_code=item.exit_code if item.exit_code is not None else -1,
                stdout=item.stdout if item.stdout is not None else item.content,
                stderr=item.stderr or "")
        elif isinstance(item, Final):
            self.final = item


def make_claude_code(*, model: str | None = None, base_url: str | None = None,
                     price_file: Mapping[str, FilePrice] | None = None,
                     install: CliInstall | None = None, routes: Sequence[Route] = (),
                     max_retries: int | None = None,
                     environ: Mapping[str, str] | None = None) -> ClaudeCodeAgent:
    """``--agent claude-code``; installs the pinned CLI into the cache first if need be.

    Its key: as ``held_key`` says (an ``https`` API needs one the harness holds).
    """
    from firstrun.agents.cli.install import ensure

    chosen = model or DEFAULT_MODEL
    url = base_url or DEFAULT_BASE_URL
    return ClaudeCodeAgent(install=install or ensure(CLAUDE_CODE), model=chosen, base_url=url,
                           pricing=price_for(VENDOR, chosen, price_file), routes=routes,
                           max_retries=max_retries,
                           key_variable=held_key(VENDOR, agent="claude-code", base_url=url,
                                                 environ=environ))
