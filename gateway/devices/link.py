"""The seam between a transport and a device connection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, TypeGuard

__all__ = ["BOARD_TRANSPORT", "DeviceIdentity", "DeviceLink", "LinkClosed", "PushLink", "is_push"]

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
    """One device's text messages: what every transport offers a ``DeviceConnection``.

    Besides its methods, each link states what it can do (a class attribute each: ``sends_whole``,
    ``pushes``, ``fail``): the connection picks how to send, receive and fail by what the link
    declares, never by which attributes it happens to have.
    """

    @property
    def sends_whole(self) -> bool:
        """A frame is written whole or not at all, even when its send is cancelled (the
        WebSocket): a caller may send its own request, with no task in between."""
        ...

    @property
    def pushes(self) -> bool:
        """The link is a ``PushLink`` (``is_push(link)`` says so to the type checker)."""
        ...

    @property
    def fail(self) -> Callable[[], None] | None:
        """How the link ends as failed (the WebSocket's 1011), not as a normal close; None when
        it ends only one way (``aclose``)."""
        ...

    async def send(self, text: str) -> None:
        """Send one text message; raise ``LinkClosed`` if the link is gone."""
        ...

    def __aiter__(self) -> AsyncIterator[str]:
        """Yield each text message the device sends, until the link closes."""
        ...

    async def aclose(self) -> None:
        """Close the link (idempotent)."""
        ...


class PushLink(DeviceLink, Protocol):
    """A link that hands each message over in the loop turn it arrives (the device WebSocket):
    a call's answer settles the call without waking the connection's task first."""

    async def deliver(self, receive: Callable[[str], None]) -> None:
        """Call ``receive`` with each text message as it arrives, until the link closes."""
        ...

    def write_now(self, texts: list[str]) -> int:
        """Write the first of ``texts`` (text messages, in order) that need no wait, in one
        write; return how many (0 when the link must be waited for, or is closed)."""
        ...


def is_push(link: DeviceLink) -> TypeGuard[PushLink]:
    """Is ``link`` a ``PushLink``? As it declares (``DeviceLink.pushes``)."""
    return link.pushes
