"""Read the server name out of the first bytes a client sends through a tunnel.

Guarantee: ``parse_client_hello`` is total: for any byte string it returns a
``Hello`` and never raises, never reads past its input, and never trusts a
length it has not checked. A ClientHello ambiguous about its server name (two
names, trailing bytes, a name that is not ASCII) is ``MALFORMED``, and one
carrying Encrypted Client Hello (or its ESNI draft) is flagged ``ech``: either
way a server could route on a name other than the one read here. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

_RECORD_HANDSHAKE = 0x16
_HANDSHAKE_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000
# encrypted_client_hello (RFC 9849) and the encrypted_server_name draft.
_EXT_ENCRYPTED_NAMES = frozenset({0xFE0D, 0xFFCE})
_NAME_TYPE_HOST = 0x00
# A plaintext record carries at most 2^14 bytes (RFC 8446 section 5.1).
_MAX_FRAGMENT = 1 << 14
# Far above any real ClientHello (post-quantum key shares included); the
# bound keeps a hostile client from making the proxy buffer without end.
MAX_CLIENT_HELLO = 1 << 16


class HelloStatus(StrEnum):
    INCOMPLETE = "incomplete"
    NOT_TLS = "not_tls"
    CLIENT_HELLO = "client_hello"
    MALFORMED = "malformed"


@dataclass(frozen=True, kw_only=True)
class Hello:
    status: HelloStatus
    # The host_name from server_name, as sent (not canonicalised); None when absent.
    sni: str | None = None
    # The real server name is encrypted; ``sni`` is only the outer, public one,
    # a decoy by design: the server that decrypts it (a CDN in front of an
    # allowed host) routes on the hidden one.
    ech: bool = False


_INCOMPLETE = Hello(status=HelloStatus.INCOMPLETE)
_NOT_TLS = Hello(status=HelloStatus.NOT_TLS)
_MALFORMED = Hello(status=HelloStatus.MALFORMED)


class _Short(Exception):
    """A length field points past the end of the bytes it belongs to."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self._pos + n > len(self._data):
            raise _Short
        chunk = self._data[self._pos : self._pos + n]
        self._pos += n
        return chunk

    def uint(self, width: int) -> int:
        return int.from_bytes(self.take(width), "big")

    def vector(self, length_width: int) -> _Reader:
        return _Reader(self.take(self.uint(length_width)))

    def rest(self) -> bytes:
        return self.take(len(self._data) - self._pos)

    def __len__(self) -> int:
        return len(self._data) - self._pos

    @property
    def empty(self) -> bool:
        return self._pos == len(self._data)


def _handshake_bytes(data: bytes) -> bytes | Hello:
    """The handshake message carried by the leading records, or a verdict."""
    # A ClientHello may span several records; they are reassembled here.
    if not data:
        return _INCOMPLETE
    if data[0] != _RECORD_HANDSHAKE:
        return _NOT_TLS
    if len(data) >= 2 and data[1] != 0x03:
        return _NOT_TLS
    message = bytearray()
    pos = 0
    while True:
        if len(data) - pos < 5:
            return _INCOMPLETE
        if data[pos] != _RECORD_HANDSHAKE or data[pos + 1] != 0x03:
            return _MALFORMED
        length = int.from_bytes(data[pos + 3 : pos + 5], "big")
        if length == 0 or length > _MAX_FRAGMENT:
            return _MALFORMED
        if len(data) - pos - 5 < length:
            return _INCOMPLETE
        message += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if len(message) >= 4:
            need = 4 + int.from_bytes(message[1:4], "big")
            if need > MAX_CLIENT_HELLO:
                return _MALFORMED
            if len(message) >= need:
                # Bytes past the ClientHello in the same record would be a
                # second handshake message before the server spoke: invalid.
                return bytes(message) if len(message) == need else _MALFORMED


def parse_client_hello(data: bytes) -> Hello:
    """Classify the first bytes of a tunnel and extract the SNI host name."""
    # There is no h11 for TLS, and the well-kept TLS libraries parse a
    # ClientHello only as a server about to answer it; this reads the few
    # fields the server name needs (RFC 8446 section 4.1.2, RFC 6066 section 3)
    # and nothing else.
    message = _handshake_bytes(data)
    if isinstance(message, Hello):
        return message
    try:
        return _parse_message(_Reader(message))
    except _Short:
        return _MALFORMED


def _parse_message(r: _Reader) -> Hello:
    if r.uint(1) != _HANDSHAKE_CLIENT_HELLO:
        return _MALFORMED
    body = r.vector(3)
    body.take(2)  # legacy_version
    body.take(32)  # random
    if len(body.vector(1)) > 32:  # legacy_session_id
        return _MALFORMED
    suites = body.vector(2)
    if len(suites) < 2 or len(suites) % 2:
        return _MALFORMED
    if len(body.vector(1)) < 1:  # legacy_compression_methods
        return _MALFORMED
    if body.empty:
        return Hello(status=HelloStatus.CLIENT_HELLO)
    extensions = body.vector(2)
    if not body.empty:
        return _MALFORMED
    seen: set[int] = set()
    sni: str | None = None
    while not extensions.empty:
        ext_type = extensions.uint(2)
        ext = extensions.vector(2)
        # Two of one extension (two ``server_name``s above all) are ambiguous:
        # a server and this parser could pick different names, and the
        # difference is exactly what domain fronting exploits.
        if ext_type in seen:
            return _MALFORMED
        seen.add(ext_type)
        if ext_type == _EXT_SERVER_NAME:
            name = _server_name(ext)
            if name is None:
                return _MALFORMED
            sni = name
    return Hello(status=HelloStatus.CLIENT_HELLO, sni=sni, ech=bool(seen & _EXT_ENCRYPTED_NAMES))


def _server_name(ext: _Reader) -> str | None:
    names = ext.vector(2)
    if not ext.empty:
        return None
    host: str | None = None
    while not names.empty:
        name_type = names.uint(1)
        name = names.vector(2)
        if name_type != _NAME_TYPE_HOST:
            continue
        raw = name.rest()
        if host is not None or not raw or not raw.isascii():
            return None
        host = raw.decode("ascii")
    return host
