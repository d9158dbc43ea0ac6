"""Boards that announce MCP over mDNS (``[mcp_boards] discover``): proposed, never trusted.

What the boards really announce (docs/mcp-devices.md): ESP-Claw ``_mcp._tcp`` on port 18791 with
TXT ``endpoint=mcp_server`` (a path without its slash); mcpd ``_mcp._tcp`` with TXT
``path=/mcp`` and ``endpoint=http://<ip>:<port>/mcp``; mcp-c-sdk itself announces nothing. The
URL is built from the announced address and port, never from a host named in TXT: the announced
address is the one ``address.resolve_board`` then checks.

Anyone on the LAN can answer mDNS, with any address, port and path, as often as they like; what
an answer may cost is bounded here, before any board is made of it:

- the address must lie in the discovery networks (``[mcp_boards] discover_networks``, else
  the networks of the interfaces browsed on) and never be this machine (loopback, any of its
  addresses: its other services are the owner's to add by URL) nor link-local
  (``destinations.address_reach``); of several announced addresses the first allowed is used;
- new boards at one address: ``NEW_BOARDS_BURST`` at once, then ``NEW_BOARDS_PER_MINUTE``. The
  announced address stands for the announcer: zeroconf's API does not say which host sent an
  answer, a board announces its own address, and the address is where the gateway would go;
- the boards waiting for approval are the fleet's to cap (``found`` says why not);
- at most ``_MAX_LOOKUPS`` names looked up at once, ``_MAX_BOARDS`` names kept.

Each announcement ignored says why in the log, one line per reason every 10 s at most.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from gateway.net.addresses import url_host
from gateway.net.destinations import LINK_LOCAL, OUTSIDE, THIS_MACHINE, address_reach
from gateway.net.networks import Network
from gateway.net.rate_limit import RateLimiter
from gateway.net.throttled import ThrottledLog

__all__ = ["NEW_BOARDS_BURST", "NEW_BOARDS_PER_MINUTE", "SERVICE_TYPES", "Discovery",
           "board_url_of"]  # fmt: skip

logger = logging.getLogger(__name__)

SERVICE_TYPES = ["_mcp._tcp.local."]
NEW_BOARDS_BURST = 4  # new boards one address may announce at once (a board announces one)
NEW_BOARDS_PER_MINUTE = 2.0  # and then
_LOOKUP_MS = 3000
_MAX_LOOKUPS = 64  # names looked up at once (each waits up to _LOOKUP_MS for its records)
_MAX_BOARDS = 256  # announced boards kept at once: a flood of announcements is not a fleet
_ADDRESSES_KEPT = 1024  # announcers whose rate is remembered (the longest unseen is forgotten)


def board_url_of(address: str, port: int, properties: dict[bytes, bytes | None]) -> str:
    """The MCP URL of a board announced at ``address``:``port`` with these TXT properties."""
    text = {k.decode(errors="replace").lower(): (v or b"").decode(errors="replace")
            for k, v in properties.items()}  # fmt: skip
    path = text.get("path") or text.get("endpoint") or "/mcp"
    if "://" in path:  # mcpd: a whole URL; only its path counts
        path = urllib.parse.urlsplit(path).path or "/mcp"
    path = "/" + path.lstrip("/")
    return f"http://{url_host(address)}:{port}{urllib.parse.quote(path, safe='/_-.~')}"


class Discovery:
    """Browses mDNS; tells ``found(url)`` and ``lost(url)`` as boards come and go.

    ``found`` returns None when it took the board, else why not (for the log). ``networks``:
    where a board may be.
    """

    def __init__(
        self,
        found: Callable[[str], str | None],
        lost: Callable[[str], None],
        interfaces: list[str] | None = None,
        networks: Sequence[Network] = (),
    ) -> None:
        self._found = found
        self._lost = lost
        self._interfaces = interfaces
        self._networks = tuple(networks)
        self._urls: dict[str, str] = {}  # service name -> URL
        self._zeroconf: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._rate = RateLimiter(NEW_BOARDS_PER_MINUTE, NEW_BOARDS_BURST,
                                 max_addresses=_ADDRESSES_KEPT)  # fmt: skip
        self._ignored = ThrottledLog(logger)

    async def start(self) -> None:
        """Start browsing."""
        kwargs: dict[str, Any] = {"ip_version": IPVersion.V4Only}
        if self._interfaces:
            kwargs["interfaces"] = self._interfaces
        self._zeroconf = AsyncZeroconf(**kwargs)
        self._browser = AsyncServiceBrowser(
            self._zeroconf.zeroconf, SERVICE_TYPES, handlers=[self._on_change]
        )
        logger.info("browsing mDNS for boards: %s, in %s", ", ".join(SERVICE_TYPES),
                    self._shown_networks())  # fmt: skip

    async def stop(self) -> None:
        """Stop browsing."""
        for task in self._tasks:
            task.cancel()
        if self._browser is not None:
            await self._browser.async_cancel()
        if self._zeroconf is not None:
            await self._zeroconf.async_close()

    def _on_change(self, zeroconf: Zeroconf, service_type: str, name: str,
                   state_change: ServiceStateChange) -> None:  # fmt: skip
        # zeroconf's handler signature: it calls this on the loop, by keyword
        if state_change is ServiceStateChange.Removed:
            url = self._urls.pop(name, None)
            if url is not None:
                self._lost(url)
            return
        if len(self._tasks) >= _MAX_LOOKUPS:
            self._decide(name, ("lookups", f"{_MAX_LOOKUPS} other announcements are being "
                                           "looked up"))  # fmt: skip
            return
        task = asyncio.get_running_loop().create_task(
            self._look_up(service_type, name), name=f"gateway.boards.mdns[{name}]"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _look_up(self, service_type: str, name: str) -> None:
        self._decide(name, await self._consider(service_type, name))

    async def _consider(self, service_type: str, name: str) -> tuple[str, str] | None:
        """Take the board ``name`` announces; None, else (the kind of reason, why not)."""
        assert self._zeroconf is not None
        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(self._zeroconf.zeroconf, _LOOKUP_MS):
            return "lookup", "no complete answer to its lookup"
        addresses = info.parsed_addresses()
        if not addresses or not info.port:
            return "lookup", "it names no address or no port"
        places = [(address, address_reach(address, self._networks)) for address in addresses]
        address = next((address for address, place in places if place is None), None)
        if address is None:
            address, place = places[0]
            return f"address {place}", f"announced at {address}, {self._refused(place)}"
        url = board_url_of(address, info.port, dict(info.properties))
        if self._urls.get(name) == url:
            return None
        if url not in self._urls.values():  # a new board: what its address may still announce
            if self._rate.wait(address):
                return "rate", (f"{address} announced more than {NEW_BOARDS_BURST} new boards, "
                                f"then {NEW_BOARDS_PER_MINUTE:g} a minute")  # fmt: skip
            if name not in self._urls and len(self._urls) >= _MAX_BOARDS:
                return "full", f"{_MAX_BOARDS} boards are announced already"
        refusal = self._found(url)
        if refusal is not None:
            return "full", refusal
        old, self._urls[name] = self._urls.get(name), url
        if old is not None:
            self._lost(old)
        return None

    def _decide(self, name: str, ignored: tuple[str, str] | None) -> None:
        """Every announcement considered ends here: taken (``ignored`` None), or ignored and
        said why in the log (a line per reason and interval)."""
        if ignored is not None:
            kind, why = ignored
            self._ignored.warning(kind, "mDNS: announcement %r ignored: %s", name, why)

    def _refused(self, place: str | None) -> str:
        if place == THIS_MACHINE:
            return ("an address of this machine (a board here is yours to add by URL: "
                    "esp-mcp-gateway devices add URL)")  # fmt: skip
        if place == LINK_LOCAL:
            return "a link-local address"
        assert place == OUTSIDE
        return (f"outside the networks boards are discovered in ({self._shown_networks()}; "
                "[mcp_boards] discover_networks)")  # fmt: skip

    def _shown_networks(self) -> str:
        return ", ".join(map(str, self._networks)) or "no network"
