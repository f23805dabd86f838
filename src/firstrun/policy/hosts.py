"""Host names and host patterns, in one canonical form.

Guarantee: two spellings of one destination (case, trailing dot, Unicode vs.
IDNA, userinfo, IP literals in decimal, octal, hex or IPv6-mapped) canonicalise
to one string, the name httpx and browsers dial (UTS-46, non-transitional). A
pattern matches on label boundaries only (``a.com`` never matches
``evila.com``), and one broad enough to defeat an allow-list (``*``, a wildcard
over a public suffix: ``*.com``, ``*.github.io``) is refused when parsed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache

import idna
from publicsuffixlist import PublicSuffixList

from firstrun.errors import PolicyError

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


# The only I/O in this module: the Public Suffix List bundled in the pinned
# ``publicsuffixlist`` package (data shipped with the code, as a module is),
# read once. ``idna`` is pure.
@cache
def _public_suffix_list() -> PublicSuffixList:
    # ICANN and private sections both: *.githubusercontent.com or *.web.app
    # would let any stranger's site in as surely as *.co.uk would.
    return PublicSuffixList(only_icann=False)


def is_public_suffix(host: str) -> bool:
    """Whether anyone can register a name directly under ``host`` (canonical).

    By the Public Suffix List, private section included (``github.io`` and
    ``web.app`` are public suffixes, ``pythonhosted.org`` is not); a single
    label (``com``, ``internal``) always is, listed or not.
    """
    return "." not in host or _public_suffix_list().is_public(host)


def parse_ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Return the address if ``host`` is an IP literal in any spelling, else None.

    Accepts what resolvers and browsers accept: dotted quads, but also the
    inet_aton forms (``2130706433``, ``0x7f.1``, ``0177.0.0.1``), bracketed
    IPv6 and IPv6 with a zone. An IPv6-mapped IPv4 address is returned as the
    IPv4 address it carries, so it meets the same rules.
    """
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if "%" in h:
        h = h.split("%", 1)[0]
    if ":" in h:
        try:
            addr6 = ipaddress.IPv6Address(h)
        except ValueError:
            return None
        return addr6.ipv4_mapped or addr6
    return _parse_inet_aton(h)


def _parse_inet_aton(h: str) -> ipaddress.IPv4Address | None:
    parts = h.split(".")
    if parts and parts[-1] == "":
        parts = parts[:-1]
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        try:
            if part.lower().startswith("0x"):
                values.append(int(part[2:] or "0", 16))
            elif len(part) > 1 and part.startswith("0"):
                values.append(int(part, 8))
            else:
                if not part.isdigit():
                    return None
                values.append(int(part, 10))
        except ValueError:
            return None
    # inet_aton: the last part fills all remaining bytes.
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = 0
    for v in head:
        number = (number << 8) | v
    number = (number << (8 * (4 - len(head)))) | last
    return ipaddress.IPv4Address(number)


# Pure, and asked for the same few hosts on every request a proxy serves;
# bounded, since a hostile client can name as many hosts as it likes.
@lru_cache(maxsize=4096)
def canonical_host(raw: str) -> str:
    """Canonical form of a host as a client wrote it.

    Lowercase, IDNA by UTS-46 processing (non-transitional, as httpx and
    browsers encode a name to dial it: ``faß.de`` is ``xn--fa-hia.de``, never
    IDNA 2003's ``fass.de``), no trailing dot, no userinfo, no port, and IP
    literals in their normal form (IPv6 without brackets). An ASCII name is
    dialled as written, so it is kept as written (an ``_`` label included),
    but an ``xn--`` label in it must be a valid A-label. Every host firstrun
    checks, in the policy, the proxy and the docs reader, is read by this one
    function. Raises PolicyError for anything that is not a valid host.
    """
    h = raw.strip()
    if "@" in h:
        h = h.rsplit("@", 1)[1]
    if not h:
        raise PolicyError(f"empty host in {raw!r}")
    ip = parse_ip_literal(h)
    if ip is not None:
        return str(ip)
    if ":" in h or "/" in h or "\\" in h or " " in h:
        raise PolicyError(f"not a host name: {raw!r}")
    # Lowercased before the mapping, as httpx does.
    h = h.lower()
    if h.endswith("."):
        h = h[:-1]
    if not h or ".." in h:
        raise PolicyError(f"not a host name: {raw!r}")
    try:
        if h.isascii():
            for label in h.split("."):
                if label.startswith("xn--"):
                    idna.ulabel(label)
        else:
            # The mapping may turn an ideographic full stop into a trailing dot.
            h = idna.encode(h, uts46=True).decode("ascii").removesuffix(".")
    except idna.IDNAError as exc:
        raise PolicyError(f"not a valid internationalised host name: {raw!r} ({exc})") from exc
    labels = h.split(".")
    if len(h) > 253 or not all(_LABEL.match(label) for label in labels):
        raise PolicyError(f"not a host name: {raw!r}")
    return h


_PORT_SPELLING = re.compile(r"[1-9][0-9]{0,4}", re.ASCII)


def parse_port(raw: str | int) -> int:
    """A TCP port from an int, or a string in its one spelling: decimal, no sign, no
    space, no leading zero (``0443`` names 443 to some parsers and nothing to others),
    1 to 65535. The task files and the proxy read ports with this one function."""
    if isinstance(raw, int):
        value = raw
    else:
        if not _PORT_SPELLING.fullmatch(raw):
            raise PolicyError(f"not a port: {raw!r}")
        value = int(raw, 10)
    if not 1 <= value <= 65535:
        raise PolicyError(f"port out of range: {raw!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class HostPattern:
    """An exact host (``pypi.org``) or a suffix wildcard (``*.pythonhosted.org``).

    ``port`` None means the default web ports (80 and 443) only. A wildcard
    matches strict subdomains, never the bare suffix itself.
    """

    host: str
    wildcard: bool = False
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        s = text.strip()
        if not s:
            raise PolicyError("empty host pattern")
        port: int | None = None
        if s.startswith("["):
            end = s.find("]")
            if end < 0:
                raise PolicyError(f"unclosed bracket in host pattern {text!r}")
            host_part, rest = s[: end + 1], s[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise PolicyError(f"junk after host in pattern {text!r}")
                port = parse_port(rest[1:])
        elif s.count(":") == 1:
            host_part, port_text = s.split(":")
            port = parse_port(port_text)
        else:
            host_part = s
        wildcard = host_part.startswith("*.")
        if wildcard:
            host_part = host_part[2:]
        if "*" in host_part:
            raise PolicyError(f"a wildcard may only be a leading '*.' label: {text!r}")
        host = canonical_host(host_part)
        if wildcard:
            if parse_ip_literal(host) is not None:
                raise PolicyError(f"a wildcard cannot apply to an IP address: {text!r}")
            if is_public_suffix(host):
                raise PolicyError(
                    f"pattern {text!r} covers a whole public suffix; name the registrable domain"
                )
        return cls(host=host, wildcard=wildcard, port=port)

    def widened(self) -> HostPattern | None:
        """This exact pattern and its subdomains as a wildcard, or None where the policy
        refuses one (over an IP literal or a public suffix, as ``parse`` does)."""
        if self.wildcard or parse_ip_literal(self.host) is not None or is_public_suffix(self.host):
            return None
        return replace(self, wildcard=True)

    def matches_host(self, host: str) -> bool:
        """Whether the name matches, whatever the port. ``host`` must be canonical."""
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def matches(self, host: str, port: int) -> bool:
        """``host`` must already be canonical."""
        if self.port is None:
            if port not in (80, 443):
                return False
        elif port != self.port:
            return False
        return self.matches_host(host)

    def __str__(self) -> str:
        text = ("*." if self.wildcard else "") + (
            f"[{self.host}]" if ":" in self.host else self.host
        )
        return f"{text}:{self.port}" if self.port is not None else text


def parse_patterns(entries: Sequence[str | HostPattern], *,
                   source: str) -> tuple[HostPattern, ...]:
    """Parse a list of patterns, naming ``source`` (a flag, a file) in any error; an entry
    parsed already (a task's, at load) is taken as it is."""
    patterns = []
    for entry in entries:
        if isinstance(entry, HostPattern):
            patterns.append(entry)
            continue
        try:
            patterns.append(HostPattern.parse(entry))
        except PolicyError as exc:
            raise PolicyError(f"{source}: {exc.args[0]}") from None
    return tuple(patterns)
