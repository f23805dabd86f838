"""The egress proxy as a process of its own: the Docker backend's sidecar.

Guarantee: the sidecar runs the linux backend's own ``EgressProxy`` on exactly
the policy the harness serialized (``NetworkPolicy.to_data``, rebuilt through
the same ``build`` methods: an entry the harness could not have built is
refused here too). Once that is read, stdout is JSON lines: ``ready`` (or
``refused``), then each record as written. Under TLS inspection the CA's
private key and the credential values never reach stdout.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import IO

from firstrun.errors import FirstrunError, PolicyError
from firstrun.policy.hosts import parse_patterns
from firstrun.policy.methods import InspectionPolicy
from firstrun.policy.network import Channel, Mode, NetworkPolicy
from firstrun.proxy.credentials import sandbox_variables
from firstrun.proxy.intercept import Interception, new_interception
from firstrun.proxy.records import EgressRecord
from firstrun.proxy.server import EgressProxy, ListenerKind


def policy_from_data(data: Mapping[str, object]) -> NetworkPolicy:
    """The inverse of ``NetworkPolicy.to_data``; malformed data is a ``PolicyError``."""
    def strings(value: object) -> list[str]:
        # A list, never a delimited string: "a.com,b.com" must not be split here.
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"expected a list of strings, got {value!r}")
        return value

    try:
        overrides = []
        for o in data["overrides"]:  # type: ignore[attr-defined]
            overrides.append((strings([o["pattern"]])[0], strings(o["networks"])))
        policy = NetworkPolicy.build(
            allow=strings(data["allow"]),
            deny=strings(data["deny"]),
            docs=strings(data["docs"]),
            shell_docs=strings(data["shell_docs"]),
            overrides=overrides,
            mode=Mode(data["mode"]),
            source="sidecar policy",
            tcp=strings(data.get("tcp", [])),
        )
        if data.get("serve_docs"):
            raise PolicyError("sidecar policy: serve_docs: the sidecar has no docs reader to "
                              "answer a docs host's requests with")
        if "agent" in data:
            policy = replace(policy, agent=parse_patterns(strings(data["agent"]),
                                                          source="sidecar policy agent"))
        if "inspection" not in data:
            return policy
        inspection = data["inspection"]
        rules = [(strings([r["host"]])[0], strings(r["methods"]), strings([r["path_prefix"]])[0])
                 for r in inspection["rules"]]  # type: ignore[index]
        credentials = [tuple(strings([c["name"], c["host"], c["from_env"]]))
                       for c in inspection["credentials"]]  # type: ignore[index]
        cap = inspection["max_body_bytes"]  # type: ignore[index]
        if type(cap) is not int:
            raise TypeError(f"max_body_bytes: expected an integer, got {cap!r}")
        scope = inspection.get("scope")  # type: ignore[attr-defined]
        return policy.with_inspection(InspectionPolicy.build(
            rules=rules, credentials=credentials,  # type: ignore[arg-type]
            max_body_bytes=cap, scope=None if scope is None else strings(scope),
            source="sidecar policy"))
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyError(f"sidecar policy: malformed policy data ({exc!r})") from None


def _emit(out: IO[str], lock: threading.Lock, message: dict[str, object]) -> None:
    with lock:
        out.write(json.dumps(message, separators=(",", ":")) + "\n")
        out.flush()


def serve(policy: NetworkPolicy, *, host: str, port: int, out: IO[str],
          stop: threading.Event, interception: Interception | None = None) -> None:
    """Listen on ``host:port`` (shell channel) until ``stop`` is set, streaming to ``out``.

    The next two ports take the run container's redirected flows (``port``
    + 1) and its DNS (``port`` + 2), from its helper alone (the container's
    firewall lets no other uid reach them).
    """
    lock = threading.Lock()

    # First one ``ready`` line with the listening address and the attestation
    # nonce, then one ``record`` line per egress record, flushed as it is
    # written, so the harness can put each record in the trace live.
    def on_record(record: EgressRecord) -> None:
        _emit(out, lock, {"event": "record", "record": record.to_data()})

    with EgressProxy(policy, on_record=on_record, interception=interception) as proxy:
        address = proxy.listen_tcp(Channel.SHELL, host=host, port=port)
        proxy.listen_tcp(Channel.SHELL, host=host, port=port + 1, kind=ListenerKind.TRANSPARENT)
        proxy.listen_tcp(Channel.SHELL, host=host, port=port + 2, kind=ListenerKind.DNS)
        ready: dict[str, object] = {"event": "ready", "address": list(address),
                                    "nonce": proxy.nonce}
        if interception is not None:
            # Public only: the certificate, and placeholders the sandbox holds anyway.
            ready["ca"] = interception.ca.cert_pem.decode("ascii")
            ready["placeholders"] = sandbox_variables(interception.credentials)
        _emit(out, lock, ready)
        stop.wait()


def _strings(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what}: expected a list of strings")
    return value


class Refusal(Exception):
    """A session this sidecar cannot serve as asked; ``args`` are the reason and the fix."""


def libs_mismatch(libs_python: object, here: tuple[int, int]) -> Refusal | None:
    """The refusal unless the harness's compiled libraries were built for this Python.

    The harness binds its own cryptography into this container, and its cffi
    backend is an extension module of one Python minor version: a sidecar on
    another cannot import it, so it says so before trying. A request that
    does not say which Python is refused too: the harness always says.
    """
    ours = f"{here[0]}.{here[1]}"
    if libs_python == ours:
        return None
    if not isinstance(libs_python, str):
        return Refusal("--inspect-tls on docker: the harness did not say which Python its "
                       "libraries were built for", "use a firstrun of the same version as "
                       "this image's sidecar modules (they are the harness's own, bound in)")
    default = " (firstrun images build makes firstrun/python:3.11)" if libs_python == "3.11" \
        else ""
    return Refusal(f"--inspect-tls on docker: the image's Python is {ours}, and the proxy "
                   f"sidecar cannot load the harness's cryptography, built for Python "
                   f"{libs_python}",
                   f"run the harness on Python {ours}, or give the run an image whose python3 "
                   f"is {libs_python}{default}")


# With TLS inspection the sidecar makes the run's CA itself: its private key
# exists only in this process's memory (``ca.RunCA``). Upstream servers are
# verified against the image's trust store plus the ``cafiles`` the harness
# names (bound read-only into the container). Credential values arrive on
# stdin only, never through the environment, and are minted into placeholders
# here. A sidecar whose Python is not the one the harness's bound libraries
# were built for says ``refused`` (reason and fix) instead of ``ready``, and
# loads nothing it could not.
def _interception(request: Mapping[str, object], policy: NetworkPolicy) -> Interception | None:
    if policy.inspection is None:
        return None
    refusal = libs_mismatch(request.get("libs_python"), sys.version_info[:2])
    if refusal is not None:
        raise refusal
    values = request.get("credentials", {})
    if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise TypeError("credentials: expected an object of strings")
    return new_interception(policy.inspection, env=values,
                            extra_cafiles=_strings(request.get("cafiles", []), "cafiles"))


def main(argv: list[str]) -> int:
    """``python -m firstrun.proxy HOST PORT`` with ``{"policy": ...}`` as JSON on stdin.

    Under inspection stdin may also carry ``credentials`` (harness variable
    name to value), ``cafiles`` (paths inside this container) and
    ``libs_python`` (the Python the bound libraries were built for).
    """
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m firstrun.proxy HOST PORT < policy.json", file=sys.stderr)
        return 3
    try:
        request = json.load(sys.stdin)
        policy = policy_from_data(request["policy"])
        interception = _interception(request, policy)
    except Refusal as refusal:
        reason, fix = refusal.args
        print(json.dumps({"event": "refused", "error": reason, "fix": fix}), flush=True)
        return 3
    except (ValueError, KeyError, TypeError, FirstrunError) as exc:
        print(f"firstrun.proxy: cannot read the policy from stdin: {exc}", file=sys.stderr)
        return 3
    # SIGTERM or SIGINT stops the sidecar after the proxy delivered its last records.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve(policy, host=argv[0], port=int(argv[1]), out=sys.stdout, stop=stop,
              interception=interception)
    except FirstrunError as exc:
        print(f"firstrun.proxy: {exc}", file=sys.stderr)
        return 1
    return 0
