"""The loopback fixtures the proxy benches share: nginx, squid and a throwaway CA.

Guarantee: every server listens on 127.0.0.1 only, on a port picked free,
and is started under a prefix directory the caller owns (a temporary
directory), so its configuration, logs and key material live and die there.
Each start waits, bounded in time, until the server listens, and ``stop``
ends a child by its pid, killing it if it outlives ``STOP_TIMEOUT_S``. A
private key is written 0600 and only under the directory the caller gave.
"""

from __future__ import annotations

import datetime
import os
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


@dataclass(frozen=True)
class ServerCert:
    """A throwaway CA's certificate, and a server certificate and key for ``HOST_NAME`` it signed."""

    cafile: Path
    certfile: Path
    keyfile: Path


def throwaway_ca(directory: Path) -> ServerCert:
    """A fresh CA (its key never leaves this process) and a server certificate for ``HOST_NAME``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "firstrun bench CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST_NAME)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(HOST_NAME)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = ServerCert(cafile=directory / "ca.pem", certfile=directory / f"{HOST_NAME}.pem",
                     keyfile=directory / f"{HOST_NAME}.key")
    out.cafile.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(out.keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return out


@dataclass
class Nginx:
    """nginx answering ``GET /1k`` with ``BODY`` on ``port`` (and with TLS on ``tls_port``)."""

    process: subprocess.Popen[bytes]
    port: int
    tls_port: int | None


def nginx(prefix: Path, tls: ServerCert | None = None) -> Nginx:
    port = free_port()
    tls_port = free_port() if tls is not None else None
    (prefix / "logs").mkdir()
    tls_listen = (f"listen 127.0.0.1:{tls_port} ssl; ssl_certificate {tls.certfile}; "
                  f"ssl_certificate_key {tls.keyfile};" if tls is not None else "")
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
    {tls_listen}
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
        if tls_port is not None:
            await_port(tls_port, process, "nginx (TLS)")
    except BaseException:
        stop(process)
        raise
    return Nginx(process=process, port=port, tls_port=tls_port)


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
