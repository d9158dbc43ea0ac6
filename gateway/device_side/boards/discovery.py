"""Boards that announce MCP over mDNS (``[mcp_boards] discover``): proposed, never trusted.

What the boards really announce (docs/mcp-devices.md): ESP-Claw ``_mcp._tcp`` on port 18791 with
TXT ``endpoint=mcp_server`` (a path without its slash); mcpd ``_mcp._tcp`` with TXT
``path=/mcp`` and ``endpoint=http://<ip>:<port>/mcp``; mcp-c-sdk itself announces nothing. The
URL is built from the announced address and port, never from a host named in TXT: the announced
address is the one ``address.resolve_board`` then checks.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from gateway.net.addresses import url_host

__all__ = ["SERVICE_TYPES", "Discovery", "board_url_of"]

logger = logging.getLogger(__name__)

SERVICE_TYPES = ["_mcp._tcp.local."]
_LOOKUP_MS = 3000
_MAX_BOARDS = 256  # announced boards kept at once: a flood of announcements is not a fleet


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
    """Browses mDNS; tells ``found(url)`` and ``lost(url)`` as boards come and go."""

    def __init__(
        self,
        found: Callable[[str], None],
        lost: Callable[[str], None],
        interfaces: list[str] | None = None,
    ) -> None:
        self._found = found
        self._lost = lost
        self._interfaces = interfaces
        self._urls: dict[str, str] = {}  # service name -> URL
        self._zeroconf: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start browsing."""
        kwargs: dict[str, Any] = {"ip_version": IPVersion.V4Only}
        if self._interfaces:
            kwargs["interfaces"] = self._interfaces
        self._zeroconf = AsyncZeroconf(**kwargs)
        self._browser = AsyncServiceBrowser(
            self._zeroconf.zeroconf, SERVICE_TYPES, handlers=[self._on_change]
        )
        logger.info("browsing mDNS for boards: %s", ", ".join(SERVICE_TYPES))

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
        task = asyncio.get_running_loop().create_task(
            self._look_up(service_type, name), name=f"gateway.boards.mdns[{name}]"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _look_up(self, service_type: str, name: str) -> None:
        assert self._zeroconf is not None
        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(self._zeroconf.zeroconf, _LOOKUP_MS):
            return
        addresses = info.parsed_addresses()
        if not addresses or not info.port:
            return
        url = board_url_of(addresses[0], info.port, dict(info.properties))
        if self._urls.get(name) == url:
            return
        if name not in self._urls and len(self._urls) >= _MAX_BOARDS:
            logger.warning("mDNS: %d boards announced already; %s ignored", _MAX_BOARDS, name)
            return
        old, self._urls[name] = self._urls.get(name), url
        if old is not None:
            self._lost(old)
        self._found(url)
