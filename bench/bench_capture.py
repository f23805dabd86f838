#!/usr/bin/env python3
"""A new connection through transparent capture, against one through the proxy variables.

Guarantee: both arms run in one linux session, behind one proxy, against
one HTTP server on the host's loopback (which an override lets the fixture
name reach), with the same client code inside the sandbox; the only
difference is the path. The proxy-aware arm connects to the relay at
127.0.0.1:3128 and sends an absolute-form GET; the transparent arm dials
the address the sandbox's DNS stub gave the name (resolved once, before the
clock) and sends an origin-form GET, which the nat rules redirect to the
relay and the proxy maps back to the name. Each connection is new, carries
one request with ``Connection: close`` and is read to its end. The arms
alternate in rounds, so load from anything else falls on both alike; each
figure is the median time of one connection over every round. The bar: the
transparent path costs at most 1.5 times the proxy-aware one.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import tempfile
import threading

ROUNDS = 10
PER_ROUND = 30
BAR = 1.5
HOST = "bench-capture.test"

CLIENT = r"""
import json, socket, statistics, sys, time
mode, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host = "bench-capture.test"
if mode == "proxy":
    target = ("127.0.0.1", 3128)
    request = f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
else:
    target = (socket.getaddrinfo(host, port, socket.AF_INET)[0][4][0], port)
    request = f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
times = []
for _ in range(count):
    started = time.perf_counter()
    with socket.create_connection(target, timeout=10) as s:
        s.sendall(request.encode())
        body = b""
        while chunk := s.recv(65536):
            body += chunk
    if not body.startswith(b"HTTP/1.1 200") and not body.startswith(b"HTTP/1.0 200"):
        raise SystemExit(f"{mode}: {body[:100]!r}")
    times.append(time.perf_counter() - started)
print(json.dumps(times))
"""


class _Quiet(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main(rounds: int = ROUNDS, per_round: int = PER_ROUND) -> dict[str, dict[str, object]]:
    import ipaddress
    import statistics

    from firstrun.enclosure import ProxySetup, open_enclosure
    from firstrun.policy.network import NetworkPolicy
    from firstrun.policy.profile import SandboxProfile
    from firstrun.sandbox.hostfs import host_filesystem_policy
    from firstrun.sandbox.select import entry

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def resolver(host: str, _port: int) -> list:
        return [ipaddress.ip_address("127.0.0.1")] if host == HOST else []

    policy = NetworkPolicy.build(overrides=[(f"{HOST}:{port}", ["127.0.0.1/32"])])
    workspace = tempfile.mkdtemp(prefix="firstrun-bench-capture-")
    samples: dict[str, list[float]] = {"proxy": [], "transparent": []}
    try:
        profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ, protect=False),
                                 net=policy)
        with open_enclosure(entry("linux"), profile,
                            ProxySetup(env=os.environ, resolver=resolver)) as enclosure:
            session = enclosure.start()
            for index in range(rounds):
                arms = ("proxy", "transparent") if index % 2 == 0 else ("transparent", "proxy")
                for arm in arms:
                    result = session.exec(["python3", "-c", CLIENT, arm, str(port),
                                           str(per_round)], timeout=300)
                    if result.exit_code != 0:
                        raise RuntimeError(f"{arm}: {result.stderr.text()[-300:]}")
                    samples[arm] += json.loads(result.stdout.text())
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(workspace, ignore_errors=True)
    proxied = statistics.median(samples["proxy"]) * 1e3
    transparent = statistics.median(samples["transparent"]) * 1e3
    return {
        "new_connection_proxy_aware": {"value": proxied, "unit": "ms", "better": "lower"},
        "new_connection_transparent": {"value": transparent, "unit": "ms", "better": "lower",
                                       "baseline": "new_connection_proxy_aware", "bar": BAR},
    }


if __name__ == "__main__":
    for name, figure in main().items():
        print(f"{name}: {figure['value']:.3f} {figure['unit']}")
