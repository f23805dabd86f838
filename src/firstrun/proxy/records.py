"""One canonical record per egress decision.

Guarantee: every request and every tunnel the proxy handled, allowed or
refused (malformed input included), becomes exactly one ``EgressRecord``. It
is appended to the JSONL file as one complete line and flushed before
``append`` returns, so a reader never sees half a record and a crash loses
none that were appended. Appends are serialised by a lock, so records from
the event loop and from tunnel threads never interleave.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import IO

from firstrun.errors import ProxyError
from firstrun.policy.network import Channel, Layer, Reason, Verdict


def now_iso() -> str:
    """A record's timestamp: UTC, milliseconds, ``Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Scheme(StrEnum):
    HTTP = "http"
    HTTPS_TUNNEL = "https-tunnel"
    # A request the proxy decrypted inside a tunnel (--inspect-tls).
    HTTPS = "https"


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
    layer: Layer
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

    @property
    def denied(self) -> bool:
        return self.decision is Verdict.DENY

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
        }

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
                values[f.name] = value
            return cls(**values)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ProxyError(f"a malformed egress record: {exc}", who="proxy") from exc


# Record fields whose data form is an enum's value.
_ENUM_FIELDS: Mapping[str, type[StrEnum]] = {
    "channel": Channel, "scheme": Scheme, "decision": Verdict, "reason": Reason,
    "layer": Layer, "would_deny": Reason,
}


class RecordLog:
    """Records in memory, and appended to ``path`` when one is given.

    ``on_record`` sees every record as it is appended, in append order (it is
    called under the lock), so a subscriber's copy is complete and ordered. It
    must not raise or block: it runs on the proxy's own thread.
    """

    def __init__(
        self, path: str | None, *, on_record: Callable[[EgressRecord], None] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._records: list[EgressRecord] = []
        self._on_record = on_record
        self._file: IO[str] | None = (
            open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115
        )

    def append(self, record: EgressRecord) -> None:
        line = record.to_json() + "\n"
        with self._lock:
            self._records.append(record)
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            if self._on_record is not None:
                self._on_record(record)

    def snapshot(self) -> list[EgressRecord]:
        with self._lock:
            return list(self._records)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
