"""The shell's DNS under transparent capture: answers for allowed names, and nothing is ever forwarded.

Guarantee: ``answer`` never resolves and never forwards a query; it is a
function of the query, the policy and the session's ``SyntheticNames``. A
name ``decide_dns`` allows gets a synthetic A record, the same one for the
whole session, so a connection to that address maps back to the name
(``name_for``) and is decided by name; a name it refuses gets NXDOMAIN and a
refusal for the proxy to record.
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from firstrun.policy.decision import Decision
from firstrun.policy.network import ATTESTATION_HOST, NetworkPolicy, decide_dns

# The reserved benchmarking range (RFC 2544): no real host answers from it.
SYNTHETIC_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")
# Short: a name's address never changes within a session, but a resolver
# inside must not keep it past the session.
TTL_S = 60
# The sandbox's own names: the attestation host answers, every other is
# NXDOMAIN and unrecorded.
_OWN_SUFFIX = "firstrun.invalid"
if TYPE_CHECKING:
    from types import ModuleType

    import dns.message
    import dns.rcode


def _dnspython() -> ModuleType:
    """dnspython, with every submodule the answers use imported (once; later calls are lookups)."""
    # Imported on first use: importing dnspython takes about 0.1 s, which a
    # session that resolves nothing never needs to wait for (see ``preload``).
    import dns.exception
    import dns.flags
    import dns.message
    import dns.opcode
    import dns.rcode
    import dns.rdataclass
    import dns.rdatatype
    import dns.rrset

    return dns


def preload() -> threading.Thread:
    """Import dnspython in a thread of its own, and return it (already started).

    The import mostly runs while the harness waits on the sandbox (the GIL
    is free then); an ``answer`` that comes first waits on the same module
    locks, so nothing is ever half-imported.
    """
    thread = threading.Thread(target=_dnspython, name="firstrun-dns-preload", daemon=True)
    thread.start()
    return thread


class SyntheticNames:
    """The session's name <-> synthetic address map; thread-safe, allocation in order."""

    def __init__(self, network: ipaddress.IPv4Network = SYNTHETIC_NETWORK) -> None:
        self._hosts = network.hosts()
        self._by_name: dict[str, ipaddress.IPv4Address] = {}
        self._by_address: dict[ipaddress.IPv4Address, str] = {}
        self._lock = threading.Lock()

    def address_for(self, name: str) -> ipaddress.IPv4Address | None:
        """The address standing for ``name`` (canonical); None once the range is used up."""
        with self._lock:
            found = self._by_name.get(name)
            if found is None:
                found = next(self._hosts, None)
                if found is None:
                    return None
                self._by_name[name] = found
                self._by_address[found] = name
            return found

    def name_for(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        with self._lock:
            return self._by_address.get(address)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class DnsAnswer:
    # None: nothing to send back (not even a header to answer).
    wire: bytes | None
    name: str | None = None
    qtype: str | None = None
    # Set when the name was refused: what the proxy records.
    refusal: Decision | None = None


def _reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> bytes:
    dns = _dnspython()
    response = dns.message.make_response(query)
    response.set_rcode(rcode)
    response.flags |= dns.flags.RA
    return response.to_wire()


def answer(wire: bytes, *, policy: NetworkPolicy, names: SyntheticNames) -> DnsAnswer:
    dns = _dnspython()
    try:
        query = dns.message.from_wire(wire)
    except dns.exception.DNSException:
        if len(wire) < 12:
            # Not even a header: nothing to answer.
            return DnsAnswer(wire=None)
        # The header is there: answer FORMERR under the same id, no question echoed.
        return DnsAnswer(wire=wire[:2] + b"\x81\x01" + b"\x00" * 8)
    if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
        return DnsAnswer(wire=_reply(query, dns.rcode.NOTIMP if query.opcode() != dns.opcode.QUERY
                                     else dns.rcode.FORMERR))
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    qtype = dns.rdatatype.to_text(question.rdtype)
    if question.rdclass != dns.rdataclass.IN:
        return DnsAnswer(wire=_reply(query, dns.rcode.REFUSED), name=name, qtype=qtype)
    own = name == _OWN_SUFFIX or name.endswith("." + _OWN_SUFFIX)
    if own and name != ATTESTATION_HOST:
        return DnsAnswer(wire=_reply(query, dns.rcode.NXDOMAIN), name=name, qtype=qtype)
    decision = None if own else decide_dns(policy, name)
    if decision is not None and not decision.allowed:
        return DnsAnswer(wire=_reply(query, dns.rcode.NXDOMAIN), name=name, qtype=qtype,
                         refusal=decision)
    response = dns.message.make_response(query)
    response.flags |= dns.flags.RA
    # Every other record type of an allowed name is an empty answer, so a
    # client falls back to IPv4.
    if question.rdtype == dns.rdatatype.A:
        address = names.address_for(name)
        if address is None:
            return DnsAnswer(wire=_reply(query, dns.rcode.SERVFAIL), name=name, qtype=qtype)
        response.answer.append(dns.rrset.from_text(question.name, TTL_S, "IN", "A", str(address)))
    return DnsAnswer(wire=response.to_wire(), name=name, qtype=qtype)
