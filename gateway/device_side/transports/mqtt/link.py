"""``MqttLink``: one device's session over its ``up`` and ``down`` topics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from gateway.devices.link import DeviceIdentity, LinkClosed

__all__ = ["LinkOwner", "MqttLink"]

logger = logging.getLogger(__package__)  # one logger for the whole transport

_MAX_QUEUED = 256  # messages a device may have waiting; more are dropped (a flood, not a device)


class LinkOwner(Protocol):
    """What a link needs of its transport: publishing, and hearing that a session ended."""

    async def publish(self, device_id: str, text: str) -> None:
        """Publish ``text`` to the down topic of ``device_id``; raise ``LinkClosed`` if not."""
        ...

    def session_ended(self, link: MqttLink) -> None:
        """The gateway ended ``link``'s session."""
        ...


class MqttLink:
    """A ``DeviceLink`` over the device's ``up`` and ``down`` topics."""

    def __init__(self, transport: LinkOwner, device_id: str) -> None:
        self.device_id = device_id
        self.identity = DeviceIdentity(device_id=device_id, client_id=None, transport="mqtt")
        self.closed = False
        self._transport = transport
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()

    def feed(self, text: str) -> None:
        """Queue a message the device published."""
        if self.closed:
            return
        if self._queue.qsize() >= _MAX_QUEUED:
            logger.warning("device %s floods its up topic; message dropped", self.device_id)
            return
        self._queue.put_nowait(text)

    async def send(self, text: str) -> None:
        """Publish one message to the device's down topic."""
        if self.closed:
            raise LinkClosed(f"device {self.device_id} left")
        await self._transport.publish(self.device_id, text)

    async def __aiter__(self) -> AsyncIterator[str]:
        """Yield the device's messages until the link closes."""
        while (text := await self._queue.get()) is not None:
            yield text
            del text  # an idle device must not keep its last message alive (thousands do)

    async def aclose(self) -> None:
        """Close the link from the gateway's side (idempotent)."""
        if not self.closed:
            self.close()
            self._transport.session_ended(self)

    def close(self) -> None:
        """Close the link now; the iterator ends after the messages already queued."""
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(None)
