"""Addresses and networks from the config ("127.0.0.0/8", "::1"), membership tests, and the
networks of this machine's own interfaces (the LAN it is on).

``gateway.net.limits`` re-exports these names, as it did when they lived there.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Sequence

import ifaddr

__all__ = ["Network", "in_networks", "interface_networks", "networks"]

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


def interface_networks(addresses: Collection[str] = ()) -> tuple[Network, ...]:
    """The networks of this machine's interfaces, of those holding one of ``addresses`` (all of
    them when empty); loopback and link-local networks left out: never a LAN of boards.

    Reads the interfaces (``getifaddrs``): call it off the event loop.
    """
    found: list[Network] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            address = ip.ip if isinstance(ip.ip, str) else ip.ip[0]  # IPv6: (address, flow, scope)
            if addresses and address not in addresses:
                continue
            network = ipaddress.ip_network(f"{address}/{ip.network_prefix}", strict=False)
            if not (network.is_loopback or network.is_link_local or network in found):
                found.append(network)
    return tuple(found)
