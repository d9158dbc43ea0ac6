"""One live device: pumps its link through the sans-I/O protocol and turns events into effects.

``DeviceConnection.run()`` owns the link for its whole life: it feeds every incoming message to
``DeviceProtocol``, sends what the protocol queues, hands listed catalogues to the registry, and
resolves the futures of pending calls. When the link goes, every pending call fails at once
(DESIGN.md "Calls": a disconnect must not wait for the call timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
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
    Event,
    HelloReceived,
    MessageDropped,
    ToolsListed,
)

__all__ = ["DeviceConnection"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]


class DeviceConnection:
    """A connected device: implements the registry's ``DeviceSession``."""

    def __init__(
        self,
        link: DeviceLink,
        identity: DeviceIdentity,
        registry: DeviceRegistry,
        *,
        protocol: DeviceProtocol,
        hello_timeout: float,
        discovery_timeout: float,
    ) -> None:
        self.identity = identity
        self._link = link
        self._registry = registry
        self._protocol = protocol
        self._hello_timeout = hello_timeout
        self._discovery_timeout = discovery_timeout
        self._pending: dict[int, asyncio.Future[JsonObject]] = {}
        self._send_lock = asyncio.Lock()
        self._listed = asyncio.Event()
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
        watchdog = asyncio.create_task(
            self._watch_discovery(), name=f"gateway.device[{self.identity.device_id}].discovery"
        )
        try:
            async for text in self._link:
                self._protocol.receive_text(text)
                self._handle(self._protocol.events_received())
                await self._flush()
        except (LinkClosed, DeviceUnavailable):
            pass
        finally:
            watchdog.cancel()
            self._fail_pending(self._protocol.close())
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
        self._pending[call_id] = future
        try:
            await self._flush()
            return await future
        finally:
            if self._pending.pop(call_id, None) is not None:
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
                    self._fail_pending(self._protocol.close())
                    raise DeviceUnavailable(
                        self.identity.device_id, "device disconnected"
                    ) from None

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
                self._listed.set()
            elif isinstance(event, HelloReceived):
                self._log.debug("hello: %s", event.hello)
            elif isinstance(event, DeviceGoodbye):
                self._log.info("device said goodbye")
            elif isinstance(event, MessageDropped):
                self._log.debug("dropped: %s %s", event.reason, event.detail)

    def _settle(self, event: CallSucceeded | CallFailed) -> None:
        future = self._pending.pop(event.call_id, None)
        if future is None or future.done():
            return
        if isinstance(event, CallSucceeded):
            future.set_result(event.result)
        else:
            future.set_exception(
                DeviceToolError(self.identity.device_id, event.message, event.code)
            )

    def _fail_pending(self, call_ids: list[int]) -> None:
        for call_id in call_ids:
            future = self._pending.pop(call_id, None)
            if future is not None and not future.done():
                future.set_exception(
                    DeviceUnavailable(
                        self.identity.device_id, "device disconnected during the call"
                    )
                )

    async def _watch_discovery(self) -> None:
        """Start discovery if the device never says hello; drop it if discovery never ends."""
        try:
            async with asyncio.timeout(self._hello_timeout):
                await self._listed.wait()
                return
        except TimeoutError:
            self._protocol.start_discovery()
            with contextlib.suppress(DeviceUnavailable):
                await self._flush()
        try:
            async with asyncio.timeout(self._discovery_timeout):
                await self._listed.wait()
        except TimeoutError:
            self._log.warning(
                "no tool list within %g s; closing the connection", self._discovery_timeout
            )
            await self._link.aclose()
