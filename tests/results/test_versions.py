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
