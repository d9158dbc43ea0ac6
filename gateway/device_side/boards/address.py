"""Where a board's URL really leads, checked after resolution, before any request goes there.

A board's URL comes from the owner, or from whatever answers mDNS on the LAN. Either way the
gateway must not become a way to reach what the board's URL should never name: the gateway's
own listeners (a loop, or the host API reached from the device side) and link-local addresses
(cloud metadata services at 169.254.169.254, other hosts' autoconfigured interfaces). A board
the owner added elsewhere on this machine (another port) is theirs and is reached; a board a
LAN peer announced (mDNS) is reached only inside the discovery networks, never on this machine
at all (its other services: loopback, any of its addresses). The checks are
``resolve_destination``'s (gateway/net/destinations.py): the name is resolved once per
connection attempt and the request goes to the address that was checked (``Target.url``, with
the original ``Host``), so a second resolution cannot lead elsewhere.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gateway.net.addresses import url_host
from gateway.net.destinations import (
    LINK_LOCAL,
    OUTSIDE,
    THIS_MACHINE,
    DestinationRefused,
    resolve_destination,
)
from gateway.net.networks import Network

__all__ = ["Target", "resolve_board"]

# What a refused place is to a board's owner (the board's problem, in list_devices and the log).
_PLACES = {THIS_MACHINE: "this gateway itself", LINK_LOCAL: "a link-local address",
           OUTSIDE: "outside the networks boards are discovered in"}  # fmt: skip
_DISCOVERED_PLACES = {**_PLACES, THIS_MACHINE: "this machine"}


@dataclass(frozen=True, slots=True)
class Target:
    """A board's URL pinned to the address it resolved to."""

    url: str  # the URL with the checked address in place of the name (http only)
    host: str | None  # the Host header the board expects, when ``url`` has an address
    address: str


async def resolve_board(
    url: str, own_ports: Collection[int], within: Sequence[Network] | None = None
) -> Target | str:
    """The checked address of the board at ``url``, or why the gateway will not connect there.

    ``own_ports``: the ports this gateway listens on (device, host, MQTT); a board on this
    machine at one of them would be the gateway itself. ``within``: for a discovered board,
    the networks it may be in (``[mcp_boards] discover_networks``); this machine is refused.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        destination = await resolve_destination(host, port, own_ports=own_ports, within=within)
    except DestinationRefused as exc:
        if exc.place is None:
            return f"cannot resolve {host}: {exc}"
        places = _PLACES if within is None else _DISCOVERED_PLACES
        return f"{host} leads to {places.get(exc.place, exc.place)}"
    if parts.scheme == "https":  # the certificate names the host: keep it (and its SNI)
        return Target(url, None, destination.address)
    netloc = f"{url_host(destination.address)}:{port}"
    pinned = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return Target(pinned, parts.netloc.rpartition("@")[2], destination.address)
