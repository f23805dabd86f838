"""Seatbelt tests: golden everywhere; live ones (marked ``macos``) only where sandbox-exec exists."""

from __future__ import annotations

import sys

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if sys.platform == "darwin":
        return
    skip = pytest.mark.skip(reason="Seatbelt (sandbox-exec) exists only on macOS; "
                                   f"this is {sys.platform}")
    for item in items:
        if item.get_closest_marker("macos"):
            item.add_marker(skip)
