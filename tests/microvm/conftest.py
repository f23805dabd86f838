"""Fixtures for micro-VM tests: real QEMU, a real guest kernel, a real proxy on a Unix socket.

The accelerator is KVM wherever KVM can run Debian's kernel; elsewhere (a
host whose /dev/kvm is PVM, or none) the same VM runs under TCG emulation,
chosen here explicitly and recorded by the session, never by the backend.
scripts/test builds the image (firstrun images build --microvm).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from firstrun.enclosure import ProxySetup, harness_proxy
from firstrun.policy.network import NetworkPolicy
from firstrun.proxy.server import EgressProxy
from firstrun.sandbox.base import ProxyEndpoint
from firstrun.sandbox.microvm.image import find_image


@pytest.fixture(scope="session", autouse=True)
def microvm_ready() -> None:
    if find_image() is None:
        pytest.fail("the micro-VM image is not built; scripts/test runs "
                    "'firstrun images build --microvm'")


@pytest.fixture(scope="module")
def proxy() -> Iterator[tuple[EgressProxy, ProxyEndpoint]]:
    with harness_proxy(NetworkPolicy.build(), ProxySetup(env=os.environ), captures=False) as made:
        yield made.proxy, made.endpoint
