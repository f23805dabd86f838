"""Compiling a task's hosts into the network policy: where the docs-vs-shell asymmetry lives.

Guarantee: every documentation host (of ``docs.path`` or ``docs.entrypoint``,
and ``docs.allow``) goes to the policy's ``docs`` patterns, so the proxy refuses
it on the shell channel and ``read_docs`` is the only way to read a page; a docs
host the task also names under ``network.allow``/``network.only`` is reachable
from the shell, each request recorded as ``allowed_docs_host_on_shell``. A task
that declares a credential is refused without TLS inspection.
"""

from __future__ import annotations

from collections.abc import Iterable

from firstrun.errors import PolicyError, UsageError
from firstrun.policy.hosts import HostPattern, parse_ip_literal
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import DEFAULT_ALLOW, Mode, NetworkPolicy
from firstrun.tasks.model import Task


def covering_patterns(entry: str) -> tuple[str, ...]:
    """The patterns a quickstarted host entry means: the host, and its subdomains.

    A public suffix (``github.io``, ``co.kr``: the Public Suffix List's,
    private section included), a single label and an IP literal cover only
    themselves, because the policy refuses a wildcard over them; an entry
    already written ``*.suffix`` is kept as is.
    """
    if entry.startswith("*."):
        return (entry,)
    pattern = HostPattern.parse(entry)
    if parse_ip_literal(pattern.host) is not None:
        return (entry,)
    try:
        HostPattern.parse("*." + entry)
    except PolicyError:
        return (entry,)
    return (entry, "*." + entry)


def _expand(entries: Iterable[str]) -> list[str]:
    out: list[str] = []
    for entry in entries:
        for pattern in covering_patterns(entry):
            if pattern not in out:
                out.append(pattern)
    return out


def compile_network_policy(
    task: Task, *, mode: Mode = Mode.ENFORCE, inspect: bool = False
) -> NetworkPolicy:
    """The network policy a run of ``task`` enforces.

    Every entry was checked when the task loaded, so the ``PolicyError``
    that ``NetworkPolicy.build`` can raise does not arise for a loaded task.
    """
    network = task.spec.network
    # The shell's allow-list is the default registries plus ``network.allow``, or
    # ``network.only`` instead of both, as quickstarted defined them.
    # The defaults are exact names; only the task's own entries carry
    # quickstarted's "and subdomains" meaning.
    named = _expand(network.only) if network.only else _expand(network.allow)
    allow = named if network.only else [*DEFAULT_ALLOW, *named]
    ext = task.spec.firstrun.network
    extensions = task.spec.firstrun
    # Without inspection the proxy could never swap a credential's placeholder,
    # and running anyway would mean handing the sandbox the value.
    if extensions.credentials and not inspect:
        names = ", ".join(c.name for c in extensions.credentials)
        raise UsageError(
            f"{task.path}: firstrun.credentials ({names}) need --inspect-tls: only an "
            "intercepting proxy can swap a placeholder for the value"
        )
    policy = NetworkPolicy.build(
        allow=allow,
        # firstrun's own entries (deny, overrides, tcp) pass through in its exact syntax.
        deny=list(ext.deny),
        docs=_expand(task.docs_hosts),
        # quickstarted's exception, kept so its task files run unchanged: a docs host
        # the task also names for the shell is reachable from it, and the gap in the
        # page record is counted (``lint`` warns about it too).
        shell_docs=named,
        overrides=[(o.host, list(o.networks)) for o in ext.overrides],
        mode=mode,
        source=f"{task.path}: network.allow",
        tcp=list(ext.tcp),
    )
    if not inspect:
        return policy
    return policy.with_inspection(InspectionPolicy.build(
        rules=[(r.host, r.methods, r.path) for r in extensions.methods],
        credentials=[(c.name, c.host, c.from_env) for c in extensions.credentials],
        source=f"{task.path}: firstrun",
    ))
