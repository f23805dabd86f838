"""The run's enclosure: egress proxy, attested session and docs reader, opened and closed together.

Guarantee: ``open_sandbox`` yields only when all three are up: a proxy
enforcing the task's own network policy (documentation hosts on the docs
channel only; the registries and ``network.allow`` on the shell), a session
the backend attested over exactly one workspace, and a docs reader that
reaches its hosts through the proxy's docs channel (mirrors excepted, which
are on loopback by construction). Every egress record reaches ``on_record``
the moment the proxy writes it, so the trace holds egress live, not after
the fact. On the way out (normally, by exception or by interrupt) the
session is closed first, so every process the agent started is gone, then
the reader, then the proxy, whose last records (tunnels ended by the close)
are delivered before ``open_sandbox`` returns.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from firstrun.docs import AffordanceFilter, Affordances, DocsReader, Politeness, default_user_agent
from firstrun.policy.network import Channel, Mode, NetworkPolicy
from firstrun.policy.process import Limits
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.server import EgressProxy
from firstrun.run.config import RunConfig
from firstrun.sandbox.base import ProxyEndpoint, Session
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.select import select_backend
from firstrun.tasks.compile import compile_profile_inputs
from firstrun.tasks.model import Task

# Between two requests to one remote docs host (mirrors are not spaced).
DOCS_MIN_DELAY_S = 1.0


@dataclass(frozen=True, kw_only=True)
class Enclosure:
    session: Session
    proxy: EgressProxy
    reader: DocsReader
    policy: NetworkPolicy


def task_policy(task: Task, config: RunConfig) -> NetworkPolicy:
    return compile_profile_inputs(task, mode=Mode.REPORT if config.report_only else Mode.ENFORCE)


def task_profile(task: Task, workspace: str, policy: NetworkPolicy, config: RunConfig) -> SandboxProfile:
    budgets = task.spec.budgets
    return SandboxProfile(
        fs=host_filesystem_policy(workspace, os.environ),
        net=policy,
        # The task's output cap is in characters; bytes bound them from above
        # for ASCII and are what the backend can count.
        limits=Limits(
            command_timeout_s=float(budgets.max_command_seconds),
            output_bytes=budgets.max_output_chars,
        ),
        downgrades=config.allow_downgrade,
    )


@contextmanager
def open_sandbox(
    task: Task,
    *,
    workspace: str,
    config: RunConfig,
    politeness: Politeness,
    on_record: Callable[[EgressRecord], None],
) -> Iterator[Enclosure]:
    """Raises SandboxUnavailable/AttestationFailed/SandboxError/ProxyError/UsageError as they come."""
    policy = task_policy(task, config)
    backend = select_backend(config.backend, allow_unenforced=config.allow_unenforced)
    profile = task_profile(task, workspace, policy, config)
    with ExitStack() as stack:
        proxy = stack.enter_context(EgressProxy(policy, on_record=on_record))
        # Private (0700) directory: only the harness connects to the socket;
        # the backend hands connections into the sandbox.
        sockdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="firstrun-proxy-"))
        socket_path = proxy.listen_unix(os.path.join(sockdir, "proxy.sock"), Channel.SHELL)
        docs_address = proxy.listen_tcp(Channel.DOCS)
        reader = stack.enter_context(
            DocsReader(
                allow=policy.docs,
                proxy=docs_address,
                cache_dir=os.fspath(config.cache_dir) if config.cache_dir is not None else None,
                user_agent=default_user_agent(),
                min_delay_s=DOCS_MIN_DELAY_S,
                mirrors=config.docs_mirrors,
                politeness=politeness,
                hidden=AffordanceFilter.for_route(task.docs_route)
                if config.affordances is Affordances.NONE else None,
            )
        )
        session = stack.enter_context(
            backend.start(profile, proxy=ProxyEndpoint(socket_path=socket_path, nonce=proxy.nonce))
        )
        yield Enclosure(session=session, proxy=proxy, reader=reader, policy=policy)
