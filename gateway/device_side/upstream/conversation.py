"""``Conversations``: which device WebSocket sessions are proxied, and each one's life.

The device route asks ``conversations(identity)`` once the device is authenticated: None means
the device is served by the gateway alone (no voice server known for it); otherwise the returned
coroutine function takes the WebSocket over. It opens the upstream first and only then accepts
the device (or refuses it, as its server would have), gives the conversation an ``McpTap`` with
the gateway's camera URL for this session, runs the relay with the gateway's own session on the
tapped link, and keeps the device's upstream state up to date for ``list_devices`` and the
dashboard. A device waiting for approval is relayed all the same: only what hosts see waits.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from starlette.websockets import WebSocket

from gateway.device_side.upstream.fleet import FleetTools
from gateway.device_side.upstream.proxy import VoiceProxy
from gateway.device_side.upstream.relay import UpstreamRefused, open_upstream, relay
from gateway.device_side.upstream.settings import UpstreamWebSocket, server_of
from gateway.device_side.upstream.tap import McpTap
from gateway.devices.link import DeviceIdentity, DeviceLink
from gateway.devices.registry import DeviceRegistry

__all__ = ["Conversations", "ServeTapped"]

logger = logging.getLogger(__name__)

Vision = dict[str, str] | None
ServeTapped = Callable[[DeviceLink, DeviceIdentity, Vision], Coroutine[Any, Any, None]]
"""Runs the gateway's own session on a tapped link, with the camera URL the tap gives out."""
OPEN_SECONDS = 8.0  # of the 10 s the device allows for its handshake (docs/protocol.md §8.2)


class Conversations:
    """Proxies the WebSocket sessions of devices that have a voice server."""

    def __init__(
        self,
        proxy: VoiceProxy,
        registry: DeviceRegistry,
        serve: ServeTapped,
        *,
        vision_for: Callable[[DeviceIdentity], Vision],
        max_message_bytes: int,
        fleet: Callable[[str, str], FleetTools] | None = None,
    ) -> None:
        self._fleet = fleet  # (device id, server) -> the fleet its server is offered; None: none
        self._proxy = proxy
        self._registry = registry
        self._serve = serve
        self._vision_for = vision_for
        self._max_bytes = max_message_bytes

    def __call__(self, identity: DeviceIdentity) -> Callable[[WebSocket], Awaitable[None]] | None:
        """The conversation of ``identity``'s session if it is proxied, else None."""
        device_id = identity.device_id
        upstream, ota_url = self._proxy.websockets.get(device_id), self._proxy.ota_url(device_id)
        if upstream is None or ota_url is None:
            return None  # not proxied, or no check-in through the proxy yet
        return functools.partial(self._converse, identity, upstream, server_of(ota_url))

    async def _converse(
        self,
        identity: DeviceIdentity,
        upstream: UpstreamWebSocket,
        server: str,
        websocket: WebSocket,
    ) -> None:
        device_id = identity.device_id
        try:
            connection = await open_upstream(upstream, identity, websocket.headers,
                                             open_timeout=OPEN_SECONDS,
                                             max_size=self._max_bytes)  # fmt: skip
        except UpstreamRefused as exc:
            logger.warning("device %s: its voice server %s: %s; refusing the device's session "
                           "as its server would have", device_id, upstream.where, exc)  # fmt: skip
            self._registry.set_upstream(device_id, server, str(exc))
            await websocket.close(code=1008)  # before accept(): the device gets HTTP 403
            return
        await websocket.accept()
        vision = self._vision_for(identity)
        tap = self._proxy.taps[device_id] = McpTap(vision)
        self._registry.set_upstream(device_id, server, "in conversation")
        logger.info("device %s: conversation relayed to its voice server %s", device_id,
                    upstream.where)  # fmt: skip
        try:
            fleet = self._fleet(device_id, server) if self._fleet is not None else None
            ended = await relay(websocket, connection, identity, tap,
                                lambda link, who: self._serve(link, who, vision),
                                max_message_bytes=self._max_bytes, fleet=fleet)  # fmt: skip
        finally:
            if self._proxy.taps.get(device_id) is tap:
                del self._proxy.taps[device_id]
        logger.info("device %s: conversation ended: %s", device_id, ended)
        self._registry.set_upstream(device_id, server, f"idle ({ended})")
