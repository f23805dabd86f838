"""What every agent CLI shares: one sandboxed process, read as it speaks, held to the run.

Guarantee: a ``CliAgent`` runs its pinned install through the toolbelt, so the
CLI and every child it starts are under the session's backend, layers and
egress proxy. It holds only a fresh placeholder for its key (the proxy puts the
real one into requests to the API host alone), reads docs only as page reads
(the harness's MCP server, or the proxy serving its own web fetch), and its
stream becomes firstrun's events as it arrives: each model turn with tokens
and spend, each command, the final report.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from firstrun.agents.base import AgentResult, AgentStop, Brief, BudgetExhausted, TurnRecord
from firstrun.agents.cli.frame import LOOPBACK, Needs, ProcessToolbelt, Route
from firstrun.agents.cli.harness_mcp import HARNESS_HOST, HarnessMcp
from firstrun.agents.cli.install import CliInstall
from firstrun.agents.keys import KEY_VARIABLES, require_key
from firstrun.agents.loop import page_text
from firstrun.agents.prompt import CLI_PROMPT_VERSION
from firstrun.agents.spend import Pricing
from firstrun.agents.vendor import TokenUsage, TurnStop


class Reading:
    """The CLI's stdout as it arrives: whole lines to ``take``, turns to the toolbelt.

    A CLI's reading parses its own stream in ``take`` and calls ``turn`` and
    ``tools.record_command`` as items complete; ``claim`` is its final report.
    """

    def __init__(self, *, tools: ProcessToolbelt, pricing: Pricing | None) -> None:
        self.tools = tools
        self._pricing = pricing
        self._buffer = b""
        # The version the CLI says it is, where its stream says so.
        self.version: str | None = None
        self.per_turn: list[dict[str, Any]] = []
        self.spend: Decimal | None = Decimal(0) if pricing is not None else None
        self.last_text = ""

    @property
    def turns(self) -> int:
        return len(self.per_turn)

    @property
    def claim(self) -> str:
        return self.last_text

    def take(self, line: str) -> None:
        raise NotImplementedError

    def feed(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self.take(line.decode("utf-8", errors="replace"))

    def flush(self) -> None:
        if self._buffer:
            line, self._buffer = self._buffer, b""
            self.take(line.decode("utf-8", errors="replace"))

    def turn(self, *, usage: TokenUsage, model: str | None, text: str,
             tool_calls: Sequence[dict[str, Any]], stop: TurnStop,
             vendor_stop: str | None) -> None:
        """Record one model turn, priced from its reported usage."""
        cost = self._pricing.cost(usage) if self._pricing is not None else None
        self.spend = None if cost is None or self.spend is None else self.spend + cost
        counts = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "cached_tokens": usage.cached_tokens,
                  "cache_write_tokens": usage.cache_write_tokens}
        self.per_turn.append({**counts, "model": model,
                              "spend": None if cost is None else str(cost)})
        if text:
            self.last_text = text
        self.tools.record_turn(TurnRecord(
            turn=len(self.per_turn), text=text, tool_calls=tuple(tool_calls),
            stop=stop.value, vendor_stop=vendor_stop, usage=counts,
            spend=None if cost is None else str(cost)))


class CliAgent:
    """One agent CLI; a subclass says how to start it and how to read it.

    Its class attributes: ``name`` (the ``--agent``), ``vendor`` (whose key and
    prices), ``key_name`` (the variable the CLI reads its key from; inside, it
    only ever holds a placeholder), ``prompt_version`` (what firstrun adds to
    the CLI's own prompt), ``api_path`` (where its API calls are POSTed),
    ``web_fetch`` (its own web-fetch tool fetches from inside the sandbox,
    so the proxy serves a docs host's pages to it as page reads).
    """

    name: str
    vendor: str
    key_name: str
    # What firstrun adds to the CLI's prompt (``prompt.cli_prompt``), recorded per run.
    prompt_version: str = CLI_PROMPT_VERSION
    api_path: str
    web_fetch: bool = False

    def __init__(self, *, install: CliInstall, model: str, base_url: str,
                 pricing: Pricing | None, routes: Sequence[Route] = (),
                 max_retries: int | None = None, key_variable: str | None = None) -> None:
        self.install = install
        self.fetches_pages = False
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
    def mcp(self) -> HarnessMcp:
        if self._server is None:
            self._server = HarnessMcp()
        return self._server

    def _serve_at(self, address: str) -> HarnessMcp:
        if self._server is not None and self._server.host != address:
            self._server.close()
            self._server = None
        if self._server is None:
            self._server = HarnessMcp(address)
        return self._server

    @property
    def key_held(self) -> bool:
        return self._key_variable is not None

    @property
    def version(self) -> str:
        return self.install.pin.version

    @property
    def api_host(self) -> str:
        api = urlsplit(self.base_url)
        return f"{api.hostname}:{api.port}" if api.port is not None else str(api.hostname)

    def needs(self, serve_at: str = LOOPBACK) -> Needs:
        """``serve_at``: the host address where the run's proxy reaches harness services."""
        host = self.api_host
        mcp = self._serve_at(serve_at)
        # Only the harness's own proxy (reached at loopback) holds the docs reader
        # that answers the CLI's fetches; behind a backend's own, its web fetch is
        # refused instead, so every page it saw is still a docs_read.
        self.fetches_pages = self.web_fetch and serve_at == LOOPBACK
        return Needs(lend=(self.install.root,),
                     routes=(Route(host=HARNESS_HOST, port=mcp.port, address=serve_at),
                             *self._routes),
                     allow=(host,),
                     credentials=((self.key_name, host, self._key_variable),)
                     if self._key_variable is not None else (),
                     # The API's calls are POSTs, and so is every MCP call: an
                     # inspecting proxy refuses POSTs no rule names, on plain HTTP too.
                     methods=((host, ("POST",), self.api_path),
                              (f"{HARNESS_HOST}:{mcp.port}", ("POST",), mcp.path)),
                     # The same read as the MCP server's read_docs: a page read, held
                     # to the budgets and the permission rules.
                     pages=mcp.read_docs if self.fetches_pages else None)

    def argv(self, brief: Brief) -> list[str]:
        """The CLI's command line for ``brief`` (pure but for the MCP server's port)."""
        raise NotImplementedError

    def environment(self, placeholder: str) -> dict[str, str]:
        """The CLI's variables beside the session's; ``placeholder`` stands for its key."""
        raise NotImplementedError

    def reading(self, tools: ProcessToolbelt) -> Reading:
        raise NotImplementedError

    def ending(self, reading: Reading, exit_code: int | None,
               stderr: str) -> tuple[AgentStop, str]:
        """Why the agent stopped, once the CLI has ended by itself."""
        raise NotImplementedError

    def bind(self, tools: ProcessToolbelt) -> None:
        """Hand the harness's MCP server the run's calls (see ``HarnessMcp.bind``)."""
        self.mcp.bind(read_docs=lambda url: page_text(tools.read_docs(url)),
                      permit_bash=lambda command: tools.permit("bash", command))

    def run(self, brief: Brief, tools: ProcessToolbelt) -> AgentResult:  # type: ignore[override]
        reading = self.reading(tools)
        self.bind(tools)
        # The CLI's credential: a fresh placeholder, never the key (see the README).
        # The real key stays with the proxy, which puts it into the CLI's requests
        # to the API host alone.
        placeholder = f"firstrun-{self.vendor}-{secrets.token_hex(16)}"
        stop: AgentStop | None = None
        detail = ""
        with self.mcp:
            try:
                result = tools.run_process(self.argv(brief), env=self.environment(placeholder),
                                           on_output=reading.feed)
            except BudgetExhausted as exc:
                stop, detail, result = AgentStop.BUDGET_EXHAUSTED, f"{exc.budget}: {exc.detail}", None
        reading.flush()
        ended = self.mcp.ended
        if isinstance(ended, BudgetExhausted):
            stop, detail = AgentStop.BUDGET_EXHAUSTED, f"{ended.budget}: {ended.detail}"
        elif ended is not None:
            raise ended
        if stop is None:
            stop, detail = self.ending(reading, result.exit_code if result is not None else None,
                                       result.stderr.text() if result is not None else "")
        return AgentResult(stop=stop, turns=reading.turns, claim=reading.claim,
                           detail=detail, usage=self.usage(reading, brief))

    def usage(self, reading: Reading, brief: Brief) -> dict[str, Any]:
        turns = reading.per_turn
        return {
            "vendor": self.vendor, "model": self.model,
            "served_models": sorted({t["model"] for t in turns if t.get("model")}),
            "prompt_version": self.prompt_version,
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


def held_key(vendor: str, *, agent: str, base_url: str,
             environ: Mapping[str, str] | None = None) -> str | None:
    """The variable the harness holds ``vendor``'s key in, for an ``https`` API.

    An ``https`` API takes the key: the harness must hold one (``UsageError``
    naming the variables otherwise), and the proxy puts it into the CLI's
    requests to that host. A plain ``http`` one (a test server) gets none.
    """
    if urlsplit(base_url).scheme != "https":
        return None
    require_key(vendor, agent=agent, environ=environ)
    env = os.environ if environ is None else environ
    return next(n for n in KEY_VARIABLES[vendor] if env.get(n, "").strip())
