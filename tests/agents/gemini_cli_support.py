"""Gemini CLI, the real CLI from the npm registry, against a scripted Gemini API server.

The CLI is installed once per test session from the registry (pinned by
integrity, as ``--agent gemini-cli`` installs it) into a directory under
pytest's temporary root. Inside the sandbox it reaches the scripted server
through the egress proxy: ``api.gemini.test:<port>`` is routed to the server's
loopback port by a recorded override, the route a test may take and a user's
run never does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import support.gemini_wire as wire
from firstrun.agents.cli.frame import Route
from firstrun.agents.cli.gemini_cli import READ_DOCS_TOOL, SHELL_TOOL, GeminiCliAgent, make_gemini_cli
from firstrun.agents.cli.install import GEMINI_CLI, CliInstall, ensure_node
from support.agent_clis import CliRow
from support.agents import GEMINI_PRICE
from support.vendor import Reply, Request, Script

API_HOST = "api.gemini.test"


def bash(command: str) -> dict[str, Any]:
    return wire.call(SHELL_TOOL, with_id=False, command=command, description="run it")


def read_docs(url: str) -> dict[str, Any]:
    return wire.call(READ_DOCS_TOOL, with_id=False, url=url)


def agent(install: CliInstall, server_url: str, **options: Any) -> GeminiCliAgent:
    # The route's address is where the server listens: loopback, or the host address a
    # backend's own proxy reaches (support.agent_clis.serving).
    api = urlsplit(server_url)
    port = int(api.port or 0)
    return make_gemini_cli(model=wire.MODEL, base_url=f"{api.scheme}://{API_HOST}:{port}",
                           price_file={wire.MODEL: GEMINI_PRICE}, install=install,
                           routes=(Route(host=API_HOST, port=port, address=str(api.hostname)),),
                           max_retries=0,
                           # Beside the install, in the test's own cache.
                           node=ensure_node(Path(install.root).parent), **options)


def served(*steps: Reply | list[Reply]) -> Any:
    """The run's conversation, streamed, by its model turns."""
    script = Script(steps, turn_of=wire.model_turns)

    def answer(request: Request) -> Reply:
        return script(request)
    return wire.streaming(answer)


ROW = CliRow(pin=GEMINI_CLI, agent=agent,
             greeter=lambda page, command: served(
                 wire.response(read_docs(page)), wire.response(bash(command)),
                 wire.response(wire.text("Done."))))


__all__ = ["API_HOST", "ROW", "agent", "bash", "read_docs", "served"]
