"""The harness's MCP server for an agent CLI: ``read_docs``, and its permission prompts.

Guarantee: the CLI inside the sandbox reaches this server only through the
egress proxy (a recorded override routes ``HARNESS_HOST`` to its loopback port),
and every call it serves goes through the run's toolbelt, so a page read through
it is a ``docs_read`` and an asked permission a ``permission`` event, held to the
wall budget and the permission rules like any agent's. Once a budget runs out or
the sweep stops inside a call, that is kept in ``ended`` and every call errors.
It listens on the one host address it is given, where that proxy reaches it,
and answers only at a path no one but the CLI is told.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

from firstrun.agents.base import BudgetExhausted, CallRefused
from firstrun.agents.cli.frame import LOOPBACK

HARNESS_HOST = "harness.firstrun.internal"
SERVER_NAME = "firstrun"
READ_DOCS_TOOL = f"mcp__{SERVER_NAME}__read_docs"
APPROVE_TOOL = f"mcp__{SERVER_NAME}__approve"
# The CLI's web tools that fetch out of the record's reach (on the vendor's side).
# Its own fetch (WebFetch) goes through the proxy, which serves a docs host's
# pages as page reads and decides any other host as it would a command's fetch.
_WEB_TOOLS = frozenset({"WebSearch"})
# The MCP tool Codex's PreToolUse hook calls (a hook names server and tool apart).
HOOK_TOOL = "pre_tool_use"
# Where a CLI's OpenTelemetry logs are posted (OTLP/HTTP JSON), for one that reports
# each model call's usage only there; under the server's own secret path.
LOGS_PATH = "/v1/logs"


class HarnessMcp:
    """Serves on ``host`` (loopback unless the run's proxy is a backend's own, which
    cannot reach the host's loopback); ``bind`` hands it the run's calls before the CLI starts.

    ``read_docs(url) -> str`` returns the page as the agent should see it
    (raising ``BudgetExhausted``/``CallRefused`` like the toolbelt);
    ``permit_bash(command)`` raises ``CallRefused`` for a refused command.
    """

    def __init__(self, host: str = LOOPBACK) -> None:
        self.host = host
        self._read: Callable[[str], str] | None = None
        self._permit: Callable[[str], None] | None = None
        self._logs: Callable[[dict[str, Any]], None] | None = None
        self.ended: BaseException | None = None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self.port: int = self._sock.getsockname()[1]
        # On docker the address is the bridge's gateway, which other containers
        # on the host reach too: a caller that was not told this path cannot
        # read pages into the run's record or answer its prompts.
        self.path = f"/mcp/{secrets.token_urlsafe(18)}"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{HARNESS_HOST}:{self.port}{self.path}"

    @property
    def logs_url(self) -> str:
        return f"http://{HARNESS_HOST}:{self.port}{self.logs_path}"

    @property
    def logs_path(self) -> str:
        return f"{self.path}{LOGS_PATH}"

    def bind(self, *, read_docs: Callable[[str], str], permit_bash: Callable[[str], None],
             logs: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``logs`` takes each OTLP JSON body posted to ``logs_url`` (none are taken without)."""
        self._read, self._permit, self._logs = read_docs, permit_bash, logs

    def end(self, exc: BaseException) -> None:
        """End the run's calls from outside one (a budget the CLI's logs spent)."""
        if self.ended is None:
            self.ended = exc

    # The agent reads ``ended`` once the CLI is done: a spent budget ends the run
    # as the toolbelt's would, anything else is raised again. ``refused`` words
    # an error as the caller's answer (a hook's must still be a refusal).
    def _call(self, action: Callable[[], str],
              refused: Callable[[str], str] = lambda message: message) -> str:
        if self.ended is not None:
            return refused(f"error: {self.ended}")
        try:
            return action()
        except CallRefused as exc:
            return refused(exc.message)
        except BudgetExhausted as exc:
            self.ended = exc
            return refused(f"error: budget {exc.budget} spent: {exc.detail}")
        except BaseException as exc:  # a stopped sweep (RunInterrupted) and harness faults
            self.ended = exc
            return refused("error: the run is over")

    def read_docs(self, url: str) -> str:
        def read() -> str:
            assert self._read is not None
            return self._read(url)
        return self._call(read)

    # Answers the CLI's own permission prompts unattended: a command is decided
    # by the task's rules for ``bash``; the web tools that fetch out of reach
    # are refused (pages come as page reads, where they are recorded); the
    # fetch and file tools are allowed,
    # since the sandbox bounds what they can touch.
    def approve(self, tool_name: str, input: dict[str, Any]) -> str:  # noqa: A002 (CLI's name)
        def decide() -> str:
            if tool_name in _WEB_TOOLS:
                return json.dumps({"behavior": "deny", "message":
                                   f"{tool_name} is not available here; read pages with "
                                   f"{READ_DOCS_TOOL}"})
            if tool_name == "Bash":
                assert self._permit is not None
                try:
                    self._permit(str(input.get("command", "")))
                except CallRefused as exc:
                    return json.dumps({"behavior": "deny", "message": exc.message})
            return json.dumps({"behavior": "allow", "updatedInput": input})
        return self._call(decide)

    # Codex's PreToolUse hook, asked before every tool call it runs: a shell
    # command is decided by the task's rules for ``bash``; its other tools
    # (file edits, a running command's stdin) are allowed, as ``approve``
    # allows the file tools. Every answer that is not an allow is a deny, so a
    # spent budget or a stopped run refuses the call too.
    def pre_tool_use(self, tool_name: str, command: str = "") -> str:
        def deny(reason: str) -> str:
            return json.dumps({"hookSpecificOutput": {
                "hookEventName": "PreToolUse", "permissionDecision": "deny",
                "permissionDecisionReason": reason or "refused"}})

        def decide() -> str:
            if tool_name == "Bash":
                assert self._permit is not None
                self._permit(command)
            return "{}"
        return self._call(decide, refused=deny)

    async def _take_logs(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({}, status_code=400)
        if isinstance(body, dict) and self._logs is not None:
            try:
                self._logs(body)
            except BudgetExhausted as exc:
                self.end(exc)
        return JSONResponse({})

    def __enter__(self) -> HarnessMcp:
        import uvicorn
        from mcp.server.mcpserver import MCPServer
        from mcp.server.transport_security import TransportSecuritySettings

        # No subscriptions: these tools never change, so there is nothing to
        # listen for, and a client's listen stream (Claude Code opens one when
        # it is offered) outlived the CLI: the proxy holds a stream whose client
        # closed until a write to it fails, and this server's exit waited for
        # it, some 45 s of keepalive pings after every run.
        server = MCPServer(name=SERVER_NAME, subscriptions=False)
        server.tool(name="read_docs", description=(
            "Read one documentation page (its URL) and get it as markdown. The only way to "
            "read the docs here."), structured_output=False)(self.read_docs)
        server.tool(name="approve", description=(
            "Answers permission prompts for this run; not for the model."),
            # The CLI takes the answer as exactly one text block.
            structured_output=False)(self.approve)
        server.tool(name=HOOK_TOOL, description=(
            "Answers Codex's PreToolUse hooks for this run; not for the model."),
            structured_output=False)(self.pre_tool_use)
        app = server.streamable_http_app(
            streamable_http_path=self.path, json_response=True, stateless_http=True,
            transport_security=TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=[f"{HARNESS_HOST}:{self.port}"]))
        if self._logs is not None:
            app.add_route(self.logs_path, self._take_logs, methods=["POST"])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
        sock = self._sock
        # Listening before the thread starts: a CLI that connects first waits in the backlog.
        sock.listen(16)
        self._thread = threading.Thread(target=lambda: self._server.run(sockets=[sock]),
                                        name="firstrun-harness-mcp", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self.close()

    def close(self) -> None:
        """Release the port of a server never entered (or entered and left)."""
        self._sock.close()
