"""Serving devices: a ``DeviceProtocol`` and a ``DeviceConnection`` per link, any transport.

The WebSocket route hands each accepted link to ``serve``; ``serve_mqtt`` does the same for every
link the MQTT transport opens, each in a task of its own.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from gateway.config import Config, is_loopback_host
from gateway.device_side.broker.aiomqtt_fixes import cancel_all
from gateway.device_side.transports.mqtt import MqttLink, MqttTransport
from gateway.device_side.upstream.mqtt_relay import MqttProxies, MqttRelay
from gateway.device_side.upstream.settings import SERVER_HELLO_SECONDS
from gateway.device_side.upstream.tap import GATEWAY_IDS
from gateway.device_side.vision import VISION_PATH, VisionTokens
from gateway.devices.connection import DeviceConnection
from gateway.devices.events import EventStore
from gateway.devices.link import BOARD_TRANSPORT, DeviceIdentity, DeviceLink
from gateway.devices.registry import DeviceRegistry
from gateway.net.addresses import http_url
from gateway.net.public import PublicAddress
from gateway.protocol import DeviceProtocol

__all__ = ["DeviceSessions"]

logger = logging.getLogger(__name__)
_device_logger = logging.getLogger("gateway.device")  # found once: getLogger takes a lock

# cluster: (link, device id, session id) -> (the link to serve, what to call when it ends)
Bridge = Callable[[DeviceLink, str, str], tuple[DeviceLink, Callable[[], None]]]


class DeviceSessions:
    """Runs each device's session over its link until the link closes."""

    def __init__(
        self,
        config: Config,
        registry: DeviceRegistry,
        public: PublicAddress,
        vision: VisionTokens | None,
        *,
        mqtt_proxies: MqttProxies | None = None,
        events: EventStore | None = None,
        request_ids: Callable[[], range | None] | None = None,
        bridge: Bridge | None = None,
        trouble: Callable[[], str | None] | None = None,
    ) -> None:
        self.mqtt_proxies = mqtt_proxies  # MQTT devices that keep their voice server
        self._config = config
        self._registry = registry
        self._public = public
        self._vision = vision
        self.events = events  # where devices' events go (none: dropped)
        # cluster (gateway/cluster): this replica's slice of request ids (None until it has
        # claimed one: numbered as on a single gateway), the bridge that lets other replicas
        # reach a WebSocket device (it returns the link to serve and what to call when it
        # ends), and why /healthz must fail
        self._request_ids = request_ids
        self.bridge = bridge
        self.trouble = trouble

    async def serve(self, link: DeviceLink, identity: DeviceIdentity) -> None:
        """Run one device connection until its link closes."""
        vision = self.vision_for(identity)
        proxies = self.mqtt_proxies if identity.transport == "mqtt" else None
        relay = proxies.relay(link, identity.device_id, vision) if proxies else nullcontext(link)
        try:
            async with relay as served:  # an MQTT device beside its voice server: relayed
                await self._run(served, identity, vision, proxied=served is not link)
                if isinstance(served, MqttRelay):  # its voice goes on until the device leaves
                    await served.finished()
        finally:
            self.revoke(identity, vision)

    async def serve_board(self, link: DeviceLink, identity: DeviceIdentity) -> None:
        """Run the session of a board that serves MCP itself (gateway/device_side/boards)."""
        await self._run(link, identity, None)

    async def serve_tapped(
        self, link: DeviceLink, identity: DeviceIdentity, vision: dict[str, str] | None
    ) -> None:
        """Run the gateway's session of a proxied device, beside its voice server.

        The voice server answers the hello; the gateway's requests keep to the ids the tap
        keeps for it; ``vision`` is what the tap gives the device in the server's place.
        """
        try:
            await self._run(link, identity, vision, proxied=True)
        finally:
            self.revoke(identity, vision)

    async def _run(
        self,
        link: DeviceLink,
        identity: DeviceIdentity,
        vision: dict[str, str] | None,
        *,
        proxied: bool = False,
    ) -> None:
        log = logging.LoggerAdapter(_device_logger, {"device": identity.device_id})
        mqtt = identity.transport == "mqtt"
        board = identity.transport == BOARD_TRANSPORT
        # A board's link turns a reply over [mcp_boards] max_message_bytes into an error reply
        # (BoardLink): the protocol takes that, with room for the envelope.
        max_bytes = self._config.max_message_bytes
        if board:
            max_bytes = self._config.board_frame_bytes
        protocol = DeviceProtocol(
            identity.device_id,
            transport="udp" if mqtt else identity.transport,
            udp=self._udp_block() if mqtt and not proxied else None,
            max_message_bytes=max_bytes,
            # Over MQTT no hello precedes MCP (our firmware sends none; stock firmware only per
            # voice conversation) and MCP works without one: discover at once (docs/mqtt.md).
            # A board speaks plain MCP: no hello ever comes.
            hello_timeout=0.0 if mqtt or board else self._hello_timeout(proxied),
            discovery_timeout=self._config.discovery_timeout,
            relist_interval=self._config.relist_interval,
            max_calls_in_flight=self._config.call_max_in_flight,
            max_calls_queued=self._config.call_max_queued,
            request_ids=GATEWAY_IDS if proxied else self.request_ids(),
            answer_hello=not proxied,
            pages=self._registry.pages,
            vision=vision,
            clock=asyncio.get_running_loop().time,
            logger=log,
        )
        ended = None
        if self.bridge is not None and not proxied:  # beside a voice server: not bridged
            link, ended = self.bridge(link, identity.device_id, protocol.session_id)
        try:
            await DeviceConnection(link, identity, self._registry, protocol, self.events).run()
        finally:
            if ended is not None:
                ended()

    def request_ids(self) -> range | None:
        """The request ids a new session numbers its requests from (None: from 1)."""
        return self._request_ids() if self._request_ids is not None else None

    def revoke(self, identity: DeviceIdentity, vision: dict[str, str] | None) -> None:
        """The session given ``vision`` ended: its upload token stops working."""
        if self._vision is not None and vision is not None:
            self._vision.revoke(identity.device_id, vision["token"])

    def vision_for(self, identity: DeviceIdentity) -> dict[str, str] | None:
        """Where this device uploads camera photos (``initialize``'s ``capabilities.vision``)."""
        if self._vision is None:
            return None
        scheme, host, port = self._public.device_base(identity.host)
        if is_loopback_host(host) and not self._config.device_listen.is_loopback:
            # Nothing better known (an MQTT device that never checked in through OTA): the
            # URL lives only in the device's RAM for this session, so the LAN address is worth
            # a try where loopback could never work.
            host = self._public.addresses.lan_host(self._config.device_listen)
        url = http_url(scheme, host, port) + VISION_PATH
        return {"url": url, "token": self._vision.issue(identity.device_id)}

    def _hello_timeout(self, proxied: bool) -> float:
        # Proxied, the device's hello reaches the gateway once its server's answer went to the
        # device: the gateway's discovery waits that long, never speaking first.
        hello = self._config.hello_timeout
        return max(hello, SERVER_HELLO_SECONDS) if proxied else hello

    def _udp_block(self) -> dict[str, Any]:
        # docs/protocol.md §2: stock firmware ignores a hello reply without a valid udp
        # block. No audio server listens there (audio is out of scope, docs/mqtt.md): the block
        # only lets the device accept the reply; MCP never needed it.
        _, host, port = self._public.device_base()
        key, nonce = secrets.token_hex(16), "01" + secrets.token_hex(15)
        return {"server": host, "port": port, "key": key, "nonce": nonce}

    async def serve_mqtt(self, transport: MqttTransport) -> None:
        """Serve every device link the MQTT transport opens, each in its own task."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for link, identity in transport.links():
                task = asyncio.create_task(
                    self._serve_mqtt_device(link, identity),
                    name=f"gateway.mqtt.device[{identity.device_id}]",
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            # Cancelled again until they end: a session that swallowed a cancellation (one lost
            # with a PUBACK, say) would otherwise keep the gateway's stop waiting for ever.
            await cancel_all(tasks)

    async def _serve_mqtt_device(self, link: MqttLink, identity: DeviceIdentity) -> None:
        try:
            await self.serve(link, identity)
        except Exception:  # one device's failure must not end the others' sessions
            logger.exception("MQTT device %s: session failed", identity.device_id)
            link.close()
