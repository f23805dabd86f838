"""Fixtures for the proxy tests: loopback servers that remember what they saw."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proxy_fixtures import EchoServer, HttpUpstream


@pytest.fixture
def upstream() -> Iterator[HttpUpstream]:
    server = HttpUpstream()
    yield server
    server.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()
