"""Compiling a task's hosts into the network policy: where the docs-vs-shell asymmetry lives.

Guarantee: every documentation host (of ``docs.path`` or ``docs.entrypoint``,
and ``docs.allow``) goes to the policy's ``docs`` patterns, so the proxy refuses
it on the shell channel and ``read_docs`` is the only way to read a page; a docs
host the task also names under ``network.allow``/``network.only`` is reachable
from the shell, each request recorded as ``allowed_docs_host_on_shell``. A task
that declares a credential is refused without TLS inspection.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from firstrun.errors import UsageError
from firstrun.policy.hosts import HostPattern, parse_patterns
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import DEFAULT_ALLOW, Mode, NetworkPolicy, Override
from firstrun.tasks.model import HostEntry, Task

_DEFAULT_ALLOW = parse_patterns(DEFAULT_ALLOW, source="default allow-list")


def covering(pattern: HostPattern) -> tuple[HostPattern, ...]:
    """The patterns a quickstarted host entry means: the host, and its subdomains.

    A public suffix (``github.io``, ``co.kr``: the Public Suffix List's,
    private section included), a single label and an IP literal cover only
    themselves, because the policy refuses a wildcard over them; an entry
    already written ``*.suffix`` is kept as is.
    """
    wide = pattern.widened()
    return (pattern,) if wide is None else (pattern, wide)


def covering_patterns(entry: str) -> tuple[str, ...]:
    """``covering`` of one entry, as text."""
    return tuple(str(p) for p in covering(HostPattern.parse(entry)))


def _expand(entries: Iterable[HostEntry]) -> tuple[HostPattern, ...]:
    # Each entry was parsed when the task loaded; its pattern goes to the
    # policy as it is, never turned back into text on the way.
    out: list[HostPattern] = []
    for entry in entries:
        for pattern in covering(entry.pattern):
            if pattern not in out:
                out.append(pattern)
    return tuple(out)


def require_inspection(task: Task, *, inspect: bool) -> None:
    """Refuse a task that declares a credential without --inspect-tls (``UsageError``)."""
    credentials = task.spec.firstrun.credentials
    if credentials and not inspect:
        names = ", ".join(c.name for c in credentials)
        raise UsageError(
            f"{task.path}: firstrun.credentials ({names}) need --inspect-tls: only an "
            "intercepting proxy can swap a placeholder for the value"
        )


def compile_inspection(task: Task) -> InspectionPolicy:
    """The task's method rules and credentials, for a proxy that inspects TLS."""
    extensions = task.spec.firstrun
    return InspectionPolicy.build(
        rules=[(r.host.pattern, r.methods, r.path) for r in extensions.methods],
        credentials=[(c.name, c.host.pattern, c.from_env) for c in extensions.credentials],
        source=f"{task.path}: firstrun",
    )


def compile_network_policy(
    task: Task, *, mode: Mode = Mode.ENFORCE, inspect: bool = False
) -> NetworkPolicy:
    """The network policy a run of ``task`` enforces.

    Every entry was parsed when the task loaded, so no ``PolicyError``
    arises for a loaded task, and none is parsed again here.
    """
    network = task.spec.network
    # The shell's allow-list is the default registries plus ``network.allow``, or
    # ``network.only`` instead of both, as quickstarted defined them.
    # The defaults are exact names; only the task's own entries carry
    # quickstarted's "and subdomains" meaning.
    named = _expand(network.only) if network.only else _expand(network.allow)
    allow = named if network.only else (*_DEFAULT_ALLOW, *named)
    ext = task.spec.firstrun.network
    require_inspection(task, inspect=inspect)
    policy = NetworkPolicy(
        allow=allow,
        # firstrun's own entries (deny, overrides, tcp) pass through in its exact syntax.
        deny=tuple(entry.pattern for entry in ext.deny),
        docs=_expand(task.docs_hosts),
        # quickstarted's exception, kept so its task files run unchanged: a docs host
        # the task also names for the shell is reachable from it, and the gap in the
        # page record is counted (``lint`` warns about it too).
        shell_docs=named,
        overrides=tuple(Override(pattern=o.host.pattern,
                                 networks=tuple(ipaddress.ip_network(n, strict=False)
                                                for n in o.networks))
                        for o in ext.overrides),
        mode=mode,
        tcp=tuple(rule.pattern for rule in ext.tcp),
    )
    return policy.with_inspection(compile_inspection(task)) if inspect else policy
