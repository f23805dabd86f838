"""Fixtures for sandbox tests: real bubblewrap, real kernel, real sockets on loopback."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from sandbox_support import make_profile

from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.proxy.server import EgressProxy, capture_listeners
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.linux.backend import LinuxBackend, LinuxSession


@pytest.fixture
def workspace() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="firstrun-test-ws-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def session(workspace: str) -> Iterator[LinuxSession]:
    with LinuxBackend().start(make_profile(workspace), proxy=None) as s:
        yield s


@pytest.fixture
def proxy() -> Iterator[tuple[EgressProxy, ProxyEndpoint]]:
    """The run's proxy as ``open_sandbox`` makes it, transparent capture included."""
    sockdir = tempfile.mkdtemp(prefix="firstrun-test-proxy-")
    with EgressProxy(NetworkPolicy.build()) as p:
        path = p.listen_unix(os.path.join(sockdir, "proxy.sock"), Channel.SHELL)
        yield p, ProxyEndpoint(socket_path=path, nonce=p.nonce, **capture_listeners(p, sockdir))
    shutil.rmtree(sockdir, ignore_errors=True)
