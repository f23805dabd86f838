#!/usr/bin/env python3
"""Requests through TLS inspection against the proxy's plain path, in one run.

Guarantee: both arms go through the same configuration of firstrun's
``EgressProxy`` (a policy with inspection rules, an ``Interception`` from
``prepare_interception`` that trusts the run's throwaway CA upstream, an
override letting the fixture's name reach loopback; a fresh proxy per
measurement) to the same nginx (``loopback.nginx``, with TLS on a second
port under a certificate from a CA made for this run), with the same client
(``proxy_client.py``'s ``keepalive`` role): ``CONNECTIONS`` clients at once,
each on one kept-alive connection sending 1 KiB GETs one after another for
``SECONDS``. The intercepted arm opens each connection with a CONNECT to
nginx's TLS port and TLS inside it (the client trusting the bundle
``prepare_interception`` wrote, whose CA the proxy's leaf chains to); the
plain arm sends absolute-form GETs to nginx's plain port. Connection set-up
is outside the clock. The arms alternate over ``TRIALS`` rounds, and each
figure is the median of the rounds' rates (the sum of every client's
requests per second of its own run). The bar (issue 16): intercepted at
least 0.5x the plain path.

Needs nginx (``scripts/install --with-bench-deps``). All traffic stays on
127.0.0.1; the CA keys live in memory or under a temporary directory removed
at the end; every child is bounded by a timeout and stopped by its pid.
"""

from __future__ import annotations

import ipaddress
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from loopback import BODY, HOST_NAME, nginx, stop, throwaway_ca
from proxy_client import launch

SECONDS = 3
TRIALS = 5
CONNECTIONS = 4
BAR = 0.5
# Far above what one measurement records; the default bounds a quickstart, not a load test.
MAX_RECORDS = 2_000_000
MAX_RECORD_BYTES = 2 << 30


def main(trials: int = TRIALS) -> dict[str, dict[str, object]]:
    from firstrun.policy.methods import InspectionPolicy
    from firstrun.policy.network import Channel, NetworkPolicy
    from firstrun.proxy.intercept import prepare_interception
    from firstrun.proxy.server import EgressProxy, ProxyLimits

    if shutil.which("nginx") is None:
        raise RuntimeError("bench_intercept needs nginx: run scripts/install --with-bench-deps")

    async def resolve(_host: str, _port: int) -> list[ipaddress.IPv4Address]:
        return [ipaddress.IPv4Address("127.0.0.1")]

    samples: dict[str, list[float]] = {"plain": [], "intercepted": []}
    refused: list[str] = []
    with tempfile.TemporaryDirectory(prefix="firstrun-bench-intercept-") as top:
        for sub in ("ca", "nginx", "proxy"):
            Path(top, sub).mkdir(mode=0o700)
        cert = throwaway_ca(Path(top, "ca"))
        origin = nginx(Path(top, "nginx"), tls=cert)
        try:
            assert origin.tls_port is not None
            # Uploads are refused unless a rule allows them; GETs pass as reads, so
            # this rule is consulted by neither arm but keeps the policy a real one.
            inspection = InspectionPolicy.build(
                rules=[(f"{HOST_NAME}:{origin.tls_port}", ["POST"], "/upload/")])
            policy = NetworkPolicy.build(allow=(), overrides=[
                (f"{HOST_NAME}:{origin.port}", ["127.0.0.1/32"]),
                (f"{HOST_NAME}:{origin.tls_port}", ["127.0.0.1/32"]),
            ]).with_inspection(inspection)
            interception, trust = prepare_interception(
                inspection, env={}, bundle_dir=str(Path(top, "proxy")),
                extra_cafiles=[str(cert.cafile)])
            limits = ProxyLimits(max_records=MAX_RECORDS, max_record_bytes=MAX_RECORD_BYTES)
            common = {"host": HOST_NAME, "path": "/1k", "body": BODY, "count": 10_000_000,
                      "seconds": SECONDS}
            arms: dict[str, dict[str, Any]] = {
                "plain": {**common, "via": "absolute", "port": origin.port},
                "intercepted": {**common, "via": "tls", "port": origin.tls_port, "cafile": trust},
            }
            for _ in range(trials):
                for arm, spec in arms.items():
                    with EgressProxy(policy, resolver=resolve, limits=limits,
                                     interception=interception) as proxy:
                        address = list(proxy.listen_tcp(Channel.SHELL))
                        results = launch("keepalive", {**spec, "proxy": address}, CONNECTIONS)
                    samples[arm].append(sum(r["requests"] / (r["end"] - r["start"])
                                            for r in results))
                    refused.extend(f"{r.reason} {r.method} {r.host}:{r.port}"
                                   for r in proxy.records() if r.denied)
        finally:
            stop(origin.process)
    if refused:
        raise RuntimeError(f"the proxy refused the bench ({len(refused)} records): {refused[0]}")
    return {
        "plain_rps": {"value": statistics.median(samples["plain"]), "unit": "req/s",
                      "better": "higher"},
        "intercepted_rps": {"value": statistics.median(samples["intercepted"]), "unit": "req/s",
                            "better": "higher", "baseline": "plain_rps", "bar": BAR},
    }


if __name__ == "__main__":
    result = main()
    for name, fig in result.items():
        print(f"{name:16s} {fig['value']:10.1f} {fig['unit']}")
    print(f"ratio            {result['intercepted_rps']['value'] / result['plain_rps']['value']:10.2f}x "
          f"(bar >= {BAR}x)")
    sys.exit(0)
