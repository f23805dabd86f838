"""The only place a proxy, its endpoint and a backend's attested session are wired together.

Guarantee: the shell channel's proxy is the one the resolved entry calls for,
the harness's own (private sockets, capture for a backend that captures, TLS
inspection when the policy asks) or the backend's own (``OwnProxy``, from the
same policy), and every record either writes reaches one sink as it is
written. ``start`` returns only an attested session. However the enclosure is
left, the session closes first, then the proxy, its last records delivered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

from firstrun.errors import SandboxUnavailable
from firstrun.policy.network import Channel, NetworkPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.proxy.core import PageReader
from firstrun.proxy.records import EgressRecord, RecordLog
from firstrun.proxy.server import EgressProxy, Resolver, capture_listeners
from firstrun.sandbox.base import Backend, OwnProxy, ProxyEndpoint, Session, ShellProxy
from firstrun.sandbox.select import BackendOptions, Entry, inspecting
from firstrun.sandbox.sockdir import socket_directory


@dataclass(frozen=True, kw_only=True)
class ProxySetup:
    """What the proxy is given beside the policy, whichever proxy it is.

    ``env`` holds the credentials' values (TLS inspection). Records go to
    ``on_record`` as they are written, and to ``record_path`` when given.
    ``resolver`` and ``extra_cafiles`` (upstream trust) are the harness
    proxy's; the audit points them at its fixture registry.
    """

    env: Mapping[str, str]
    on_record: Callable[[EgressRecord], None] | None = None
    record_path: str | None = None
    resolver: Resolver | None = None
    extra_cafiles: tuple[str, ...] = ()
    # The harness proxy's page reader, when the policy serves docs hosts as page reads.
    pages: PageReader | None = None


@dataclass(frozen=True, kw_only=True)
class HarnessProxy:
    """The harness's proxy and the endpoint a session's shell channel reaches it by."""

    proxy: EgressProxy
    endpoint: ProxyEndpoint


@contextmanager
def harness_proxy(policy: NetworkPolicy, egress: ProxySetup, *,
                  captures: bool) -> Iterator[HarnessProxy]:
    """The harness's proxy enforcing ``policy`` on the shell channel; ``captures``: with the
    listeners for redirected flows and DNS too."""
    with ExitStack() as stack:
        # Private (0700): only the harness connects to the sockets, and the
        # backend hands connections in. The trust bundle there holds
        # certificates only; the CA key stays in this process's memory.
        sockdir = stack.enter_context(socket_directory())
        interception, bundle, placeholders = None, None, ()
        if policy.inspection is not None:
            # Imported here: only inspection needs X.509 (cryptography).
            from firstrun.proxy.credentials import sandbox_variables
            from firstrun.proxy.intercept import prepare_interception

            interception, bundle = prepare_interception(
                policy.inspection, env=egress.env, bundle_dir=sockdir,
                extra_cafiles=egress.extra_cafiles)
            placeholders = tuple(sandbox_variables(interception.credentials).items())
        proxy = stack.enter_context(EgressProxy(
            policy, record_path=egress.record_path, resolver=egress.resolver,
            on_record=egress.on_record, interception=interception, pages=egress.pages))
        endpoint = ProxyEndpoint(
            socket_path=proxy.listen_unix(os.path.join(sockdir, "proxy.sock"), Channel.SHELL),
            nonce=proxy.nonce, trust_bundle=bundle, placeholders=placeholders,
            **capture_listeners(proxy, sockdir) if captures else {})
        yield HarnessProxy(proxy=proxy, endpoint=endpoint)


class Enclosure:
    """An open enclosure: its proxy is up; ``start`` adds the attested session."""

    def __init__(self, stack: ExitStack, backend: Backend, profile: SandboxProfile,
                 shell: ShellProxy | None, proxy: EgressProxy | None,
                 own: RecordLog | None) -> None:
        self._stack = stack
        self._backend = backend
        self._profile = profile
        self._shell = shell
        self._own = own
        # The harness's proxy: the shell channel's, or the docs channel's only.
        self.proxy = proxy
        self.session: Session | None = None

    def listen_docs(self) -> tuple[str, int]:
        """Where the docs channel reaches the harness's proxy (``docs=True``)."""
        assert self.proxy is not None, "open_enclosure(docs=True) keeps a proxy for the docs"
        return self.proxy.listen_tcp(Channel.DOCS)

    def start(self) -> Session:
        """The backend's attested session, closed before the proxy."""
        self.session = self._stack.enter_context(
            self._backend.start(self._profile, proxy=self._shell))
        return self.session

    def records(self) -> list[EgressRecord]:
        """Every record so far, the harness proxy's then the backend's own proxy's."""
        return ([*self.proxy.records()] if self.proxy is not None else []) + (
            self._own.snapshot() if self._own is not None else [])


@contextmanager
def open_enclosure(chosen: Entry, profile: SandboxProfile, egress: ProxySetup | None, *,
                   options: BackendOptions | None = None,
                   build: Callable[[BackendOptions], Backend] | None = None,
                   docs: bool = False) -> Iterator[Enclosure]:
    """The enclosure of a session of ``chosen`` under ``profile``, its proxy up.

    ``egress`` None: no proxy at all (a profile without the network layer).
    ``docs``: the harness's proxy serves the docs channel too, so it runs
    even beside a backend's own. ``build`` makes the backend from
    ``options`` (default: ``chosen``'s own constructor). Raises
    ``SandboxUnavailable`` for inspection on a backend that cannot show the
    run's CA bundle, and whatever the proxy or the backend raise.
    """
    policy = profile.net
    if egress is not None and policy.inspection is not None and not chosen.inspects_tls:
        # A scoped inspection is an agent CLI's: its key goes into its API requests.
        why = "--inspect-tls" if policy.inspection.scope is None else \
            "--agent (the proxy inspects its API host to put the key in)"
        raise SandboxUnavailable(
            f"{why}: the {chosen.name} backend cannot show the run's CA bundle in its "
            "sandbox", who=chosen.name,
            fix=f"use --backend {' or --backend '.join(inspecting())}"
            + (", or drop --inspect-tls" if policy.inspection.scope is None else ""))
    options = options or BackendOptions()
    with ExitStack() as stack:
        own: RecordLog | None = None
        if egress is not None and chosen.own_proxy:
            own = RecordLog(egress.record_path, on_record=egress.on_record)
            stack.callback(own.close)
            log = own
            options = replace(options,
                              on_record=lambda data: log.append(EgressRecord.from_data(data)))
        backend = (build or chosen.construct)(options)
        proxy: EgressProxy | None = None
        shell: ShellProxy | None = None
        if own is not None:
            # The backend runs the shell channel's proxy, inspection included;
            # the harness's serves the docs channel only.
            assert egress is not None
            shell = OwnProxy()
            if docs:
                proxy = stack.enter_context(EgressProxy(
                    policy.with_inspection(None), resolver=egress.resolver,
                    on_record=egress.on_record))
        elif egress is not None:
            made = stack.enter_context(harness_proxy(policy, egress, captures=chosen.captures))
            proxy, shell = made.proxy, made.endpoint
        yield Enclosure(stack, backend, profile, shell, proxy, own)
