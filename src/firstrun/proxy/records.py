"""One canonical record per egress decision, within a budget that fails closed.

Guarantee: every request and tunnel the proxy forwarded anything for becomes
exactly one ``EgressRecord``, and so does every refusal until the record
budget is spent; after that a refusal is counted, and the count is the last
record. Each record is appended to the JSONL file as one complete line and
flushed before ``append`` returns, under a lock, so a reader never sees half
a record or two interleaved, and a crash loses none that were appended.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import IO

from firstrun.errors import ProxyError
from firstrun.policy.decision import DecisionLayer, Reason, Verdict
from firstrun.policy.network import Channel


def iso(epoch: float) -> str:
    """``epoch`` as every record writes a time (an egress record's, a run's): UTC, ms, ``Z``."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def now_iso() -> str:
    return iso(time.time())


class Scheme(StrEnum):
    HTTP = "http"
    HTTPS_TUNNEL = "https-tunnel"
    # A request the proxy decrypted inside a tunnel (--inspect-tls).
    HTTPS = "https"
    # Transparent capture: plain HTTP and raw streams redirected to the
    # proxy, a name the DNS stub refused, a datagram that was not DNS.
    HTTP_TUNNEL = "http-tunnel"
    TCP = "tcp"
    DNS = "dns"
    UDP = "udp"


class Capture(StrEnum):
    """How a flow reached the proxy: asked for it (the proxy variables), or redirected."""

    PROXY = "proxy"
    TRANSPARENT = "transparent"


class TunnelEnd(StrEnum):
    """How a carried tunnel ended: the first thing that ended either direction.

    A clean close by either side (its EOF) is how every tunnel ends; a reset
    is an error on that side's socket; ``refused`` is the first-flight check
    closing it (the record says why); the proxy ends a tunnel still open when
    it stops, and ends one it could not carry (no thread for its pumps).
    """

    CLIENT_CLOSED = "client_closed"
    UPSTREAM_CLOSED = "upstream_closed"
    CLIENT_RESET = "client_reset"
    UPSTREAM_RESET = "upstream_reset"
    REFUSED = "refused"
    PROXY_STOPPED = "proxy_stopped"
    PROXY_FAILED = "proxy_failed"


def tunnel_cut(ended: TunnelEnd | None, bytes_down: int) -> bool:
    """Whether the boundary's side cut a tunnel: what followed it is no evidence about the docs.

    The proxy failed to carry it, or the upstream reset it, or the upstream
    closed it, or the client gave up on it (a reset), before any byte came
    down: a TLS handshake that never finished. A client's own close, a
    refusal (recorded as one) and the proxy's stop at the session's end are
    not cuts.
    """
    if ended in (TunnelEnd.PROXY_FAILED, TunnelEnd.UPSTREAM_RESET):
        return True
    return ended in (TunnelEnd.UPSTREAM_CLOSED, TunnelEnd.CLIENT_RESET) and bytes_down == 0


@dataclass(frozen=True, kw_only=True)
class EgressRecord:
    ts: str
    id: str
    channel: Channel
    # None when the request was too malformed to have one.
    method: str | None
    scheme: Scheme | None
    host: str | None
    port: int | None
    # Plain HTTP and decrypted requests show a path; a tunnel's payload is opaque.
    path: str | None
    decision: Verdict
    reason: Reason
    layer: DecisionLayer
    would_deny: Reason | None
    override: str | None
    resolved: str | None
    # None for a tunnel closed after it was established (SNI mismatch) or a
    # client gone before any answer.
    status: int | None
    bytes_up: int
    bytes_down: int
    duration_ms: float
    # Names of the credentials whose placeholder the proxy swapped for the
    # real value in this request; never a value.
    credentials: tuple[str, ...] = ()
    # Only on the record_budget_exhausted record: how many requests were
    # refused after the budget was spent and so left no record of their own.
    # Absent from every other record's data.
    unrecorded: int | None = None
    capture: Capture = Capture.PROXY
    # Only on a carried tunnel's record: how it ended (``cut`` in its data
    # follows from it and ``bytes_down``). Absent from every other record's data.
    ended: TunnelEnd | None = None

    @property
    def denied(self) -> bool:
        return self.decision is Verdict.DENY

    @property
    def cut(self) -> bool:
        return tunnel_cut(self.ended, self.bytes_down)

    def to_data(self) -> dict[str, object]:
        return {
            "ts": self.ts,
            "id": self.id,
            "channel": self.channel.value,
            "method": self.method,
            "scheme": self.scheme.value if self.scheme is not None else None,
            "host": self.host,
            "port": self.port,
            "path": self.path,
            "decision": self.decision.value,
            "reason": self.reason.value,
            "layer": self.layer.value,
            "would_deny": self.would_deny.value if self.would_deny is not None else None,
            "override": self.override,
            "resolved": self.resolved,
            "status": self.status,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration_ms": self.duration_ms,
            "credentials": list(self.credentials),
            "capture": self.capture.value,
        } | ({"unrecorded": self.unrecorded} if self.unrecorded is not None else {}) \
          | ({"ended": self.ended.value, "cut": self.cut} if self.ended is not None else {})

    def to_json(self) -> str:
        return json.dumps(self.to_data(), separators=(",", ":"), sort_keys=False)

    @classmethod
    def from_data(cls, data: Mapping[str, object]) -> EgressRecord:
        """The record ``to_data`` gave, back (a proxy sidecar's record line).

        Field by field over the dataclass, so a field added to the record is
        carried, not dropped; a missing, unknown-valued or mistyped field is a
        ``ProxyError``, never a record with a guessed value.
        """
        values: dict[str, object] = {}
        try:
            for f in fields(cls):
                if f.name not in data:
                    if f.default is not MISSING:
                        continue
                    raise ValueError(f"field {f.name!r} is missing")
                value = data[f.name]
                enum = _ENUM_FIELDS.get(f.name)
                if enum is not None and value is not None:
                    value = enum(value)
                elif f.name == "credentials":
                    if not isinstance(value, list | tuple) or not all(
                            isinstance(v, str) for v in value):
                        raise ValueError("field 'credentials' is not a list of names")
                    value = tuple(value)
                elif f.name == "unrecorded" and (
                        isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise ValueError("field 'unrecorded' is not a count")
                values[f.name] = value
            return cls(**values)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ProxyError(f"a malformed egress record: {exc}", who="proxy") from exc


# Record fields whose data form is an enum's value.
_ENUM_FIELDS: Mapping[str, type[StrEnum]] = {
    "channel": Channel, "scheme": Scheme, "decision": Verdict, "reason": Reason,
    "layer": DecisionLayer, "would_deny": Reason, "capture": Capture, "ended": TunnelEnd,
}


# A quickstart makes tens to thousands of requests: these bound a flood, not a run.
DEFAULT_MAX_RECORDS = 100_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


# The budget: ``RecordLog`` holds ``max_records`` records and ``max_bytes``
# bytes of JSONL. The proxy ``reserve``s a request's record before it forwards
# anything; the first reservation (or unreserved refusal, ``offer``) the budget
# cannot take spends it for good, and from then on every request is refused
# unforwarded and only counted. ``close`` then writes the one closing record
# (decision deny, reason ``record_budget_exhausted``) whose ``unrecorded``
# field is that count; it is the one record past the budget. A budget that was
# filled but refused nothing gets no closing record. Past the budget, only
# traffic that already went out is still written: the records of requests
# under way when it filled (each holds a reservation, so the count bound is
# exact for them; the byte bound is overshot by at most one record each), and
# the inner requests of a TLS-inspected tunnel already open, which the proxy
# ends after its current request (see ``EgressProxy``).
class RecordLog:
    """Records in memory, and appended to ``path`` when one is given; bounded (see above).

    ``on_record`` sees every record as it is appended, in append order (it is
    called under the lock), so a subscriber's copy is complete and ordered. It
    must not raise or block: it runs on the proxy's own thread. The in-memory
    list and ``on_record`` are bounded by the same budget as the file.
    """

    def __init__(
        self, path: str | None, *, on_record: Callable[[EgressRecord], None] | None = None,
        max_records: int = DEFAULT_MAX_RECORDS, max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ProxyError(
                f"the record budget must allow at least one record and one byte "
                f"(max_records={max_records}, max_bytes={max_bytes}); "
                f"raise ProxyLimits.max_records or max_record_bytes"
            )
        self._lock = threading.Lock()
        self._records: list[EgressRecord] = []
        self._on_record = on_record
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._written_bytes = 0
        self._reserved = 0
        self._unrecorded = 0
        # Set by the first refused reservation, never cleared: fail closed for good.
        self._spent_at: float | None = None
        self._spent_channel: Channel | None = None
        self._final_written = False
        self._file: IO[str] | None = (
            open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115
        )

    def has_room(self) -> bool:
        """Whether a ``reserve`` now would succeed (without spending the budget if not)."""
        with self._lock:
            return self._spent_at is None and not self._full()

    def reserve(self, channel: Channel) -> bool:
        """Hold one record's place before forwarding anything; False when the budget is spent.

        A True must be followed by exactly one ``append(record, reserved=True)``
        or ``release()``.
        """
        with self._lock:
            if self._spend_if_full(channel):
                return False
            self._reserved += 1
            return True

    def release(self) -> None:
        """Give back a reservation whose exchange ended with nothing to record."""
        with self._lock:
            self._reserved -= 1

    def append(self, record: EgressRecord, *, reserved: bool = False) -> None:
        """Write ``record`` whatever the budget says: it stands for traffic that already went out.

        ``reserved`` consumes a place ``reserve`` held for it.
        """
        with self._lock:
            if reserved:
                self._reserved -= 1
            self._write(record)

    def offer(self, record: EgressRecord) -> bool:
        """Write a refusal that forwarded nothing if the budget allows; else count it unrecorded."""
        with self._lock:
            if self._spend_if_full(record.channel):
                self._unrecorded += 1
                return False
            self._write(record)
            return True

    def _spend_if_full(self, channel: Channel) -> bool:
        """Under the lock: whether the budget is spent, spending it now if it is full."""
        if self._spent_at is None and self._full():
            self._spent_at = time.monotonic()
            self._spent_channel = channel
        return self._spent_at is not None

    def _full(self) -> bool:
        return (len(self._records) + self._reserved >= self._max_records
                or self._written_bytes >= self._max_bytes)

    def _write(self, record: EgressRecord) -> None:
        line = record.to_json() + "\n"
        self._records.append(record)
        self._written_bytes += len(line.encode())
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
        if self._on_record is not None:
            self._on_record(record)

    def _final(self) -> EgressRecord:
        assert self._spent_at is not None and self._spent_channel is not None
        return EgressRecord(
            ts=now_iso(), id=uuid.uuid4().hex, channel=self._spent_channel, method=None,
            scheme=None, host=None, port=None, path=None, decision=Verdict.DENY,
            reason=Reason.RECORD_BUDGET_EXHAUSTED, layer=DecisionLayer.PROTOCOL, would_deny=None,
            override=None, resolved=None, status=None, bytes_up=0, bytes_down=0,
            # From the moment the budget was spent to the close.
            duration_ms=round((time.monotonic() - self._spent_at) * 1000, 3),
            unrecorded=self._unrecorded,
        )

    def snapshot(self) -> list[EgressRecord]:
        with self._lock:
            return list(self._records)

    def close(self) -> None:
        """Write the budget's one closing record if it was spent, then close the file."""
        with self._lock:
            if self._spent_at is not None and not self._final_written:
                self._write(self._final())
                self._final_written = True
            if self._file is not None:
                self._file.close()
                self._file = None
