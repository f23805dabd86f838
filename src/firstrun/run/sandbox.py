"""A run's sandbox: the task's enclosure and its docs reader, opened and closed together.

Guarantee: ``open_sandbox`` yields only when both are up: a session attested
over one workspace, enclosed (``firstrun.enclosure``) by a proxy enforcing the
task's own policy (docs hosts on the docs channel only), and a docs reader that
reaches its hosts through that proxy's docs channel (mirrors excepted, on
loopback). Every egress record reaches ``on_record`` as it is written. On the
way out the reader closes, then the session, then the proxy.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

from firstrun.agents.cli.frame import Needs, Route
from firstrun.docs import (
    AffordanceFilter,
    Affordances,
    DocsReader,
    Politeness,
    default_user_agent,
)
from firstrun.enclosure import ProxySetup, open_enclosure
from firstrun.errors import SandboxUnavailable, UsageError
from firstrun.policy.addresses import IPAddress
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import Mode, NetworkPolicy
from firstrun.policy.process import Limits
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.core import Resolver, system_resolver
from firstrun.proxy.credentials import mint
from firstrun.proxy.records import EgressRecord
from firstrun.run.config import RunConfig
from firstrun.sandbox.base import Session
from firstrun.sandbox.hostfs import host_filesystem_policy
from firstrun.sandbox.select import (
    BackendOptions,
    Entry,
    agent_cli_backends,
    entry,
    require_vm,
    resolve_backend,
    service_address,
)
from firstrun.tasks.compile import compile_inspection, compile_network_policy, require_inspection
from firstrun.tasks.model import Task

# Between two requests to one remote docs host (mirrors are not spaced).
DOCS_MIN_DELAY_S = 1.0


def check_inspection(tasks: Sequence[Task], *, inspect_tls: bool, env: Mapping[str, str]) -> None:
    """Refuse before any run what every run would refuse alike: a credential without
    --inspect-tls, or one whose value is not in ``env``. Raises ``UsageError``."""
    for task in tasks:
        # The inspection alone: the whole policy is compiled once, by the run.
        require_inspection(task, inspect=inspect_tls)
        if inspect_tls:
            try:
                mint(compile_inspection(task).credentials, env)
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
class Sandbox:
    session: Session
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
        downgrades=config.downgrades,
    )


def run_image(task: Task, config: RunConfig) -> str | None:
    """The container image for ``task``: its own ``image``, else ``--image``; None: the default."""
    return task.spec.image or config.image


def granted(policy: NetworkPolicy, needs: Needs) -> NetworkPolicy:
    """``policy`` with an agent CLI's API host on the agent channel and its key held by the proxy.

    Under ``--inspect-tls`` the key's host joins the inspection of every host;
    without it the proxy inspects that host alone (``InspectionPolicy.scope``),
    and the docs hosts when it serves them as page reads (``Needs.pages``);
    every other tunnel of the run stays opaque.
    """
    if needs.allow:
        policy = replace(policy, agent=policy.agent + NetworkPolicy.build(
            allow=needs.allow, source="agent API host").allow)
    scope = [host for _, host, _ in needs.credentials]
    if needs.pages is not None:
        # The CLI's own web fetch: a docs host's requests are decrypted and
        # answered by the docs reader, each a page read.
        policy = replace(policy, serve_docs=True)
        scope += [str(p) for p in policy.docs]
    if not scope and policy.inspection is None:
        return policy
    held = InspectionPolicy.build(
        credentials=needs.credentials, rules=needs.methods, source="agent API",
        scope=scope if policy.inspection is None else None)
    if policy.inspection is None:
        return policy.with_inspection(held)
    return policy.with_inspection(replace(
        policy.inspection, rules=policy.inspection.rules + held.rules,
        credentials=policy.inspection.credentials + held.credentials))


def _routed(routes: Sequence[Route]) -> Resolver:
    """The system resolver, but for the routed names, which resolve to their address only."""
    table = {r.host: [ipaddress.ip_address(r.address)] for r in routes}

    async def resolve(host: str, port: int) -> list[IPAddress]:
        found = table.get(host)
        return list(found) if found is not None else await system_resolver(host, port)

    return resolve


def _served(chosen: Entry, needs: Callable[[str], Needs]) -> tuple[Needs, tuple[tuple[str, str], ...]]:
    """What an agent CLI needs on ``chosen``, and the names its own proxy must resolve.

    Refused (``SandboxUnavailable``) where the CLI cannot run, or its routes
    cannot be followed by the proxy that enforces the session.
    """
    if chosen.no_agent_cli is not None:
        raise SandboxUnavailable(f"--agent: the {chosen.name} backend cannot run an agent CLI: "
                                 f"{chosen.no_agent_cli}", who=chosen.name,
                                 fix=f"use --backend {' or --backend '.join(agent_cli_backends())}")
    address = service_address(chosen)
    asked = needs(address)
    if not chosen.own_proxy:
        return asked, ()
    # The backend's own proxy resolves each routed name from its hosts
    # table, to an address of the host it reaches (never its own loopback).
    for route in asked.routes:
        if ipaddress.ip_address(route.address).is_loopback:
            raise SandboxUnavailable(
                f"--agent: the {chosen.name} backend's own proxy cannot reach {route.host} on "
                f"the host's loopback ({route.address})", who=chosen.name,
                fix=f"serve it on {address}, where that proxy reaches the host")
    return asked, tuple((r.host, r.address) for r in asked.routes)


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
    needs: Callable[[str], Needs] | None = None,
) -> Iterator[Sandbox]:
    """Raises SandboxUnavailable/AttestationFailed/SandboxError/ProxyError/UsageError as they come.

    ``protect`` and ``lift``: as ``task_profile``'s. ``needs``: what an agent
    CLI asks for (``firstrun.agents.cli.frame``), given the host address where
    the chosen backend's proxy reaches harness services: its directories lent
    read-only, and its routes as overrides in the policy, resolved by the
    harness proxy, or by a backend's own from its hosts table.
    """
    policy = task_policy(task, config)
    image = run_image(task, config)
    # A sweep resolved its backend once before its runs (RunConfig.chosen); a
    # lone run resolves it here, once. From here on the entry travels, never its name.
    chosen = config.chosen if config.chosen is not None else entry(
        config.backend if config.backend != "auto"
        else resolve_backend("auto", BackendOptions(), (image,)).backend)
    if task.spec.firstrun.isolation == "vm":
        require_vm(chosen, who=f"task {task.name}")
    asked, hosts = _served(chosen, needs) if needs is not None else (None, ())
    routes = asked.routes if asked is not None else ()
    if asked is not None:
        policy = granted(policy, asked)
    if routes:
        policy = replace(policy, overrides=policy.overrides + NetworkPolicy.build(
            allow=(), source="agent routes",
            overrides=[(f"{r.host}:{r.port}", [f"{r.address}/32"]) for r in routes]).overrides)
    if policy.serve_docs and chosen.own_proxy:
        # Its proxy has no docs reader to answer the CLI's own fetches with.
        raise SandboxUnavailable(
            f"--agent: the {chosen.name} backend runs its own proxy, which cannot serve the "
            "agent's web fetches as page reads", who=chosen.name, fix="use --backend linux")
    profile = task_profile(task, workspace, policy, config, protect=protect, lift=lift)
    if asked is not None and asked.lend:
        profile = replace(profile, fs=replace(profile.fs, lent=profile.fs.lent + asked.lend))
    with ExitStack() as stack:
        enclosure = stack.enter_context(open_enclosure(
            chosen, profile, ProxySetup(env=os.environ, on_record=on_record, resolver=_routed(routes),
                                        pages=asked.pages if asked is not None else None),
            options=BackendOptions(allow_unenforced=config.allow_unenforced, image=image,
                                   hosts=hosts),
            docs=True))
        docs_address = enclosure.listen_docs()
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
        session = enclosure.start()
        yield Sandbox(session=session, reader=reader_made.result(), policy=policy)
