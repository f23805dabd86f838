"""Image references against the published grammar: what Docker accepts, and what it must never see."""

from __future__ import annotations

import pytest

from firstrun.policy.images import image_reference_error


@pytest.mark.parametrize("ref", [
    "python", "python:3.11", "node:22-slim", "firstrun/python:3.11", "library/python:3.11",
    "docker.io/library/python:3.11-slim", "registry.example:5000/team/tool:1.2",
    "localhost:5000/a/b/c", "[::1]:5000/img:tag", "a__b", "a---b.c_d",
    "python@sha256:" + "a" * 64, "python:3.11@sha256:" + "0f" * 32,
    "x:" + "t" * 128,
])
def test_references_docker_accepts_are_accepted(ref: str) -> None:
    assert image_reference_error(ref) is None


@pytest.mark.parametrize("ref", [
    "", "--privileged", "-v/:/host", "Python:3.11", "python:", "python:-tag", ":tag",
    "python:3.11 --privileged", "a/", "/a", "a//b", "a_-b", "-a", "a-", "python@sha256:abc",
    "python\n", "x:" + "t" * 129, "python:3.11\x00", "café",
])
def test_anything_else_is_refused_with_the_reference_named(ref: str) -> None:
    error = image_reference_error(ref)
    assert error is not None and repr(ref) in error


def test_a_name_longer_than_docker_allows_is_refused() -> None:
    assert "at most 255" in (image_reference_error("a" * 256) or "")
    assert image_reference_error("a" * 255) is None
