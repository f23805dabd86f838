"""The per-run certificate authority that TLS inspection signs with.

Guarantee: the CA's private key is generated fresh for each run, lives only
in this process's memory, is never serialized and never touches a filesystem.
What leaves this module for the sandbox is public: the CA certificate and a
trust bundle of the system CAs plus it. The CA lasts two days and may sign
only end-entity certificates; each leaf names exactly one host.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import secrets
import ssl
import threading
from collections.abc import Iterator, Sequence

# X.509 is ``cryptography``'s; nothing here encodes a certificate by hand.
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from firstrun.errors import ProxyError

# Short-lived: the CA lasts two days; a leaf a day, cached per host for the run.
CA_VALIDITY = datetime.timedelta(days=2)
LEAF_VALIDITY = datetime.timedelta(days=1)
# Clocks inside and outside the sandbox agree, but a client's may lag a little.
_BACKDATE = datetime.timedelta(minutes=5)
# What the sandbox's clients may negotiate: the proxy parses HTTP/1.1 only.
ALPN = ["http/1.1"]


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open that names anonymous memory, gone when the block ends."""
    # How a leaf and its key reach OpenSSL without a file: a memfd that no path
    # names, closed as soon as ``load_cert_chain`` has read it.
    fd = os.memfd_create("firstrun-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class RunCA:
    """A CA for one run; ``server_context(host)`` is what the proxy shows a client for ``host``."""

    def __init__(self) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        # One key for every leaf of the run: leaves differ only in the name they certify.
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "firstrun"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"firstrun run CA {secrets.token_hex(4)}"),
        ])
        self._name = name
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + CA_VALIDITY)
            # Path length 0: the CA may sign end-entity certificates only.
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = _pem(self.cert)
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def issue(self, host: str) -> x509.Certificate:
        """A leaf for exactly ``host`` (a canonical name or IP literal), signed by this CA."""
        now = datetime.datetime.now(datetime.UTC)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._name)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + LEAF_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS server context for ``host``, built once per host and cached."""
        with self._lock:
            ctx = self._contexts.get(host)
            if ctx is None:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                ctx.set_alpn_protocols(ALPN)
                chain = _pem(self.issue(host)) + self.cert_pem
                with _memory_file(chain) as cert_path, _memory_file(self._leaf_key_pem) as key_path:
                    ctx.load_cert_chain(cert_path, key_path)
                self._contexts[host] = ctx
            return ctx

    def trust_bundle(self, sources: Sequence[str]) -> bytes:
        """The PEM bundle a sandbox trusts: every readable file of ``sources``, then this CA.

        A missing source is skipped (``SSL_CERT_FILE`` may name the system
        bundle itself); a bundle with no system CA at all is refused, since
        every registry would then fail to verify with a misleading error.
        """
        parts: list[bytes] = []
        seen: set[str] = set()
        for path in sources:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                with open(real, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ProxyError(f"cannot read CA bundle {path}: {exc.strerror or exc}") from None
            parts.append(data if data.endswith(b"\n") else data + b"\n")
        if not parts:
            raise ProxyError(
                f"no system CA bundle found at {', '.join(sources)}; "
                "install ca-certificates or set SSL_CERT_FILE"
            )
        return b"".join(parts) + self.cert_pem


def upstream_context(extra_cafiles: Sequence[str] = ()) -> ssl.SSLContext:
    """How the proxy verifies the real server: the system trust store (and ``SSL_CERT_FILE``).

    ``extra_cafiles`` adds CAs (tests trust their fixture's CA this way);
    it never removes a check: hostname and chain are always verified.
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    cafile = os.environ.get("SSL_CERT_FILE")
    if cafile:
        try:
            ctx.load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ProxyError(f"SSL_CERT_FILE={cafile}: cannot load it: {exc}") from None
    for path in extra_cafiles:
        try:
            ctx.load_verify_locations(cafile=path)
        except (OSError, ssl.SSLError) as exc:
            raise ProxyError(f"cannot load CA file {path}: {exc}") from None
    ctx.set_alpn_protocols(ALPN)
    return ctx
