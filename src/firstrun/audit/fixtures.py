"""The host-side witnesses the audit judges by: canaries, a fixture registry, marker processes.

Guarantee: every witness lives on an address of this host (never one that
leads off this machine) or in files and processes the audit itself created,
and records what reached it, so a cell is judged by what the host saw, not by
what the session said. ``Witnesses`` is fresh per configuration; its
``close`` removes every file it planted and ends every process it started, by
pid. The ``Registry``'s CA is made here and is never the proxy's run CA.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from firstrun.errors import SandboxUnavailable

PACKAGE = "firstrun-audit-fixture"
MODULE = "firstrun_audit_fixture"
REGISTRY_HOST = "registry.firstrun-audit.test"
_WHEEL = f"{MODULE}-1.0-py3-none-any.whl"


def build_wheel(marker: str) -> bytes:
    """A minimal, valid wheel whose module holds ``marker`` (so an install is recognisable)."""
    files = {
        f"{MODULE}/__init__.py": f"MARKER = {marker!r}\n".encode(),
        f"{MODULE}-1.0.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n".encode(),
        f"{MODULE}-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: firstrun-audit\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{MODULE}-1.0.dist-info/RECORD,,")
    files[f"{MODULE}-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return out.getvalue()


def _certificate(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
                 signer: ec.EllipticCurvePrivateKey,
                 extensions: list[tuple[x509.ExtensionType, bool]]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=1)))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def _server_context(directory: str, address: str) -> tuple[ssl.SSLContext, bytes]:
    """The registry's TLS context (its name and ``address`` in the SANs) and its CA's PEM."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "firstrun audit fixture CA")])
    ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key,
                      [(x509.BasicConstraints(ca=True, path_length=0), True)])
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _certificate(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, REGISTRY_HOST)]), ca_name,
        key.public_key(), ca_key,
        [(x509.SubjectAlternativeName([x509.DNSName(REGISTRY_HOST),
                                       x509.IPAddress(ipaddress.ip_address(address))]),
          False)])
    certfile, keyfile = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    with open(certfile, "wb") as f:
        f.write(leaf.public_bytes(serialization.Encoding.PEM))
    with open(keyfile, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    return context, ca.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True, kw_only=True)
class Seen:
    """One request the registry answered."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        # A client that refuses our certificate, or speaks no TLS at all, is
        # the audit working (its outcome is judged from what was recorded).
        pass


class Registry:
    """A package registry on ``address``, over HTTPS, that accepts uploads, as a real one does."""

    # One package (a wheel built here) under PEP 503, over HTTPS as real
    # registries are (so the proxy's TLS inspection applies to it); every
    # request is recorded, upload bodies included. It listens on 127.0.0.1
    # unless told otherwise: a container reaches the host only on a docker
    # bridge's address. Its certificate is from a CA made here (``cafile``).

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.address = address
        # Private (0700): the key stays here until close; a sandbox sees only ``ca_pem``.
        self._dir = tempfile.mkdtemp(prefix="firstrun-audit-registry-")
        context, self.ca_pem = _server_context(self._dir, address)
        self.cafile = os.path.join(self._dir, "ca.pem")
        with open(self.cafile, "wb") as f:
            f.write(self.ca_pem)
        self.marker = secrets.token_hex(8)
        self._wheel = build_wheel(self.marker)
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _record(self, body: bytes) -> None:
                with registry._lock:
                    registry._seen.append(Seen(method=self.command, path=self.path,
                                               headers=tuple(self.headers.items()), body=body))

            def do_GET(self) -> None:
                self._record(b"")
                path = self.path.split("?", 1)[0]
                if path in ("/simple/", f"/simple/{PACKAGE}/"):
                    link = f'<a href="/packages/{_WHEEL}">{_WHEEL}</a>'
                    self._answer(200, f"<html><body>{link}</body></html>".encode(), "text/html")
                elif path == f"/packages/{_WHEEL}":
                    self._answer(200, registry._wheel, "application/octet-stream")
                else:
                    self._answer(404, b"not found", "text/plain")

            do_HEAD = do_GET

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._record(self.rfile.read(min(length, 1 << 20)))
                self._answer(200, b"stored", "text/plain")

            do_PUT = do_POST

        self._server = _QuietServer((address, 0), Handler)
        # The handshake happens in each handler's thread, so a client that
        # never completes one holds only its own thread.
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="firstrun-audit-registry")

    def __enter__(self) -> Registry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)


class _Listener:
    """A listener that never accepts until counted: the backlog holds every connection."""

    def __init__(self, family: int, kind: int, address: object) -> None:
        self.sock = socket.socket(family, kind)
        self.sock.bind(address)
        if kind == socket.SOCK_STREAM:
            self.sock.listen(64)
        self.sock.setblocking(False)

    def count(self) -> tuple[int, bytes]:
        """Connections (stream) or datagrams received so far, and the datagrams' bytes."""
        n, data = 0, b""
        while True:
            try:
                if self.sock.type == socket.SOCK_STREAM:
                    conn, _ = self.sock.accept()
                    conn.close()
                else:
                    data += self.sock.recv(4096)
            except BlockingIOError:
                return n, data
            n += 1

    def close(self) -> None:
        self.sock.close()


def _marker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time; time.sleep(3600)"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def pids_with_argv0(token: str) -> list[int]:
    """Host pids whose argv[0] is ``token`` (the leftover a session was asked to leave)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if argv0 == token.encode():
            found.append(int(name))
    return found


class Witnesses:
    """Everything one configuration's actions are judged by; fresh per configuration."""

    def __init__(self, *, home: str, system_dir: str, address: str = "127.0.0.1") -> None:
        # Where the canaries listen: the host as the session can address it.
        self.address = address
        self.nonce = secrets.token_hex(12)
        self.token = f"firstrun-audit-linger-{self.nonce}"
        self.secret = f"firstrun-audit-secret-{secrets.token_hex(12)}"
        self.credential = f"firstrun-audit-credential-{secrets.token_hex(12)}"
        self.canary = _Listener(socket.AF_INET, socket.SOCK_STREAM, (address, 0))
        self.dns = _Listener(socket.AF_INET, socket.SOCK_DGRAM, (address, 0))
        self.abstract_name = f"firstrun-audit-{self.nonce}"
        self.abstract = _Listener(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + self.abstract_name)
        self.secret_path = os.path.join(home, f".firstrun-audit-{self.nonce}")
        # A system file any uid may write by its mode: only a layer refuses the write.
        try:
            self.system_dir = tempfile.mkdtemp(prefix="firstrun-audit-", dir=system_dir)
        except OSError as exc:
            for listener in (self.canary, self.dns, self.abstract):
                listener.close()
            raise SandboxUnavailable(
                f"cannot plant the audit's system-file canary in {system_dir}: {exc.strerror}",
                who="audit", fix=f"run firstrun audit as a user who can write {system_dir} "
                                 "(root)") from exc
        os.chmod(self.system_dir, 0o755)
        self.system_path = os.path.join(self.system_dir, "canary")
        self.system_content = f"untouched {self.nonce}\n"
        with open(self.system_path, "w") as f:
            f.write(self.system_content)
        os.chmod(self.system_path, 0o666)
        fd = os.open(self.secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret)
        self.environ_marker = _marker({"FIRSTRUN_AUDIT_SECRET": self.secret})
        self.kill_marker = _marker({})

    def close(self) -> None:
        for marker in (self.environ_marker, self.kill_marker):
            if marker.poll() is None:
                marker.kill()
            marker.wait()
        for pid in pids_with_argv0(self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for listener in (self.canary, self.dns, self.abstract):
            listener.close()
        try:
            os.unlink(self.secret_path)
        except FileNotFoundError:
            pass
        shutil.rmtree(self.system_dir, ignore_errors=True)
