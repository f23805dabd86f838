"""The egress proxy as a process of its own: the Docker backend's sidecar.

Guarantee: the sidecar enforces exactly the policy the harness serialized
with ``NetworkPolicy.to_data`` (parsed back by ``policy_from_data`` through
the same ``NetworkPolicy.build`` every other policy goes through, so an entry
the harness could not have built is refused here too), never one assembled
from comma-separated environment strings. It runs the very ``EgressProxy``
the linux backend uses. Its stdout is a stream of JSON lines: first one
``ready`` line with the listening address and the attestation nonce, then
one ``record`` line per egress record, flushed as it is written, so the
harness can put each record in the trace live. SIGTERM or SIGINT stops it
after the proxy delivered its last records.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Mapping
from typing import IO

from firstrun.errors import FirstrunError, PolicyError
from firstrun.policy.network import Channel, Mode, NetworkPolicy
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.server import EgressProxy


def policy_from_data(data: Mapping[str, object]) -> NetworkPolicy:
    """The inverse of ``NetworkPolicy.to_data``; malformed data is a ``PolicyError``."""
    def strings(value: object) -> list[str]:
        # A list, never a delimited string: "a.com,b.com" must not be split here.
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"expected a list of strings, got {value!r}")
        return value

    if "inspection" in data:
        # The sidecar has no run CA to decrypt with: inspecting there would
        # need one inside the container's reach, so it refuses instead.
        raise PolicyError("sidecar policy: TLS inspection is not supported by the Docker sidecar")
    try:
        overrides = []
        for o in data["overrides"]:  # type: ignore[attr-defined]
            overrides.append((strings([o["pattern"]])[0], strings(o["networks"])))
        return NetworkPolicy.build(
            allow=strings(data["allow"]),
            deny=strings(data["deny"]),
            docs=strings(data["docs"]),
            overrides=overrides,
            mode=Mode(data["mode"]),
            source="sidecar policy",
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyError(f"sidecar policy: malformed policy data ({exc!r})") from None


def _emit(out: IO[str], lock: threading.Lock, message: dict[str, object]) -> None:
    with lock:
        out.write(json.dumps(message, separators=(",", ":")) + "\n")
        out.flush()


def serve(policy: NetworkPolicy, *, host: str, port: int, out: IO[str],
          stop: threading.Event) -> None:
    """Listen on ``host:port`` (shell channel) until ``stop`` is set, streaming to ``out``."""
    lock = threading.Lock()

    def on_record(record: EgressRecord) -> None:
        _emit(out, lock, {"event": "record", "record": record.to_data()})

    with EgressProxy(policy, on_record=on_record) as proxy:
        address = proxy.listen_tcp(Channel.SHELL, host=host, port=port)
        _emit(out, lock, {"event": "ready", "address": list(address), "nonce": proxy.nonce})
        stop.wait()


def main(argv: list[str]) -> int:
    """``python -m firstrun.proxy HOST PORT`` with ``{"policy": ...}`` as JSON on stdin."""
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m firstrun.proxy HOST PORT < policy.json", file=sys.stderr)
        return 3
    try:
        policy = policy_from_data(json.load(sys.stdin)["policy"])
    except (ValueError, KeyError, TypeError, PolicyError) as exc:
        print(f"firstrun.proxy: cannot read the policy from stdin: {exc}", file=sys.stderr)
        return 3
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve(policy, host=argv[0], port=int(argv[1]), out=sys.stdout, stop=stop)
    except FirstrunError as exc:
        print(f"firstrun.proxy: {exc}", file=sys.stderr)
        return 1
    return 0
