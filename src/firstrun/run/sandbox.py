"""The run's enclosure: egress proxy, attested session and docs reader, opened and closed together.

Guarantee: ``open_sandbox`` yields only when all three are up: a proxy
enforcing the task's own network policy (documentation hosts on the docs
channel only; the registries and ``network.allow`` on the shell), a session
the backend attested over exactly one workspace, and a docs reader that
reaches its hosts through the proxy's docs channel (mirrors excepted, which
are on loopback by construction). Every egress record reaches ``on_record``
the moment the proxy writes it, so the trace holds egress live, not after
the fact. A backend that brings its own shell-channel proxy (docker's
sidecar, ``Entry.own_proxy``) is given the same policy, and its records are
rebuilt as ``EgressRecord``s and delivered to ``on_record`` the same way, as
they are written, so classification never depends on which proxy decided;
the harness proxy then serves the docs channel only. The container image is
the task's ``image``, else ``--image``, else the default Python image. On the way out (normally, by exception or by interrupt) the
session is closed first, so every process the agent started is gone, then
the reader, then the proxy, whose last records (tunnels ended by the close)
are delivered before ``open_sandbox`` returns.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from firstrun.docs import (
    AffordanceFilter,
    Affordances,
    DocsReader,
    Politeness,
    default_user_agent,
)
from firstrun.errors import SandboxUnavailable, UsageError
from firstrun.policy.network import Channel, Mode, NetworkPolicy
from firstrun.policy.process import Limits
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.credentials import mint, sandbox_variables
from firstrun.proxy.intercept import prepare_interception
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.server import EgressProxy, capture_listeners
from firstrun.run.config import RunConfig
from firstrun.sandbox.base import ProxyEndpoint, Session
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.select import (
    OWN_PROXY,
    BackendOptions,
    entry,
    inspecting,
    require_vm,
    resolve_backend,
    select_backend,
)
from firstrun.sandbox.sockdir import socket_directory
from firstrun.tasks.compile import compile_network_policy
from firstrun.tasks.model import Task

# Between two requests to one remote docs host (mirrors are not spaced).
DOCS_MIN_DELAY_S = 1.0


def check_inspection(tasks: Sequence[Task], *, inspect_tls: bool, env: Mapping[str, str]) -> None:
    """Refuse before any run what every run would refuse alike: a credential without
    --inspect-tls, or one whose value is not in ``env``. Raises ``UsageError``."""
    for task in tasks:
        policy = compile_network_policy(task, inspect=inspect_tls)
        if policy.inspection is not None:
            try:
                mint(policy.inspection.credentials, env)
            except UsageError as exc:
                raise UsageError(f"{task.path}: {exc.args[0]}") from None


class _Made:
    """A ``DocsReader`` made in a thread of its own; ``result`` waits for it (or raises what
    making it raised), ``close`` waits and closes whatever was made."""

    def __init__(self, make: Callable[[], DocsReader]) -> None:
        self._made: list[DocsReader | BaseException] = []

        def run() -> None:
            try:
                self._made.append(make())
            except BaseException as exc:  # re-raised by result, in the caller's thread
                self._made.append(exc)

        self._thread = threading.Thread(target=run, name="firstrun-docs-reader", daemon=True)
        self._thread.start()

    def result(self) -> DocsReader:
        self._thread.join()
        made = self._made[0]
        if isinstance(made, BaseException):
            raise made
        return made

    def close(self) -> None:
        self._thread.join()
        if self._made and isinstance(self._made[0], DocsReader):
            self._made[0].close()


@dataclass(frozen=True, kw_only=True)
class Enclosure:
    session: Session
    proxy: EgressProxy
    reader: DocsReader
    policy: NetworkPolicy


def task_policy(task: Task, config: RunConfig) -> NetworkPolicy:
    return compile_network_policy(task, mode=Mode.REPORT if config.report_only else Mode.ENFORCE,
                                  inspect=config.inspect_tls)


def task_profile(task: Task, workspace: str, policy: NetworkPolicy, config: RunConfig, *,
                 protect: bool, lift: tuple[str, ...] = ()) -> SandboxProfile:
    """``protect``: the workspace is not one this run made (a recheck's kept one)."""
    budgets = task.spec.budgets
    return SandboxProfile(
        fs=host_filesystem_policy(workspace, os.environ, protect=protect, lift=lift),
        net=policy,
        # The task's output cap is in characters; bytes bound them from above
        # for ASCII and are what the backend can count.
        limits=Limits(
            command_timeout_s=float(budgets.max_command_seconds),
            output_bytes=budgets.max_output_chars,
        ),
        downgrades=config.allow_downgrade,
    )


def run_image(task: Task, config: RunConfig) -> str | None:
    """The container image for ``task``: its own ``image``, else ``--image``; None: the default."""
    return task.spec.image or config.image


@contextmanager
def open_sandbox(
    task: Task,
    *,
    workspace: str,
    config: RunConfig,
    politeness: Politeness,
    on_record: Callable[[EgressRecord], None],
    protect: bool,
    lift: tuple[str, ...] = (),
) -> Iterator[Enclosure]:
    """Raises SandboxUnavailable/AttestationFailed/SandboxError/ProxyError/UsageError as they come.

    ``protect`` and ``lift``: as ``task_profile``'s.
    """
    policy = task_policy(task, config)
    image = run_image(task, config)
    # A sweep resolves ``auto`` once before its runs; a lone run does it here.
    name = config.backend if config.backend != "auto" else resolve_backend(
        "auto", BackendOptions(allow_unenforced=config.allow_unenforced), (image,)).backend
    if task.spec.firstrun.isolation == "vm":
        require_vm(name, who=f"task {task.name}")
    own_proxy = entry(name).own_proxy
    backend = select_backend(name, allow_unenforced=config.allow_unenforced,
                             options=BackendOptions(
                                 image=image,
                                 on_record=(lambda data: on_record(EgressRecord.from_data(data)))
                                 if own_proxy else None))
    profile = task_profile(task, workspace, policy, config, protect=protect, lift=lift)
    if policy.inspection is not None and not entry(name).inspects_tls:
        raise SandboxUnavailable(
            f"--inspect-tls: the {name} backend cannot show the run's CA bundle in its sandbox",
            who=name, fix=f"use --backend {' or --backend '.join(inspecting())}, or drop --inspect-tls",
        )
    with ExitStack() as stack:
        interception, trust_bundle = None, None
        # Docker's sidecar inspects the shell channel with a CA of its own
        # (the backend reads the policy); the harness proxy serves docs only.
        if policy.inspection is not None and not own_proxy:
            # Harness-private (0700); the bundle holds certificates only, the
            # CA key stays in this process's memory.
            trust_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="firstrun-trust-"))
            interception, trust_bundle = prepare_interception(
                policy.inspection, env=os.environ, bundle_dir=trust_dir)
        proxy = stack.enter_context(EgressProxy(
            policy if interception is not None else policy.with_inspection(None),
            on_record=on_record, interception=interception))
        if own_proxy:
            # The backend runs the shell channel's proxy with this same policy.
            endpoint = OWN_PROXY
        else:
            # Private (0700) directory: only the harness connects to the socket;
            # the backend hands connections into the sandbox.
            sockdir = stack.enter_context(socket_directory())
            socket_path = proxy.listen_unix(os.path.join(sockdir, "proxy.sock"), Channel.SHELL)
            endpoint = ProxyEndpoint(
                socket_path=socket_path, nonce=proxy.nonce, trust_bundle=trust_bundle,
                placeholders=tuple(sandbox_variables(interception.credentials).items())
                if interception is not None else (),
                **capture_listeners(proxy, sockdir) if entry(name).captures else {},
            )
        docs_address = proxy.listen_tcp(Channel.DOCS)
        # The reader's HTTP clients load the CA store, tens of milliseconds of
        # each run's start: made beside the session's start, which mostly
        # waits on bubblewrap and the helper. Closed after the session either way.
        reader_made = _Made(lambda: DocsReader(
            allow=policy.docs,
            proxy=docs_address,
            cache_dir=os.fspath(config.cache_dir) if config.cache_dir is not None else None,
            cache_mode=config.cache_mode,
            user_agent=default_user_agent(),
            min_delay_s=DOCS_MIN_DELAY_S,
            mirrors=config.docs_mirrors,
            politeness=politeness,
            hidden=AffordanceFilter.for_route(task.docs_route)
            if config.affordances is Affordances.NONE else None,
        ))
        stack.callback(reader_made.close)
        session = stack.enter_context(backend.start(profile, proxy=endpoint))
        yield Enclosure(session=session, proxy=proxy, reader=reader_made.result(), policy=policy)
