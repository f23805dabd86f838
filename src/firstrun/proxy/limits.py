"""The proxy's bounds: sizes, timeouts, connection slots and the record budget.

Guarantee: every bound the proxy and its drivers (``clients``, ``intercept``,
``wire``) apply comes from one ``ProxyLimits``, so a test or a backend that
tightens one tightens it everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from firstrun.proxy.records import DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS


@dataclass(frozen=True, kw_only=True)
class ProxyLimits:
    max_head_bytes: int = 64 * 1024
    # From a request's first byte to the end of its head: the slowloris bound.
    head_timeout_s: float = 10.0
    # Waiting for the next request on a kept-alive connection, or for body
    # bytes, or for the client to take our bytes.
    idle_timeout_s: float = 120.0
    resolve_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    upstream_timeout_s: float = 300.0
    # Open client connections per listener; more wait in the listen backlog.
    max_connections: int = 128
    backlog: int = 128
    # After a refusal, how long and how much unread input the proxy drains so
    # the client reads the 4xx instead of a reset (a "lingering close").
    linger_timeout_s: float = 2.0
    linger_bytes: int = 1 << 20
    # The record budget, per proxy: every listener shares it (see records).
    max_records: int = DEFAULT_MAX_RECORDS
    max_record_bytes: int = DEFAULT_MAX_BYTES
