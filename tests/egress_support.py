"""Egress records for tests: a typed record from a few data-form fields, and a saved line.

``egress_record`` fills every field a test does not care about and parses the
rest as a sidecar's line is parsed, so ``reason="not_allowed"`` reads as the
enum. ``SavedEgress`` writes an egress line as an older or hostile trace may
hold it, fields missing or unknown, for the readers of saved traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from firstrun.proxy.records import EgressRecord
from firstrun.run.events import Event

_BASE: dict[str, object] = {
    "ts": "2026-01-01T00:00:00.000Z", "id": "r", "channel": "shell", "method": "CONNECT",
    "scheme": "https-tunnel", "host": "example.test", "port": 443, "path": None,
    "decision": "deny", "reason": "not_allowed", "layer": "allowlist", "would_deny": None,
    "override": None, "resolved": None, "status": None, "bytes_up": 0, "bytes_down": 0,
    "duration_ms": 0.0,
}


def egress_record(**fields: object) -> EgressRecord:
    return EgressRecord.from_data(_BASE | fields)


@dataclass(frozen=True, kw_only=True)
class SavedEgress(Event):
    kind: ClassVar[str] = "egress"
    record: dict[str, Any]
