"""``MqttLink``: one device's session over its ``up`` and ``down`` topics."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Protocol

from gateway.devices.link import DeviceIdentity, LinkClosed
from gateway.net.limits import ThrottledLog

__all__ = ["LinkOwner", "MqttLink"]

logger = logging.getLogger(__package__)  # one logger for the whole transport
_log = ThrottledLog(logger)  # a flood is thousands of messages a second: not a line for each

_MAX_QUEUED = 256  # messages a device may have waiting; more are dropped (a flood, not a device)
# and their characters: 256 messages of the broker's largest packet would be 64 MiB a device
_MAX_QUEUED_CHARS = 1024 * 1024


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

    sends_whole = False  # a cancelled publish may have gone already: the connection's task sends
    pushes = False
    fail = None  # a device's session ends one way: the gateway stops listening to it

    def __init__(self, transport: LinkOwner, device_id: str) -> None:
        self.device_id = device_id
        self.identity = DeviceIdentity(device_id=device_id, client_id=None, transport="mqtt")
        self.closed = False
        self._transport = transport
        # Not an asyncio.Queue: that is four deques and an Event per device, held for as long
        # as it is connected; an idle link holds only the future its reader waits on.
        self._queue: deque[str | None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._queued_chars = 0

    @property
    def queued(self) -> int:
        """Messages waiting for the reader (the end marker included)."""
        return len(self._queue) if self._queue is not None else 0

    def _put(self, item: str | None) -> None:
        if self._queue is None:
            self._queue = deque()
        self._queue.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _get(self) -> str | None:
        while not self._queue:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._queue.popleft()
        if item is not None:
            self._queued_chars -= len(item)
        if not self._queue:
            self._queue = None  # an idle link keeps no deque
        return item

    def feed(self, text: str) -> None:
        """Queue a message the device published."""
        if self.closed:
            return
        if self.queued >= _MAX_QUEUED or self._queued_chars + len(text) > _MAX_QUEUED_CHARS:
            _log.warning("flood", "device %s floods its up topic; message dropped",
                         self.device_id)  # fmt: skip
            return
        self._queued_chars += len(text)
        self._put(text)

    async def send(self, text: str) -> None:
        """Publish one message to the device's down topic."""
        if self.closed:
            raise LinkClosed(f"device {self.device_id} left")
        await self._transport.publish(self.device_id, text)

    async def __aiter__(self) -> AsyncIterator[str]:
        """Yield the device's messages until the link closes."""
        while (text := await self._get()) is not None:
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
            self._put(None)
