"""``Conversations``: which device WebSocket sessions are proxied, and each one's life.

The device route asks ``conversations(identity)`` once the device is authenticated: None means
the device is served by the gateway alone (no voice server known for it); otherwise the returned
coroutine function takes the WebSocket over. It opens the upstream first, at the address checked
after resolution (``destination_of``), and only then accepts the device (or refuses it: 403 as
its server would have, 502/504 when the gateway cannot reach it or will not follow it), gives
the conversation an ``McpTap`` with
the gateway's camera URL for this session, runs the relay with the gateway's own session on the
tapped link, and keeps the device's upstream state up to date for ``list_devices`` and the
dashboard. A device waiting for approval is relayed all the same: only what hosts see waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from starlette.responses import PlainTextResponse

from gateway.device_side.upstream.fleet import FleetTools
from gateway.device_side.upstream.proxy import VoiceProxy
from gateway.device_side.upstream.relay import (
    ProxiedWebSocket,
    UpstreamRefused,
    open_upstream,
    relay,
)
from gateway.device_side.upstream.settings import (
    SERVER_MESSAGE_BYTES,
    UpstreamSettingsError,
    UpstreamWebSocket,
    destination_of,
    server_of,
)
from gateway.device_side.upstream.tap import McpTap
from gateway.devices.link import DeviceIdentity, DeviceLink
from gateway.devices.registry import DeviceRegistry
from gateway.net.destinations import DestinationRefused

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
        self._server_bytes = max(max_message_bytes, SERVER_MESSAGE_BYTES)

    def __call__(
        self, identity: DeviceIdentity
    ) -> Callable[[ProxiedWebSocket], Awaitable[None]] | None:
        """The conversation of ``identity``'s session if it is proxied, else None."""
        device_id = identity.device_id
        upstream, ota_url = self._proxy.websockets.get(device_id), self._proxy.ota_url(device_id)
        if upstream is None or ota_url is None:
            return None  # not proxied, or no check-in through the proxy yet
        return functools.partial(self._converse, identity, upstream, ota_url)

    async def _converse(
        self,
        identity: DeviceIdentity,
        upstream: UpstreamWebSocket,
        ota_url: str,
        websocket: ProxiedWebSocket,
    ) -> None:
        device_id, server = identity.device_id, server_of(ota_url)
        try:
            async with asyncio.timeout(OPEN_SECONDS):  # resolving counts in the device's 10 s
                destination = await destination_of(upstream.url, ota_url)  # as checked now
                connection = await open_upstream(upstream, identity, websocket.headers,
                                                 destination=destination,
                                                 open_timeout=OPEN_SECONDS,
                                                 max_size=self._server_bytes)  # fmt: skip
        except (UpstreamRefused, UpstreamSettingsError, DestinationRefused, TimeoutError) as exc:
            status = _status(exc)
            why = str(exc) or f"it did not answer within {OPEN_SECONDS:g} s"
            logger.warning("device %s: its voice server %s: %s; the device's session is "
                           "answered HTTP %d", device_id, upstream.where, why, status)  # fmt: skip
            self._registry.set_upstream(device_id, server, why)
            await _deny(websocket, status, why)
            return
        await websocket.accept()
        vision = self._vision_for(identity)
        tap = self._proxy.taps[device_id] = McpTap(vision)
        self._registry.set_upstream(device_id, server, "in conversation")
        logger.info("device %s: conversation relayed to its voice server %s", device_id,
                    upstream.where)  # fmt: skip
        stop = asyncio.Event()
        self._proxy.enders[device_id] = stop.set
        try:
            fleet = self._fleet(device_id, server) if self._fleet is not None else None

            def say(ended: str) -> None:
                self._registry.set_upstream(device_id, server, f"idle ({ended})")

            ended = await relay(websocket, connection, identity, tap,
                                lambda link, who: self._serve(link, who, vision),
                                max_message_bytes=self._max_bytes, fleet=fleet,
                                stop=stop, ended_with=say)  # fmt: skip
        finally:
            if self._proxy.taps.get(device_id) is tap:
                del self._proxy.taps[device_id]
            if self._proxy.enders.get(device_id) == stop.set:
                del self._proxy.enders[device_id]
        logger.info("device %s: conversation ended: %s", device_id, ended)


def _status(exc: Exception) -> int:
    """The device's answer: the server's refusal as 403, as the server would have; the
    gateway's failure to reach it (unreachable 502, too slow 504, not followed 502) as 5xx."""
    if isinstance(exc, UpstreamRefused):
        return exc.status
    return 504 if isinstance(exc, TimeoutError) else 502


async def _deny(websocket: ProxiedWebSocket, status: int, why: str) -> None:
    """Answer the device's handshake with ``status`` (before accept())."""
    if status == 403:
        await websocket.close(code=1008)  # before accept(): HTTP 403, as the server answers
        return
    response = PlainTextResponse(f"voice server: {why}\n", status_code=status)
    with contextlib.suppress(RuntimeError):  # a server without the denial extension: 403
        await websocket.send_denial_response(response)
        return
    await websocket.close(code=1011)
