"""One way to open a session on any backend, as a run does (its enclosure), for the conformance suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from firstrun.cli.doctor import available_backends
from firstrun.enclosure import ProxySetup, open_enclosure
from firstrun.policy.network import NetworkPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.records import EgressRecord
from firstrun.sandbox.base import Session
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.select import entry, select_backend

# Every backend doctor reports available here, probed once per test session.
AVAILABLE = available_backends()


@contextmanager
def session_on(backend: str, workspace: str,
               records: list[EgressRecord] | None = None) -> Iterator[Session]:
    """An attested session on ``backend`` behind a proxy enforcing the default policy."""
    policy = NetworkPolicy.build()
    sink = records if records is not None else []
    select_backend(backend, allow_unenforced=False)
    profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=False), net=policy)
    with open_enclosure(entry(backend), profile,
                        ProxySetup(env=os.environ, on_record=sink.append)) as enclosure:
        yield enclosure.start()
