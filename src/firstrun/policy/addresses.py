"""Classify an IP address into the ranges the egress floor refuses.

Guarantee: every address gets exactly one class. An IPv6 address that
carries an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo) is classed
``EMBEDDED_IPV4`` whatever it carries, so wrapping cannot launder
``127.0.0.1`` or ``169.254.169.254`` past the floor. Pure: stdlib only, no I/O.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressClass(StrEnum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link_local"
    METADATA = "metadata"
    CGNAT = "cgnat"
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"
    RESERVED = "reserved"
    EMBEDDED_IPV4 = "embedded_ipv4"


# The ranges are listed explicitly rather than taken from ``is_private``:
# Python counts the documentation ranges (192.0.2.0/24, 203.0.113.0/24, ...)
# as private, and some real networks, including the package mirrors this
# project is tested against, answer from them. The floor is about reaching
# the harness's own machine and network, and these lists say exactly that.
_V4 = {
    AddressClass.METADATA: ["169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32"],
    AddressClass.UNSPECIFIED: ["0.0.0.0/8"],
    AddressClass.LOOPBACK: ["127.0.0.0/8"],
    AddressClass.PRIVATE: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "198.18.0.0/15"],
    AddressClass.LINK_LOCAL: ["169.254.0.0/16"],
    AddressClass.CGNAT: ["100.64.0.0/10"],
    AddressClass.MULTICAST: ["224.0.0.0/4"],
    AddressClass.RESERVED: ["240.0.0.0/4", "192.0.0.0/24"],
}

_V6 = {
    AddressClass.METADATA: ["fd00:ec2::254/128"],
    AddressClass.UNSPECIFIED: ["::/128"],
    AddressClass.LOOPBACK: ["::1/128"],
    AddressClass.PRIVATE: ["fc00::/7"],
    AddressClass.LINK_LOCAL: ["fe80::/10"],
    AddressClass.MULTICAST: ["ff00::/8"],
    AddressClass.RESERVED: ["fec0::/10", "100::/64"],
}

_V4_NETS = [(cls, ipaddress.IPv4Network(n)) for cls, nets in _V4.items() for n in nets]
_V6_NETS = [(cls, ipaddress.IPv6Network(n)) for cls, nets in _V6.items() for n in nets]

_NAT64 = [ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48")]
_COMPAT = ipaddress.IPv6Network("::/96")


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, if it is one of the known wrappings."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if any(addr in net for net in _NAT64):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _COMPAT and int(addr) > 1:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def address_class(addr: IPAddress) -> AddressClass:
    """The single class of ``addr``; ``PUBLIC`` means the floor has no objection."""
    if isinstance(addr, ipaddress.IPv4Address):
        for cls, net in _V4_NETS:
            if addr in net:
                return cls
        return AddressClass.PUBLIC
    if embedded_ipv4(addr) is not None:
        return AddressClass.EMBEDDED_IPV4
    for cls, net in _V6_NETS:
        if addr in net:
            return cls
    return AddressClass.PUBLIC
