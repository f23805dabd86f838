"""The versions of what shapes what an agent sees and does, as a sweep records them.

Guarantee: ``shaping_versions`` names, for one agent, the installed version
of every library between the docs and the agent (the HTML reader, its
converter, the HTTP client) and of the vendor SDK the agent speaks through,
so two sweeps whose agents read the same page through different converters
can be told apart; ``version_changes`` says, for two saved sweeps, which of
those differ. A package that is not installed is recorded as None.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

# Between a docs page and what read_docs hands the agent.
READER_PACKAGES = ("httpx", "beautifulsoup4", "markdownify")
# The SDK each model agent speaks to its vendor with.
AGENT_SDKS = {"claude": "anthropic", "openai": "openai", "gemini": "google-genai",
              # An agent CLI's own version is the cli's to add; this is its MCP server's SDK.
              "claude-code": "mcp", "codex": "mcp", "gemini-cli": "mcp"}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def shaping_versions(agent: str) -> dict[str, str | None]:
    packages = [*READER_PACKAGES, *([AGENT_SDKS[agent]] if agent in AGENT_SDKS else [])]
    return {package: _version(package) for package in packages}


def version_changes(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """``package OLD -> NEW`` for each package both sweeps recorded at different versions."""
    return [f"{package} {before[package]} -> {after[package]}"
            for package in sorted(before.keys() & after.keys())
            if before[package] != after[package]]
