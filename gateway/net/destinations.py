"""Destinations others name: resolved once, checked after resolution, connected as checked.

The gateway follows addresses that someone else chose: a voice server's WebSocket, MQTT broker
and camera URL (docs/voice-proxy.md), and an MCP client's metadata document (OAuth). Followed
from the gateway's own host, such an address must not lead to this machine (loopback, an
unspecified address, one of this machine's own addresses: the gateway's host listener and
whatever else listens there) nor to the link-local network (cloud metadata services).

The check is made on what the resolver answers, never on the spelling: ``127.1``, ``0``,
``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``169.254.169.254.`` and a host name that
resolves to loopback are all the address they resolve to. The caller then connects to the
address returned (``Destination.address``), never to the name again, so a second DNS answer
(rebinding) cannot lead elsewhere; a TLS connection still names the host (SNI and the
certificate check use ``Destination.host``).

    destination = await resolve_destination(host, port)        # raises DestinationRefused
    await loop.create_connection(..., host=destination.address, port=port,
                                 server_hostname=destination.host if tls else None)

``allow`` lets a place through when the operator's own setting already leads there (a voice
server on this machine: ``reach_of(its OTA host)``). ``own_ports`` narrows "this machine" to the
gateway's own listeners, for a destination the owner may run here beside the gateway (an MCP
board the owner added, docs/mcp-devices.md): anything else listening on this machine is theirs
to name. ``within`` is for an address a LAN peer chose (an mDNS answer): it must lie in one of
these networks, and this machine and the link-local network are refused whatever they hold.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gateway.net.networks import Network, in_networks

__all__ = [
    "LINK_LOCAL",
    "OUTSIDE",
    "THIS_MACHINE",
    "Destination",
    "DestinationRefused",
    "address_reach",
    "literal_reach",
    "reach_of",
    "resolve_destination",
]

THIS_MACHINE = "this machine"
LINK_LOCAL = "the link-local network"
OUTSIDE = "outside the networks allowed"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                             "ip6-loopback"})  # fmt: skip
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # "this host on this network" (RFC 1122)
_NOT_OURS = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class DestinationRefused(OSError):
    """The destination cannot be followed: it leads where it must not, or does not resolve.

    Attributes:
        place: where it leads (``THIS_MACHINE``, ``LINK_LOCAL``); None when it does not resolve.
    """

    def __init__(self, message: str, place: str | None = None) -> None:
        super().__init__(message)
        self.place = place


@dataclass(frozen=True, slots=True)
class Destination:
    """A checked destination: connect to ``address``; TLS names ``host``."""

    host: str
    address: str
    port: int


async def resolve_destination(
    host: str,
    port: int,
    *,
    allow: Collection[str] = (),
    own_ports: Collection[int] | None = None,
    within: Sequence[Network] | None = None,
) -> Destination:
    """Resolve ``host`` once and check every address it resolves to.

    Args:
        host: a name or an address in any spelling the resolver takes (IPv6 with or without
            brackets, a trailing dot).
        port: the port to connect to (only checked to be one).
        allow: places (``THIS_MACHINE``, ``LINK_LOCAL``) that may be reached all the same.
        own_ports: when given, this machine is refused only at these ports (the gateway's own
            listeners) and reached at any other.
        within: when given, every address must lie in one of these networks (else
            ``OUTSIDE``); ``allow`` and ``own_ports`` are then not for this machine's addresses.

    Returns:
        The address to connect to: the first the resolver gave, all of them checked.

    Raises:
        DestinationRefused: ``host`` is empty or malformed, does not resolve, or one of its
            addresses leads to a place not in ``allow``; the text says which, for a log line.
    """
    name = _plain(host)
    if not name or not 0 < port < 65536:
        raise DestinationRefused(f"{host!r} port {port} is not a destination")
    if own_ports is not None and port not in own_ports and within is None:
        allow = {*allow, THIS_MACHINE}
    if name.lower() in _LOOPBACK_NAMES or name.lower().endswith(".localhost"):
        _refuse_if(THIS_MACHINE, host, allow)  # whatever this resolver says of such names
    try:
        answers = await asyncio.get_running_loop().getaddrinfo(
            name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (OSError, UnicodeError) as exc:
        raise DestinationRefused(f"{host} does not resolve ({exc})") from None
    addresses = [
        str(info[4][0]) for info in answers if info[0] in (socket.AF_INET, socket.AF_INET6)
    ]
    if not addresses:
        raise DestinationRefused(f"{host} does not resolve to an IP address")
    for address in addresses:  # every one: a name may list a public and a loopback address
        place = address_reach(address, within)
        if place is not None:
            _refuse_if(place, host, allow)
    return Destination(name, addresses[0], port)


async def reach_of(host: str) -> str | None:
    """Where ``host`` leads (``THIS_MACHINE``, ``LINK_LOCAL``), None elsewhere or unresolvable.

    For the places the operator's own settings lead to, which ``allow`` then lets through.
    """
    try:
        await resolve_destination(host, 1)
    except DestinationRefused as exc:
        return exc.place
    return None


def address_reach(address: str, within: Sequence[Network] | None = None) -> str | None:
    """Where the literal ``address`` (as the resolver answers it) leads, if it must not; with
    ``within``, also ``OUTSIDE`` when it lies in none of those networks."""
    try:
        ip: Address = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 scope
    except ValueError:
        return None if within is None else OUTSIDE
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or _ipv4_compatible(ip)
        if mapped is not None:
            ip = mapped
    if ip.is_loopback or ip.is_unspecified or ip in _THIS_NETWORK or _is_own(str(ip)):
        return THIS_MACHINE
    if ip.is_link_local:
        return LINK_LOCAL
    return OUTSIDE if within is not None and not in_networks(str(ip), within) else None


def literal_reach(host: str) -> str | None:
    """Where ``host`` leads if it says so without DNS: a loopback name, or an address in any
    numeric spelling the resolver takes (``127.1``, ``0x7f000001``, a trailing dot...).

    For an early answer (a setting as it is received); ``resolve_destination`` decides.
    """
    name = _plain(host).lower()
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return THIS_MACHINE
    if ":" not in name:
        try:  # inet_aton reads the numeric forms getaddrinfo reads (glibc shares the parser)
            name = socket.inet_ntoa(socket.inet_aton(name))
        except OSError:
            return None  # a name: only resolving says where it leads
    return address_reach(name)


def _plain(host: str) -> str:
    """``host`` without IPv6 brackets or the root's trailing dot (``169.254.169.254.``)."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def _refuse_if(place: str, host: str, allow: Collection[str]) -> None:
    if place not in allow:
        raise DestinationRefused(f"{host} leads to {place}", place)


def _ipv4_compatible(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    # ::a.b.c.d (deprecated, still routed by some stacks to the IPv4 address)
    if int(ip) >> 32 == 0 and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _is_own(address: str) -> bool:
    """True when ``address`` is one of this machine's: only those can be bound to."""
    if not _binding_tells():
        return False
    return _binds(address)


@functools.cache
def _binding_tells() -> bool:
    # With net.ipv4.ip_nonlocal_bind any address binds: then binding tells nothing.
    return not _binds(_NOT_OURS)


def _binds(address: str) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True
