"""What the conformance row of an agent CLI needs from that CLI's test support.

Each CLI's support module (``tests/agents/<cli>_support.py``) defines one
``CliRow``: its pin, how to make the agent against a scripted server's URL,
and the scripted API for the one run every row makes (read a page, run a
command, finish). ``serving`` says where such a server listens on a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from firstrun.agents.cli.agent import CliAgent
from firstrun.agents.cli.install import CliInstall, CliPin
from firstrun.sandbox.select import entry, service_address
from support.vendor import Responder


def serving(backend: str) -> str:
    """The host address a scripted server listens on for ``backend``'s proxy to reach it."""
    return service_address(entry(backend))


@dataclass(frozen=True, kw_only=True)
class CliRow:
    """``agent(install, server_url)``: the CLI against the scripted server at that URL,
    routed there by a test override. ``greeter(page_url, command)``: the scripted API
    of a run that reads the page with ``read_docs``, runs the command and finishes.
    ``refused_on``: backends where the agent refuses the run before its session."""

    pin: CliPin
    agent: Callable[[CliInstall, str], CliAgent]
    greeter: Callable[[str, str], Responder]
    # Backends the CLI itself refuses, though they could run another CLI.
    refused_on: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.pin.cli
