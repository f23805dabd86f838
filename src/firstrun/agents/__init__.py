"""Agents: adapters that reach a task's goal through a toolbelt, over a read-only brief.

Guarantee: ``make_agent`` returns a fresh agent for one run, or raises a
``UsageError`` naming ``--agent``; it never falls back to another agent.
Vendor SDKs, when agents need them, are imported inside their adapter, so a
replay run imports none.
"""

from __future__ import annotations

import difflib

from firstrun.agents.base import (
    Agent,
    AgentResult,
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    Toolbelt,
)
from firstrun.agents.replay import ReplayAgent
from firstrun.errors import UsageError

AGENTS = ("replay",)


def make_agent(name: str, *, model: str | None = None) -> Agent:
    if name == "replay":
        if model is not None:
            raise UsageError("--model: the replay agent uses no model")
        return ReplayAgent()
    close = difflib.get_close_matches(name, AGENTS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UsageError(f"--agent: unknown agent {name!r}{hint} (choose one of {', '.join(AGENTS)})")


__all__ = [
    "AGENTS",
    "Agent",
    "AgentResult",
    "AgentStop",
    "Brief",
    "Budget",
    "BudgetExhausted",
    "ReplayAgent",
    "Toolbelt",
    "make_agent",
]
