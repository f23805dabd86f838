"""Codex, the real CLI from the npm registry, against a scripted Responses API server.

The CLI is installed once per test session from the registry (pinned by
integrity, as ``--agent codex`` installs it) into a directory under pytest's
temporary root. Inside the sandbox it reaches the scripted server through the
egress proxy: ``api.openai.test:<port>`` is routed to the server's loopback
port by a recorded override, the route a test may take and a user's run never
does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import support.responses_wire as wire
from firstrun.agents.cli.codex import CodexAgent, make_codex
from firstrun.agents.cli.frame import Route
from firstrun.agents.cli.install import CODEX, CliInstall
from support.agent_clis import CliRow
from support.agents import OPENAI_PRICE
from support.vendor import Reply, Script

API_HOST = "api.openai.test"


def bash(command: str) -> dict[str, Any]:
    # Codex's shell tool (unified exec).
    return wire.call("exec_command", cmd=command)


def read_docs(url: str) -> dict[str, Any]:
    # An MCP server's tools reach the model in the server's namespace.
    return wire.call("read_docs", namespace="mcp__firstrun", url=url)


def agent(install: CliInstall, server_url: str, **options: Any) -> CodexAgent:
    # The route's address is where the server listens: loopback, or the host address a
    # backend's own proxy reaches (support.agent_clis.serving).
    api = urlsplit(server_url)
    port = int(api.port or 0)
    return make_codex(model=wire.MODEL, base_url=f"{api.scheme}://{API_HOST}:{port}/v1",
                      price_file={wire.MODEL: OPENAI_PRICE}, install=install,
                      routes=(Route(host=API_HOST, port=port, address=str(api.hostname)),),
                      max_retries=0, **options)


def served(*steps: Reply | list[Reply]) -> Script:
    return wire.script(*steps)


ROW = CliRow(pin=CODEX, agent=agent, greeter=lambda page, command: served(
    wire.response(read_docs(page)), wire.response(bash(command)),
    wire.response(wire.text("Done."))))


__all__ = ["API_HOST", "ROW", "agent", "bash", "read_docs", "served"]
