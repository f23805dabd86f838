"""From refused egress to the task lines that would allow it, as YAML ready to paste.

Guarantee: ``allow_entries`` and ``allow_snippet`` are pure functions of egress
records (plain data, as a run's trace and ``results.json`` hold them). Each
refusal the task's own lists could lift becomes one entry in the task's own
syntax; one no entry can lift (the address floor, a datagram, a docs host on
the shell, which the agent is told to read through ``read_docs``) yields none.
Report mode's allows that carry ``would_deny`` are read as the refusals they stand for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from firstrun.policy.decision import Reason

# The reasons a task's own lists decide, which an entry can therefore lift.
LIFTABLE = frozenset({
    Reason.NOT_ALLOWED, Reason.DNS_NOT_ALLOWED, Reason.PORT_NOT_ALLOWED, Reason.IP_LITERAL,
    Reason.TCP_NOT_ALLOWED,
})
# What makes a shell-channel run "blocked" rather than a docs gap: the lists
# refused it, or nothing could carry it (a datagram that was not DNS).
BLOCKING = LIFTABLE | {Reason.UDP_NOT_ALLOWED}


@dataclass(frozen=True, kw_only=True)
class AllowEntries:
    allow: tuple[str, ...] = ()
    tcp: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.allow or self.tcp)

    def to_data(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in (("allow", self.allow), ("tcp", self.tcp)) if v}

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> AllowEntries:
        data = data or {}
        return cls(allow=tuple(str(x) for x in data.get("allow", ())),
                   tcp=tuple(str(x) for x in data.get("tcp", ())))

    def __or__(self, other: AllowEntries) -> AllowEntries:
        return AllowEntries(allow=tuple(dict.fromkeys((*self.allow, *other.allow))),
                            tcp=tuple(dict.fromkeys((*self.tcp, *other.tcp))))


def _reason(record: Mapping[str, Any]) -> Reason | None:
    """The name rules' refusal a record stands for: its own reason, or (report mode) the one
    it would have had, kept on an allow and on a name that then did not resolve."""
    value = record.get("would_deny") or (record.get("reason") if record.get("decision") == "deny"
                                         else None)
    try:
        return Reason(value) if value else None
    except ValueError:
        return None


def _host(record: Mapping[str, Any]) -> str:
    host = str(record.get("host") or "")
    return f"[{host}]" if ":" in host else host


# A name refused by the allow-list (``not_allowed``, ``dns_not_allowed``)
# becomes ``network.allow: [name]``, a port the list does not cover
# ``network.allow: [name:port]``, an address dialled by itself
# ``network.allow: [address:port]``, and a raw stream no rule covers, or a
# redirected one to a port that is not the web's,
# ``firstrun.network.tcp: [name:port]``.
def allow_entries(records: Iterable[Mapping[str, Any]]) -> AllowEntries:
    """The entries that would let every liftable refusal in ``records`` through, in order."""
    allow: dict[str, None] = {}
    tcp: dict[str, None] = {}
    for record in records:
        if record.get("channel") != "shell" or not record.get("host"):
            continue
        reason = _reason(record)
        if reason not in LIFTABLE:
            continue
        host, port = _host(record), record.get("port")
        web = port in (80, 443, 53, None)
        if reason is Reason.TCP_NOT_ALLOWED or (
                record.get("capture") == "transparent" and not web
                and reason is not Reason.IP_LITERAL):
            # A redirected stream to a port that is not the web's goes only by a
            # tcp rule (an allow entry with that port licenses a CONNECT alone).
            tcp[f"{host}:{port}"] = None
        elif reason in (Reason.PORT_NOT_ALLOWED, Reason.IP_LITERAL) or not web:
            allow[f"{host}:{port}"] = None
        else:
            allow[host] = None
    return AllowEntries(allow=tuple(allow), tcp=tuple(tcp))


def allow_snippet(entries: AllowEntries) -> str:
    """The entries as task YAML; empty when there are none."""
    lines = []
    if entries.allow:
        lines += ["network:", f"  allow: [{', '.join(entries.allow)}]"]
    if entries.tcp:
        lines += ["firstrun:", "  network:", f"    tcp: [{', '.join(entries.tcp)}]"]
    return "\n".join(lines) + ("\n" if lines else "")
