"""The loopback fixtures the proxy benches share: nginx and squid.

Guarantee: every server listens on 127.0.0.1 only, on a port picked free,
and is started under a prefix directory the caller owns (a temporary
directory), so its configuration and logs live and die there. Each start
waits, bounded in time, until the server listens, and ``stop`` ends a child
by its pid, killing it if it outlives ``STOP_TIMEOUT_S``.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HOST_NAME = "bench.test"
BODY = "x" * 1024
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def await_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} never listened on 127.0.0.1:{port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Nginx:
    """nginx answering ``GET /1k`` with ``BODY`` on ``port``."""

    process: subprocess.Popen[bytes]
    port: int


def nginx(prefix: Path) -> Nginx:
    port = free_port()
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
    try:
        await_port(port, process, "nginx")
    except BaseException:
        stop(process)
        raise
    return Nginx(process=process, port=port)


def squid(prefix: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Debian's squid as a forward proxy: caching off, no access log, ``HOST_NAME`` on loopback.

    ``http_access allow all`` replaces the default rules, among them the one
    that limits CONNECT to port 443, so a tunnel to nginx's port is allowed.
    """
    port = free_port()
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
    try:
        await_port(port, process, "squid")
    except BaseException:
        stop(process)
        raise
    return process, port
