"""The seam between a transport and a device connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

__all__ = ["BOARD_TRANSPORT", "DeviceIdentity", "DeviceLink", "LinkClosed"]

# A board that serves MCP itself, the gateway its MCP client (gateway/device_side/boards).
BOARD_TRANSPORT = "mcp-http"


class LinkClosed(Exception):
    """The link to the device is gone."""


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """Who is on the other end of a link, as the transport authenticated it."""

    device_id: str
    client_id: str | None
    transport: str
    host: str | None = None  # the Host header a WebSocket device used: how it reaches us


class DeviceLink(Protocol):
    """One device's text messages: what every transport offers a ``DeviceConnection``."""

    async def send(self, text: str) -> None:
        """Send one text message; raise ``LinkClosed`` if the link is gone."""
        ...

    def __aiter__(self) -> AsyncIterator[str]:
        """Yield each text message the device sends, until the link closes."""
        ...

    async def aclose(self) -> None:
        """Close the link (idempotent)."""
        ...
