"""Agents: adapters that reach a task's goal through a toolbelt, over a read-only brief.

Guarantee: ``make_agent`` returns a fresh agent for one run, or raises a
``UsageError`` naming the flag (an unknown ``--agent``, a ``--model`` or
``--base-url`` the agent cannot use, a missing SDK or key); it never falls
back to another agent. Vendor SDKs are imported inside their adapter, so a
replay run imports none. Every model agent is the same ``LoopAgent`` over a
vendor's ``VendorClient``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from urllib.parse import urlsplit

from firstrun.agents.base import (
    Agent,
    AgentResult,
    AgentStop,
    Brief,
    Budget,
    BudgetExhausted,
    CallRefused,
    Toolbelt,
    TurnRecord,
)
from firstrun.agents.replay import ReplayAgent
from firstrun.agents.spend import FilePrice
from firstrun.errors import UsageError

AGENTS = ("replay", "claude", "openai", "gemini", "claude-code", "codex", "gemini-cli")


def make_agent(name: str, *, model: str | None = None, base_url: str | None = None,
               price_file: Mapping[str, FilePrice] | None = None) -> Agent:
    """The agent ``--agent name`` names; ``price_file`` is a loaded ``--price-file``."""
    if base_url is not None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--base-url: {base_url!r} is not an http(s) URL")
    if name == "replay":
        if model is not None:
            raise UsageError("--model: the replay agent uses no model")
        if base_url is not None:
            raise UsageError("--base-url: the replay agent uses no model server")
        return ReplayAgent()
    if name == "claude":
        from firstrun.agents.claude import make_claude

        return make_claude(model=model, base_url=base_url, price_file=price_file)
    if name == "openai":
        from firstrun.agents.openai_agent import make_openai

        return make_openai(model=model, base_url=base_url, price_file=price_file)
    if name == "gemini":
        from firstrun.agents.gemini_agent import make_gemini

        return make_gemini(model=model, base_url=base_url, price_file=price_file)
    if name == "claude-code":
        from firstrun.agents.cli.claude_code import make_claude_code

        return make_claude_code(model=model, base_url=base_url, price_file=price_file)
    if name == "codex":
        from firstrun.agents.cli.codex import make_codex

        return make_codex(model=model, base_url=base_url, price_file=price_file)
    if name == "gemini-cli":
        from firstrun.agents.cli.gemini_cli import make_gemini_cli

        return make_gemini_cli(model=model, base_url=base_url, price_file=price_file)
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
    "CallRefused",
    "ReplayAgent",
    "Toolbelt",
    "TurnRecord",
    "make_agent",
]
