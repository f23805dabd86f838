#!/usr/bin/env python3
"""The egress proxy against squid, with wrk against nginx on loopback, in one run.

Guarantee: every arm is wrk (one thread) sending 1 KiB GETs, keep-alive,
for ``SECONDS`` at the same concurrency, to the same nginx: straight to it
(``direct``), through squid (Debian's, a forward proxy with caching off and
no access log, its hosts file naming the fixture), and through firstrun's
``EgressProxy`` (an override lets the fixture's name reach loopback, as the
other benches do). The arms alternate over ``TRIALS`` rounds, so load from
anything else on the machine falls on all of them alike; each figure is the
median over the rounds. Requests through a proxy are in absolute form, as a
client configured with a proxy sends them. Bars (issue 16): firstrun at
least 0.7x squid at 32 connections with p99 at most 20 ms, and at least
1.0x squid at one connection. Needs squid, nginx and wrk (``scripts/install
--with-bench-deps``). All traffic stays on 127.0.0.1; every child is bounded
by a timeout and stopped by its pid.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SECONDS = 4
TRIALS = 3
HOST_NAME = "bench.test"
BODY = "x" * 1024
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _await_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} never listened on 127.0.0.1:{port}")


def _nginx(prefix: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    (prefix / "logs").mkdir()
    (prefix / "nginx.conf").write_text(f"""
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    location /1k {{ default_type text/plain; return 200 "{BODY}"; }}
  }}
}}
""")
    process = subprocess.Popen(["nginx", "-p", str(prefix), "-c", str(prefix / "nginx.conf"),
                                "-g", "daemon off; master_process off;"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _await_port(port, process, "nginx")
    return process, port


def _squid(prefix: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    prefix.chmod(0o777)  # squid drops to its own user for its log
    (prefix / "hosts").write_text(f"127.0.0.1 {HOST_NAME}\n")
    (prefix / "squid.conf").write_text(f"""
http_port 127.0.0.1:{port}
http_access allow all
cache deny all
access_log none
cache_store_log none
cache_log {prefix}/cache.log
pid_filename {prefix}/squid.pid
coredump_dir {prefix}
hosts_file {prefix}/hosts
netdb_filename none
shutdown_lifetime 0 seconds
""")
    process = subprocess.Popen(["squid", "-N", "-f", str(prefix / "squid.conf")],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _await_port(port, process, "squid")
    return process, port


def _wrk(url: str, connections: int, script: Path | None) -> tuple[float, float]:
    """(requests per second, p99 latency in ms) of one wrk run."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{SECONDS}s", "--latency", url]
    if script is not None:
        argv[1:1] = ["-s", str(script)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SECONDS + 60, check=False)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", done.stdout, re.MULTILINE)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    if done.returncode != 0 or rps is None or p99 is None or errors is not None:
        raise RuntimeError(f"wrk {url} failed: {(done.stdout + done.stderr).strip()[-400:]}")
    return float(rps.group(1)), float(p99.group(1)) * _UNITS[p99.group(2)]


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(trials: int = TRIALS) -> dict[str, dict[str, object]]:
    from firstrun.policy.network import Channel, NetworkPolicy
    from firstrun.proxy.server import EgressProxy

    missing = [tool for tool in ("squid", "nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"bench_squid needs {', '.join(missing)}: run scripts/install "
                           "--with-bench-deps")

    async def resolve(_host: str, _port: int) -> list[ipaddress.IPv4Address]:
        return [ipaddress.IPv4Address("127.0.0.1")]

    with tempfile.TemporaryDirectory(prefix="firstrun-bench-squid-") as top:
        nginx_dir, squid_dir = Path(top, "nginx"), Path(top, "squid")
        nginx_dir.mkdir()
        squid_dir.mkdir()
        Path(top).chmod(0o711)  # squid's own user reaches its directory
        nginx, origin = _nginx(nginx_dir)
        squid = None
        try:
            squid, squid_port = _squid(squid_dir)
            script = Path(top, "proxy.lua")
            script.write_text(f'wrk.path = "http://{HOST_NAME}:{origin}/1k"\n'
                              f'wrk.headers["Host"] = "{HOST_NAME}:{origin}"\n')
            policy = NetworkPolicy.build(allow=(), overrides=[
                (f"{HOST_NAME}:{origin}", ["127.0.0.1/32"])])
            with EgressProxy(policy, resolver=resolve) as proxy:
                _, firstrun_port = proxy.listen_tcp(Channel.SHELL)
                arms = {
                    "direct": (f"http://127.0.0.1:{origin}/1k", None),
                    "squid": (f"http://127.0.0.1:{squid_port}", script),
                    "firstrun": (f"http://127.0.0.1:{firstrun_port}", script),
                }
                samples: dict[str, list[tuple[float, float]]] = {}
                for connections in (32, 1):
                    for _ in range(trials):
                        for arm, (url, lua) in arms.items():
                            samples.setdefault(f"{arm}_{connections}", []).append(
                                _wrk(url, connections, lua))
                if proxy.denied():
                    raise RuntimeError(f"the proxy refused the bench: {proxy.denied()[0]}")
        finally:
            if squid is not None:
                _stop(squid)
            _stop(nginx)

    def rps(key: str) -> float:
        return statistics.median(r for r, _ in samples[key])

    def p99(key: str) -> float:
        return statistics.median(p for _, p in samples[key])

    figures: dict[str, dict[str, object]] = {}
    for connections in (32, 1):
        c = connections
        figures[f"direct_{c}conn_rps"] = {"value": rps(f"direct_{c}"), "unit": "req/s",
                                          "better": "higher"}
        figures[f"squid_{c}conn_rps"] = {"value": rps(f"squid_{c}"), "unit": "req/s",
                                         "better": "higher", "baseline": f"direct_{c}conn_rps"}
        figures[f"firstrun_{c}conn_rps"] = {
            "value": rps(f"firstrun_{c}"), "unit": "req/s", "better": "higher",
            "baseline": [f"squid_{c}conn_rps", f"direct_{c}conn_rps"],
            "bar": 0.7 if c == 32 else 1.0}
        figures[f"squid_{c}conn_p99"] = {"value": p99(f"squid_{c}"), "unit": "ms",
                                         "better": "lower"}
        figures[f"firstrun_{c}conn_p99"] = {"value": p99(f"firstrun_{c}"), "unit": "ms",
                                            "better": "lower", "baseline": f"squid_{c}conn_p99",
                                            **({"limit": 20.0} if c == 32 else {})}
    return figures


if __name__ == "__main__":
    result = main()
    for name, fig in result.items():
        print(f"{name:24s} {fig['value']:10.1f} {fig['unit']}")
    sys.exit(0)
