"""Where a board's URL really leads, checked after resolution, before any request goes there.

A board's URL comes from the owner, or from whatever answers mDNS on the LAN. Either way the
gateway must not become a way to reach what the board's URL should never name: the gateway's
own listeners (a loop, or the host API reached from the device side) and link-local addresses
(cloud metadata services at 169.254.169.254, other hosts' autoconfigured interfaces). The name
is resolved once per connection attempt and the request goes to the address that was checked
(``Target.url``, with the original ``Host``), so a second resolution cannot lead elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass

from gateway.net.addresses import is_wildcard, lan_address, url_host

__all__ = ["Target", "resolve_board"]


@dataclass(frozen=True, slots=True)
class Target:
    """A board's URL pinned to the address it resolved to."""

    url: str  # the URL with the checked address in place of the name (http only)
    host: str | None  # the Host header the board expects, when ``url`` has an address
    address: str


async def resolve_board(url: str, own_ports: Collection[int]) -> Target | str:
    """The checked address of the board at ``url``, or why the gateway will not connect there.

    ``own_ports``: the ports this gateway listens on (device, host, MQTT); a board on this
    machine at one of them would be the gateway itself.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (OSError, UnicodeError) as exc:
        return f"cannot resolve {host}: {exc}"
    addresses = [str(info[4][0]).split("%")[0] for info in infos]
    for address in addresses:
        refusal = _refusal(address, port, own_ports)
        if refusal is not None:
            return f"{host} resolves to {address}: {refusal}"
    if not addresses:
        return f"cannot resolve {host}"
    address = addresses[0]
    if parts.scheme == "https":  # the certificate names the host: keep it (and its SNI)
        return Target(url, None, address)
    netloc = f"{url_host(address)}:{port}"
    pinned = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return Target(pinned, parts.netloc.rpartition("@")[2], address)


def _refusal(address: str, port: int, own_ports: Collection[int]) -> str | None:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast or ip.is_unspecified or is_wildcard(address):
        return "not a board's address"
    if port in own_ports and (ip.is_loopback or str(ip) == lan_address()):
        return "this gateway itself"
    return None
