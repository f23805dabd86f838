"""Whether a Docker daemon answers here, which Engine it is, and what that version implies.

Guarantee: the daemon is asked directly over its Unix socket (``GET /_ping``,
then ``GET /version``, parsed with h11), never guessed from a package name,
and a remote ``DOCKER_HOST`` is not dialled. The finding says either way
whether the Engine has the CVE-2024-29018 fix (an internal network's embedded
DNS forwarding names from the host); the namespace firewall closes it anyway.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping

import h11

from firstrun.fixes import apt_fix, as_root
from firstrun.sandbox.base import Capability

DOCKER_SOCKET = "/var/run/docker.sock"
_TIMEOUT_S = 3.0
# The first release of each maintained line with the CVE-2024-29018 fix.
# On an older daemon the leak is closed only by the run container's namespace firewall
# (``resources.firewall_rules``), never by ``--internal``.
DNS_LEAK_FIXED = ((26, 0, 0), (25, 0, 5), (23, 0, 11))


def socket_path(env: Mapping[str, str]) -> str | None:
    host = env.get("DOCKER_HOST", "")
    if not host:
        return DOCKER_SOCKET
    if host.startswith("unix://"):
        return host[len("unix://"):]
    return None


def engine_version(text: str) -> tuple[int, int, int] | None:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def dns_leak_fixed(version: tuple[int, int, int]) -> bool:
    """Whether Moby ``version`` has the CVE-2024-29018 fix (pure)."""
    if version >= DNS_LEAK_FIXED[0]:
        return True
    return any(version[:2] == fixed[:2] and version >= fixed for fixed in DNS_LEAK_FIXED[1:])


class _NoAnswer(Exception):
    pass


def _get(path: str, target: str) -> tuple[int, bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_TIMEOUT_S)
        sock.connect(path)
        conn = h11.Connection(h11.CLIENT)
        sock.sendall(conn.send(h11.Request(method="GET", target=target,
                                           headers=[("Host", "docker")]))
                     + conn.send(h11.EndOfMessage()))
        status, body = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, body
            elif isinstance(event, h11.ConnectionClosed):
                raise _NoAnswer("closed before a response")


def probe_daemon(env: Mapping[str, str], *, judge: bool = True) -> Capability:
    """The ``docker daemon`` capability: reachable or not, with the Engine version judged.

    ``judge`` False asks only whether it answers its ping: what a session's
    start needs, the sweep's probe having judged the Engine.
    """
    path = socket_path(env)
    if path is None:
        return Capability(
            name="docker daemon", available=False,
            detail=f"DOCKER_HOST={env.get('DOCKER_HOST')!r} is not a unix:// socket; "
                   "remote daemons are not dialled",
            fix="point DOCKER_HOST at a local socket (unix:///var/run/docker.sock)")
    try:
        status, _ = _get(path, "/_ping")
        if status == 200 and judge:
            status, body = _get(path, "/version")
    except FileNotFoundError:
        return Capability(name="docker daemon", available=False, detail=f"no socket at {path}",
                          fix=f"{apt_fix('docker.io')} && {as_root('systemctl start docker')} "
                              "(or start dockerd yourself)")
    except PermissionError:
        return Capability(
            name="docker daemon", available=False, detail=f"{path}: permission denied",
            fix="add your user to the docker group (usermod -aG docker "
                f"{os.environ.get('USER', '$USER')}) and log in again")
    except (OSError, h11.ProtocolError, _NoAnswer) as exc:
        return Capability(name="docker daemon", available=False,
                          detail=f"{path}: no answer ({exc.__class__.__name__}: {exc})",
                          fix="start the daemon: systemctl start docker (or dockerd)")
    if status != 200:
        return Capability(name="docker daemon", available=False,
                          detail=f"{path}: answered {status}",
                          fix="check the daemon's log: journalctl -u docker")
    if not judge:
        return Capability(name="docker daemon", available=True, detail=f"answers on {path}")
    try:
        shown = str(json.loads(body)["Version"])
    except (ValueError, KeyError, TypeError):
        shown = "unknown"
    version = engine_version(shown)
    mitigated = ("mitigated: each run container's namespace firewall drops the embedded DNS "
                 "(127.0.0.11), attested per session")
    if version is None:
        judged = f"version unreadable, so the CVE-2024-29018 DNS leak is assumed open; {mitigated}"
    elif dns_leak_fixed(version):
        judged = "has the CVE-2024-29018 fix (the namespace firewall drops the embedded DNS too)"
    else:
        judged = ("predates the CVE-2024-29018 fix (an internal network's embedded DNS "
                  f"forwards names from the host); {mitigated}")
    return Capability(name="docker daemon", available=True,
                      detail=f"answers on {path}; Engine {shown}, {judged}")
