"""Fixtures for sandbox tests: real bubblewrap, real kernel, real sockets on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from firstrun.enclosure import ProxySetup, harness_proxy
from firstrun.policy.network import NetworkPolicy
from firstrun.proxy.server import EgressProxy
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession
from support.profiles import make_profile


@pytest.fixture
def session(workspace: str) -> Iterator[LinuxSession]:
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        yield s


@pytest.fixture
def proxy() -> Iterator[tuple[EgressProxy, ProxyEndpoint]]:
    """The run's proxy as the enclosure makes it, transparent capture included."""
    with harness_proxy(NetworkPolicy.build(), ProxySetup(env=os.environ), captures=True) as made:
        yield made.proxy, made.endpoint
