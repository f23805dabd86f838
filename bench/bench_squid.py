#!/usr/bin/env python3
"""The egress proxy against squid, with the same clients against nginx on loopback, in one run.

Guarantee: every arm talks to the same nginx (``loopback.nginx``): straight
to it (``direct``), through squid (Debian's, a forward proxy with caching
off and no access log, its hosts file naming the fixture), and through
firstrun's ``EgressProxy`` (an override lets the fixture's name reach
loopback, as the other benches do; a fresh proxy per measurement, so its
record budget never runs out mid-run). Within each figure the arms run the
same client with the same settings, they alternate over ``TRIALS`` rounds
so load from anything else on the machine falls on all of them alike, and
each figure is the median over the rounds.

Figures and their bars (issue 16):

- keep-alive throughput: wrk (one thread) sending 1 KiB GETs for
  ``SECONDS``, in absolute form through a proxy as a client configured with
  one sends them, at 32 connections (firstrun at least 0.7x squid, p99 at
  most 20 ms), at one connection per core (at least 1.0x squid) and at one
  connection (no bar);
- the CPU each proxy spends per request at each of those counts (squid's
  process from /proc, firstrun's as this process's own, whose main thread
  only waits for wrk): no bar, it says where a miss comes from;
- a new tunnel and its first request: ``proxy_client.py``'s ``first`` role,
  which connects, sends CONNECT to nginx's ``host:port``, reads the ``200``,
  sends one GET with a Host naming the target, reads the whole 1 KiB
  response and closes (direct: the same without the CONNECT). One client
  in sequence (the median of each round's median latency) and
  ``FIRST_CONCURRENCY`` at once (wall time per tunnel, from the first
  client's start to the last one's end); each client opens ``FIRST_COUNT``
  tunnels. firstrun at most 1.2x squid's time in both.

Needs squid, nginx and wrk (``scripts/install --with-bench-deps``). All
traffic stays on 127.0.0.1; every child is bounded by a timeout and stopped
by its pid; every loop is bounded in count and time.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loopback import BODY, HOST_NAME, nginx, squid, stop
from proxy_client import launch

SECONDS = 4
TRIALS = 3
CORES = os.cpu_count() or 1
# (wrk connections, firstrun's bar against squid; None: no bar), most connections first;
# where two counts coincide the later, stricter bar stands.
THROUGHPUT = tuple(sorted({1: None, 32: 0.7, CORES: 1.0}.items(), reverse=True))
P99_LIMIT_MS = 20.0
P99_LIMIT_AT = 32
FIRST_TRIALS = 5
FIRST_COUNT = 200
FIRST_CONCURRENCY = 4
FIRST_SECONDS = 20
FIRST_BAR = 1.2
# Far above what one measurement records; the default bounds a quickstart, not a load test.
MAX_RECORDS = 2_000_000
MAX_RECORD_BYTES = 2 << 30
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _process_cpu(pid: int) -> float:
    """Seconds of CPU (user and system) process ``pid`` has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _wrk(url: str, connections: int, script: Path | None,
         cpu: Callable[[], float] | None = None) -> tuple[float, float, float | None]:
    """(requests per second, p99 latency in ms, the proxy's CPU per request in us, when
    ``cpu`` reads the proxy's CPU seconds) of one wrk run."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{SECONDS}s", "--latency", url]
    if script is not None:
        argv[1:1] = ["-s", str(script)]
    before = cpu() if cpu is not None else 0.0
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SECONDS + 60, check=False)
    used = cpu() - before if cpu is not None else None
    rps = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", done.stdout, re.MULTILINE)
    count = re.search(r"^\s+(\d+) requests in ", done.stdout, re.MULTILINE)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    if done.returncode != 0 or rps is None or p99 is None or count is None or errors is not None:
        raise RuntimeError(f"wrk {url} failed: {(done.stdout + done.stderr).strip()[-400:]}")
    per_request = used / max(int(count.group(1)), 1) * 1e6 if used is not None else None
    return float(rps.group(1)), float(p99.group(1)) * _UNITS[p99.group(2)], per_request


def _first(spec: dict[str, Any], processes: int) -> float:
    """Seconds per new connection and its first request: a median in sequence, wall time per
    connection when ``processes`` clients run at once."""
    results = launch("first", {**spec, "count": FIRST_COUNT, "seconds": FIRST_SECONDS}, processes)
    if processes == 1:
        return statistics.median(results[0]["latencies"])
    done = sum(len(r["latencies"]) for r in results)
    return (max(r["end"] for r in results) - min(r["start"] for r in results)) / done


def main(trials: int = TRIALS) -> dict[str, dict[str, object]]:
    from firstrun.policy.network import Channel, NetworkPolicy
    from firstrun.proxy.server import EgressProxy, ProxyLimits

    missing = [tool for tool in ("squid", "nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"bench_squid needs {', '.join(missing)}: run scripts/install "
                           "--with-bench-deps")

    async def resolve(_host: str, _port: int) -> list[ipaddress.IPv4Address]:
        return [ipaddress.IPv4Address("127.0.0.1")]

    refused: list[str] = []

    @contextmanager
    def firstrun_proxy(policy: NetworkPolicy) -> Iterator[int]:
        limits = ProxyLimits(max_records=MAX_RECORDS, max_record_bytes=MAX_RECORD_BYTES)
        with EgressProxy(policy, resolver=resolve, limits=limits) as proxy:
            yield proxy.listen_tcp(Channel.SHELL)[1]
        refused.extend(f"{r.reason} {r.method} {r.host}:{r.port}"
                       for r in proxy.records() if r.denied)

    samples: dict[str, list[Any]] = {}
    with tempfile.TemporaryDirectory(prefix="firstrun-bench-squid-") as top:
        nginx_dir, squid_dir = Path(top, "nginx"), Path(top, "squid")
        nginx_dir.mkdir()
        squid_dir.mkdir()
        Path(top).chmod(0o711)  # squid's own user reaches its directory
        origin = nginx(nginx_dir)
        squid_proc = None
        try:
            squid_proc, squid_port = squid(squid_dir)
            script = Path(top, "proxy.lua")
            script.write_text(f'wrk.path = "http://{HOST_NAME}:{origin.port}/1k"\n'
                              f'wrk.headers["Host"] = "{HOST_NAME}:{origin.port}"\n')
            policy = NetworkPolicy.build(allow=(), overrides=[
                (f"{HOST_NAME}:{origin.port}", ["127.0.0.1/32"])])

            def firstrun_wrk(connections: int) -> tuple[float, float, float | None]:
                # The proxy is this process's loop thread; the main thread only waits for wrk.
                with firstrun_proxy(policy) as port:
                    return _wrk(f"http://127.0.0.1:{port}", connections, script, cpu=_own_cpu)

            squid_pid = squid_proc.pid
            for connections, _ in THROUGHPUT:
                arms: dict[str, Callable[[], tuple[float, float, float | None]]] = {
                    "direct": lambda c=connections: _wrk(f"http://127.0.0.1:{origin.port}/1k", c, None),
                    "squid": lambda c=connections: _wrk(f"http://127.0.0.1:{squid_port}", c, script,
                                                        cpu=lambda: _process_cpu(squid_pid)),
                    "firstrun": lambda c=connections: firstrun_wrk(c),
                }
                for _ in range(trials):
                    for arm, run in arms.items():
                        samples.setdefault(f"{arm}_{connections}", []).append(run())

            spec = {"host": HOST_NAME, "port": origin.port, "path": "/1k", "body": BODY}

            def firstrun_first(processes: int) -> float:
                with firstrun_proxy(policy) as port:
                    return _first({**spec, "via": "connect", "proxy": ["127.0.0.1", port]},
                                  processes)

            for processes in (1, FIRST_CONCURRENCY):
                first_arms: dict[str, Callable[[], float]] = {
                    "direct": lambda p=processes: _first({**spec, "via": "direct"}, p),
                    "squid": lambda p=processes: _first(
                        {**spec, "via": "connect", "proxy": ["127.0.0.1", squid_port]}, p),
                    "firstrun": lambda p=processes: firstrun_first(p),
                }
                for _ in range(FIRST_TRIALS):
                    for arm, run_first in first_arms.items():
                        samples.setdefault(f"{arm}_first{processes}", []).append(run_first())
        finally:
            if squid_proc is not None:
                stop(squid_proc)
            stop(origin.process)
    if refused:
        raise RuntimeError(f"the proxy refused the bench ({len(refused)} records): {refused[0]}")

    def rps(key: str) -> float:
        return statistics.median(r for r, _, _ in samples[key])

    def p99(key: str) -> float:
        return statistics.median(p for _, p, _ in samples[key])

    def cpu(key: str) -> float:
        return statistics.median(c for _, _, c in samples[key])

    figures: dict[str, dict[str, object]] = {}
    for c, bar in THROUGHPUT:
        figures[f"direct_{c}conn_rps"] = {"value": rps(f"direct_{c}"), "unit": "req/s",
                                          "better": "higher"}
        figures[f"squid_{c}conn_rps"] = {"value": rps(f"squid_{c}"), "unit": "req/s",
                                         "better": "higher", "baseline": f"direct_{c}conn_rps"}
        figures[f"firstrun_{c}conn_rps"] = {
            "value": rps(f"firstrun_{c}"), "unit": "req/s", "better": "higher",
            "baseline": [f"squid_{c}conn_rps", f"direct_{c}conn_rps"],
            **({"bar": bar} if bar is not None else {})}
        figures[f"squid_{c}conn_p99"] = {"value": p99(f"squid_{c}"), "unit": "ms",
                                         "better": "lower"}
        figures[f"firstrun_{c}conn_p99"] = {"value": p99(f"firstrun_{c}"), "unit": "ms",
                                            "better": "lower", "baseline": f"squid_{c}conn_p99",
                                            **({"limit": P99_LIMIT_MS} if c == P99_LIMIT_AT else {})}
        # Where the time goes: each proxy's own CPU (user and system) per request it served.
        figures[f"squid_{c}conn_cpu"] = {"value": cpu(f"squid_{c}"), "unit": "us/req",
                                         "better": "lower"}
        figures[f"firstrun_{c}conn_cpu"] = {"value": cpu(f"firstrun_{c}"), "unit": "us/req",
                                            "better": "lower", "baseline": f"squid_{c}conn_cpu"}
    def ms(key: str) -> float:
        return statistics.median(samples[key]) * 1e3

    for p in (1, FIRST_CONCURRENCY):
        label = "tunnel_first" if p == 1 else f"tunnel_first_{p}conc"
        direct = "direct_first" if p == 1 else f"direct_first_{p}conc"
        figures[direct] = {"value": ms(f"direct_first{p}"), "unit": "ms", "better": "lower"}
        figures[f"squid_{label}"] = {"value": ms(f"squid_first{p}"), "unit": "ms",
                                     "better": "lower", "baseline": direct}
        figures[f"firstrun_{label}"] = {"value": ms(f"firstrun_first{p}"), "unit": "ms",
                                        "better": "lower", "bar": FIRST_BAR,
                                        "baseline": [f"squid_{label}", direct]}
    return figures


if __name__ == "__main__":
    result = main()
    for name, fig in result.items():
        print(f"{name:28s} {fig['value']:10.3f} {fig['unit']}")
    sys.exit(0)
