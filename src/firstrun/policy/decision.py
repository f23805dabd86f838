"""What an egress decision is: its verdict, the layer that decided, the reason, as data.

Guarantee: every egress decision in firstrun, by the name rules
(``policy.network``), by what a decrypted request may do (``policy.methods``)
or by the proxy's own protocol checks, is a ``Decision`` over these enums, and
each ``Reason`` value is a stable key that results and statistics group on.
No logic lives here, so both deciding modules import it and neither imports
the other. Pure: stdlib only, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class DecisionLayer(StrEnum):
    FLOOR = "floor"
    ATTRIBUTION = "attribution"
    OVERRIDE = "override"
    ALLOWLIST = "allowlist"
    DEFAULT = "default"
    PROTOCOL = "protocol"
    # What a decrypted request may do at an allowed host (policy.methods).
    METHODS = "methods"


class Reason(StrEnum):
    """Stable keys: results and statistics group on these, never rename one."""

    ALLOWED_BY_LIST = "allowed_by_list"
    ALLOWED_BY_OVERRIDE = "allowed_by_override"
    ALLOWED_DOCS_CHANNEL = "allowed_docs_channel"
    ALLOWED_DOCS_HOST_ON_SHELL = "allowed_docs_host_on_shell"
    # An agent CLI's own traffic to its API host (``network.Channel.AGENT``).
    ALLOWED_AGENT_CHANNEL = "allowed_agent_channel"
    # A docs host fetched from the sandbox, answered by the docs reader (``serve_docs``).
    ALLOWED_AS_PAGE_READ = "allowed_as_page_read"
    DOCS_HOST_ON_SHELL = "docs_host_on_shell"
    NOT_DOCS_HOST = "not_docs_host"
    NOT_ALLOWED = "not_allowed"
    DENIED_BY_LIST = "denied_by_list"
    PORT_NOT_ALLOWED = "port_not_allowed"
    IP_LITERAL = "ip_literal"
    # Transparent capture: a name the stub would not answer, a raw stream no
    # ``tcp`` rule covers, a datagram that is not DNS.
    DNS_NOT_ALLOWED = "dns_not_allowed"
    TCP_NOT_ALLOWED = "tcp_not_allowed"
    UDP_NOT_ALLOWED = "udp_not_allowed"
    ALLOWED_BY_TCP_RULE = "allowed_by_tcp_rule"
    INVALID_HOST = "invalid_host"
    RESOLVED_LOOPBACK = "resolved_loopback"
    RESOLVED_PRIVATE = "resolved_private"
    RESOLVED_LINK_LOCAL = "resolved_link_local"
    RESOLVED_METADATA = "resolved_metadata"
    RESOLVED_CGNAT = "resolved_cgnat"
    RESOLVED_MULTICAST = "resolved_multicast"
    RESOLVED_UNSPECIFIED = "resolved_unspecified"
    RESOLVED_RESERVED = "resolved_reserved"
    RESOLVED_EMBEDDED_IPV4 = "resolved_embedded_ipv4"
    RESOLVE_FAILED = "resolve_failed"
    PROXY_ITSELF = "proxy_itself"
    ATTESTATION = "attestation"
    # Protocol-level refusals, decided by the proxy before any policy question.
    MALFORMED_REQUEST = "malformed_request"
    HEADERS_TOO_LARGE = "headers_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    SMUGGLING_SUSPECTED = "smuggling_suspected"
    SNI_MISMATCH = "sni_mismatch"
    ENCRYPTED_CLIENT_HELLO = "encrypted_client_hello"
    HOST_MISMATCH = "host_mismatch"
    UNSUPPORTED_METHOD = "unsupported_method"
    UPSTREAM_FAILED = "upstream_failed"
    # The proxy's record budget is spent: what it cannot record, it refuses.
    RECORD_BUDGET_EXHAUSTED = "record_budget_exhausted"
    # Inside an intercepted tunnel (--inspect-tls): see policy.methods.
    ALLOWED_READ_ONLY = "allowed_read_only"
    ALLOWED_BY_METHOD_RULE = "allowed_by_method_rule"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "body_too_large"
    TLS_REQUIRED = "tls_required"
    CLIENT_TLS_FAILED = "client_tls_failed"
    UPSTREAM_CERTIFICATE_INVALID = "upstream_certificate_invalid"


@dataclass(frozen=True, kw_only=True)
class Decision:
    verdict: Verdict
    reason: Reason
    layer: DecisionLayer
    host: str = ""
    would_deny: Reason | None = None
    override: str | None = field(default=None)

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW
