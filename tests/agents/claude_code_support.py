"""Claude Code, the real CLI from the npm registry, against a scripted Messages API server.

The CLI is installed once per test session from the registry (pinned by
integrity, as ``--agent claude-code`` installs it) into a directory under
pytest's temporary root. Inside the sandbox it reaches the scripted server
through the egress proxy: ``api.anthropic.test:<port>`` is routed to the
server's loopback port by a recorded override, the route a test may take
and a user's run never does.
"""

from __future__ import annotations

from typing import Any

import support.anthropic_wire as wire
from support.agents import PRICE
from support.vendor import Reply, Request, Script

from firstrun.agents.cli.claude_code import ClaudeCodeAgent, make_claude_code
from firstrun.agents.cli.frame import Route
from firstrun.agents.cli.install import CliInstall

API_HOST = "api.anthropic.test"


def bash(command: str) -> dict[str, Any]:
    return wire.tool_use("Bash", command=command, description="run it")


def read_docs(url: str) -> dict[str, Any]:
    return wire.tool_use("mcp__firstrun__read_docs", url=url)


def agent(install: CliInstall, server_url: str, **options: Any) -> ClaudeCodeAgent:
    port = int(server_url.rsplit(":", 1)[1])
    return make_claude_code(model=wire.MODEL, base_url=f"http://{API_HOST}:{port}",
                            price_file={wire.MODEL: PRICE}, install=install,
                            routes=(Route(host=API_HOST, port=port, address="127.0.0.1"),),
                            max_retries=0, **options)


class Conversation:
    """The run's conversation by its model turns; any side request (one with no tools)
    gets a short text reply, so the script counts only the agent's own turns."""

    def __init__(self, *steps: Reply | list[Reply]) -> None:
        self._script = Script(steps, turn_of=wire.model_turns)

    def __call__(self, request: Request) -> Reply:
        if not (request.body or {}).get("tools"):
            return wire.message(wire.text("ok"))
        return self._script(request)


def served(*steps: Reply | list[Reply]) -> Any:
    return wire.streaming(Conversation(*steps))


__all__ = ["API_HOST", "agent", "bash", "read_docs", "served"]
