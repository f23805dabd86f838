"""A sweep records the versions of what shapes an agent's view, and their changes are named."""

from __future__ import annotations

from importlib import metadata

from firstrun.results.versions import shaping_versions, version_changes


def test_the_reader_and_the_agents_sdk_are_recorded_at_their_installed_versions() -> None:
    replay = shaping_versions("replay")
    assert replay == {p: metadata.version(p) for p in ("httpx", "beautifulsoup4", "markdownify")}
    claude = shaping_versions("claude")
    assert claude["anthropic"] == metadata.version("anthropic") and replay.items() <= claude.items()
    assert "google-genai" in shaping_versions("gemini") and "openai" in shaping_versions("openai")


def test_only_packages_both_recorded_at_different_versions_are_changes() -> None:
    assert version_changes({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "3", "d": "4"}) == [
        "b 2 -> 3"]
    assert version_changes({}, {"a": "1"}) == []


def test_an_agent_cli_sweep_records_the_pinned_cli_and_its_mcp_sdk() -> None:
    from firstrun.agents.cli.install import cli_versions

    assert cli_versions("claude-code") == {"@anthropic-ai/claude-code": "2.1.332"}
    assert cli_versions("codex") == {"@openai/codex": "0.171.0"}
    assert shaping_versions("codex")["mcp"] == metadata.version("mcp")
    assert cli_versions("claude") == {}
    assert shaping_versions("claude-code")["mcp"] == metadata.version("mcp")
    # diff names a sweep run by another CLI release.
    assert version_changes(cli_versions("claude-code"),
                           {"@anthropic-ai/claude-code": "2.1.400"}) == [
        "@anthropic-ai/claude-code 2.1.332 -> 2.1.400"]
