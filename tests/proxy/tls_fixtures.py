"""Loopback HTTPS "registries" with their own test CA, and clients that go through the proxy."""

from __future__ import annotations

import datetime
import http.client
import os
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import h11
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class TestCA:
    """A CA the fixture servers' certificates chain to; never the run's CA.

    Its files live in ``directory``, a pytest temporary directory the test
    owns, and every private key among them is written 0600.
    """

    __test__ = False

    def __init__(self, directory: Path) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "firstrun fixture CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._name = name
        self.cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir = directory
        self.cafile = self.dir / "ca.pem"
        self.cafile.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def server_context(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        certfile, keyfile = self.dir / f"{host}.pem", self.dir / f"{host}.key"
        certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certfile, keyfile)
        return ctx


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HttpsRegistry:
    """An HTTPS server on loopback for ``host`` that remembers every request it was sent."""

    host: str
    ca: TestCA
    seen: list[Seen] = field(default_factory=list)
    handshakes: int = 0

    def __post_init__(self) -> None:
        self._ctx = self.ca.server_context(self.host)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            conn = self._ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        with self._lock:
            self.handshakes += 1
        h = h11.Connection(h11.SERVER)
        try:
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    data = conn.recv(65536)
                    h.receive_data(data)
                    continue
                if not isinstance(event, h11.Request):
                    return
                body = b""
                while True:
                    part = h.next_event()
                    if part is h11.NEED_DATA:
                        h.receive_data(conn.recv(65536))
                    elif isinstance(part, h11.Data):
                        body += part.data
                    else:
                        break
                with self._lock:
                    self.seen.append(Seen(
                        method=event.method.decode(), path=event.target.decode(),
                        headers={k.decode(): v.decode() for k, v in event.headers}, body=body,
                    ))
                reply = f"{self.host} saw {event.method.decode()} {event.target.decode()}\n".encode()
                conn.sendall(h.send(h11.Response(status_code=200, headers=[
                    (b"content-length", str(len(reply)).encode()),
                    (b"content-type", b"text/plain")]))
                    + (h.send(h11.Data(data=reply)) if event.method != b"HEAD" else b"")
                    + h.send(h11.EndOfMessage()))
                h.start_next_cycle()
        except (OSError, ssl.SSLError, h11.ProtocolError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._sock.close()


def https_via_proxy(
    proxy: tuple[str, int], host: str, port: int, *, trust: bytes, method: str = "GET",
    path: str = "/", body: bytes | None = None, headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTPS request through the proxy's CONNECT, trusting only the PEM ``trust``."""
    ctx = ssl.create_default_context(cadata=trust.decode())
    conn = http.client.HTTPSConnection(proxy[0], proxy[1], context=ctx, timeout=10)
    conn.set_tunnel(host, port)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def raw_tls_via_proxy(proxy: tuple[str, int], connect_to: str, *, sni: str,
                      trust: bytes, alpn: tuple[str, ...] = ()) -> ssl.SSLSocket:
    """A TLS socket through a CONNECT to ``connect_to`` whose ClientHello names ``sni``."""
    sock = socket.create_connection(proxy, timeout=10)
    sock.sendall(f"CONNECT {connect_to} HTTP/1.1\r\nHost: {connect_to}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"proxy closed: {head!r}")
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    ctx = ssl.create_default_context(cadata=trust.decode())
    ctx.check_hostname = False
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx.wrap_socket(sock, server_hostname=sni)
