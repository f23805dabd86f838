"""One way to open a session on any backend, as ``open_sandbox`` does, for the conformance suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from firstrun.cli.doctor import available_backends
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.server import EgressProxy, capture_listeners
from firstrun.sandbox.base import ProxyEndpoint, Session
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.select import OWN_PROXY, BackendOptions, entry, select_backend
from firstrun.sandbox.sockdir import socket_directory

# Every backend doctor reports available here, probed once per test session.
AVAILABLE = available_backends()


@contextmanager
def session_on(backend: str, workspace: str,
               records: list[EgressRecord] | None = None) -> Iterator[Session]:
    """An attested session on ``backend`` behind a proxy enforcing the default policy."""
    policy = NetworkPolicy.build()
    sink = records if records is not None else []
    own = entry(backend).own_proxy
    chosen = select_backend(backend, allow_unenforced=False, options=BackendOptions(
        on_record=(lambda data: sink.append(EgressRecord.from_data(data))) if own else None))
    profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=False), net=policy)
    with ExitStack() as stack:
        if own:
            endpoint = OWN_PROXY
        else:
            proxy = stack.enter_context(EgressProxy(policy, on_record=sink.append))
            sockdir = stack.enter_context(socket_directory())
            endpoint = ProxyEndpoint(
                socket_path=proxy.listen_unix(os.path.join(sockdir, "proxy.sock"), Channel.SHELL),
                nonce=proxy.nonce,
                **capture_listeners(proxy, sockdir) if entry(backend).captures else {})
        yield stack.enter_context(chosen.start(profile, proxy=endpoint))
