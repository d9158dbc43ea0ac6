"""One live device: pumps its link through the sans-I/O protocol and turns events into effects.

``DeviceConnection.run()`` owns the link for its whole life: it feeds every incoming message to
``DeviceProtocol``, sends what the protocol queues, hands listed catalogues to the registry,
resolves the futures of pending calls, and arms one timer for the protocol's deadline (the
protocol decides what a deadline means: discover without a hello, or give up discovery). When
the link goes, the protocol fails every pending call at once (DESIGN.md "Calls": a disconnect
must not wait for the call timeout).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.devices.link import DeviceIdentity, DeviceLink, LinkClosed
from gateway.devices.registry import DeviceRegistry
from gateway.errors import DeviceToolError, DeviceUnavailable
from gateway.protocol import (
    CallFailed,
    CallSucceeded,
    DeviceGoodbye,
    DeviceProtocol,
    DiscoveryTimedOut,
    Event,
    HelloReceived,
    MessageDropped,
    State,
    ToolsListed,
)

__all__ = ["DeviceConnection"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]


class DeviceConnection:
    """A connected device: implements the registry's ``DeviceSession``.

    The protocol must read the running loop's clock (``clock=loop.time``): its ``timer`` is
    armed with ``loop.call_at``.
    """

    def __init__(
        self,
        link: DeviceLink,
        identity: DeviceIdentity,
        registry: DeviceRegistry,
        protocol: DeviceProtocol,
    ) -> None:
        self.identity = identity
        self._link = link
        self._registry = registry
        self._protocol = protocol
        self._futures: dict[int, asyncio.Future[JsonObject]] = {}
        self._send_lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._log = logging.LoggerAdapter(logger, {"device_id": identity.device_id})

    async def run(self) -> None:
        """Serve the device until its link closes (or ``aclose`` is called)."""
        replaced = self._registry.connect(
            self.identity.device_id,
            self,
            client_id=self.identity.client_id,
            transport=self.identity.transport,
        )
        if replaced is not None:  # the device reconnected before we saw the old link drop
            await replaced.aclose()
        try:
            self._arm()  # MQTT: a deadline already due, discovery starts at once
            async for text in self._link:
                self._protocol.receive_text(text)
                del text  # not kept alive while the device is idle: a tools/list page is 8 KB
                self._handle(self._protocol.events_received())
                await self._flush()
                self._arm()
        except (LinkClosed, DeviceUnavailable):
            pass
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._protocol.close()
            self._handle(self._protocol.events_received())
            self._registry.disconnect(self.identity.device_id, self)
            await self._link.aclose()

    async def call(self, tool: str, arguments: JsonObject) -> JsonObject:
        """Call ``tool`` on the device; return its result.

        The caller bounds the wait (``asyncio.timeout``); a call cancelled that way is forgotten,
        so a late answer is dropped.

        Raises:
            DeviceUnavailable: the link is gone or goes away before the answer.
            DeviceToolError: the device answered with an error.
        """
        call_id = self._protocol.call_tool(tool, arguments)
        future: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        self._futures[call_id] = future
        try:
            await self._flush()
            return await future
        finally:
            if self._futures.pop(call_id, None) is not None:
                self._protocol.forget(call_id)  # timed out or cancelled by the host

    async def aclose(self) -> None:
        """Close the link; ``run`` then cleans up."""
        await self._link.aclose()

    # --- internals -------------------------------------------------------------------------

    async def _flush(self) -> None:
        # The lock keeps frames in the order the protocol queued them across concurrent calls.
        async with self._send_lock:
            for frame in self._protocol.data_to_send():
                try:
                    await self._link.send(frame)
                except LinkClosed:
                    self._protocol.close()
                    self._handle(self._protocol.events_received())
                    raise DeviceUnavailable(
                        self.identity.device_id, "device disconnected"
                    ) from None

    def _arm(self) -> None:
        """Keep one timer armed for the protocol's deadline."""
        deadline = self._protocol.timer
        if self._timer is not None:
            if deadline is not None and self._timer.when() == deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._protocol.handle_timer()
        self._handle(self._protocol.events_received())
        # Sending is async: a task sends what the deadline queued (initialize), or closes.
        self._timer_task = asyncio.create_task(
            self._after_timer(), name=f"gateway.device[{self.identity.device_id}].timer"
        )
        self._arm()

    async def _after_timer(self) -> None:
        try:
            await self._flush()
        except DeviceUnavailable:
            return
        if self._protocol.state is State.CLOSED:  # discovery gave up: end the session
            await self._link.aclose()

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, CallSucceeded | CallFailed):
                self._settle(event)
            elif isinstance(event, ToolsListed):
                if not event.complete:
                    self._log.warning(
                        "tools/list stopped early; keeping %d tools", len(event.tools)
                    )
                self._registry.set_catalogue(
                    self.identity.device_id, event.tools, event.server_info
                )
            elif isinstance(event, DiscoveryTimedOut):
                self._log.warning("no tool list within %g s; closing the connection", event.seconds)
            elif isinstance(event, HelloReceived):
                self._log.debug("hello: %s", event.hello)
            elif isinstance(event, DeviceGoodbye):
                self._log.info("device said goodbye")
            elif isinstance(event, MessageDropped):
                self._log.debug("dropped: %s %s", event.reason, event.detail)

    def _settle(self, event: CallSucceeded | CallFailed) -> None:
        future = self._futures.pop(event.call_id, None)
        if future is None or future.done():
            return
        device_id = self.identity.device_id
        if isinstance(event, CallSucceeded):
            future.set_result(event.result)
        elif event.closed:
            future.set_exception(DeviceUnavailable(device_id, event.message))
        else:
            future.set_exception(DeviceToolError(device_id, event.message, event.code))
