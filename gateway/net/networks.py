"""Addresses and networks from the config ("127.0.0.0/8", "::1"), and membership tests.

``gateway.net.limits`` re-exports these names, as it did when they lived there.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["Network", "in_networks", "networks"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(texts: Sequence[str]) -> tuple[Network, ...]:
    """Parse addresses or networks ("127.0.0.0/8", "::1"); the config checked them already."""
    return tuple(ipaddress.ip_network(text, strict=False) for text in texts)


def in_networks(address: str, nets: Sequence[Network]) -> bool:
    """True when ``address`` (IPv4-mapped IPv6 included) lies in one of ``nets``."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in nets)
