"""Fixtures for the read_docs tests: loopback docs sites and a refusing port."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from docsite import FakeClock, Route, Site


@pytest.fixture
def serve() -> Iterator:
    sites: list[Site] = []

    def start(routes: dict[str, Route], *, host: str = "127.0.0.1", clock: FakeClock | None = None) -> Site:
        site = Site(host, routes, clock)
        sites.append(site)
        return site

    yield start
    for site in sites:
        site.close()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound, never listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
