"""``LocalClient``: the gateway's MQTT client inside the embedded broker, with no socket.

It has ``BrokerClient``'s shape (``publish()``, ``connected``, ``run()``, and the
``on_connected``/``on_disconnected``/``on_message`` callbacks) so ``MqttTransport`` runs over
either. Attached straight to the broker, a device's message reaches the transport as the broker
read it: no loopback MQTT connection, no second parse, no task or wait per message. Presence
comes the same way, synchronously (``on_presence``): a device's first message, read right after
its CONNACK, always finds the session its connect opened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from gateway.device_side.broker import GATEWAY_LOGIN, EmbeddedBroker, Presence
from gateway.devices.link import LinkClosed

__all__ = ["LocalClient"]

logger = logging.getLogger(__package__)  # one logger for the whole transport


class LocalClient:
    """Subscribed in ``broker`` while ``run()`` runs; hands each message to ``on_message``."""

    username: str | None = (
        GATEWAY_LOGIN  # the broker's ACL: the gateway receives everything it asks for
    )

    def __init__(
        self,
        broker: EmbeddedBroker,
        subscriptions: Sequence[tuple[str, int]],
        *,
        on_connected: Callable[[], None],
        on_disconnected: Callable[[], None],
        on_message: Callable[[str, object], None],
        on_presence: Callable[[Presence], None],
    ) -> None:
        self.broker = broker
        self.client_id = "esp-mcp-gateway-local"
        self.connected = asyncio.Event()
        self._subscriptions = subscriptions
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._on_message = on_message
        self._on_presence = on_presence

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """A message routed to the gateway (called by the broker, in the device's read)."""
        try:
            self._on_message(topic, payload)
        except Exception:  # a bug of ours must not close the device's connection
            logger.exception("MQTT message on %s not handled", topic)

    def presence(self, presence: Presence) -> None:
        """A device connected to or left the broker (called by the broker)."""
        try:
            self._on_presence(presence)
        except Exception:
            logger.exception("MQTT presence of %s not handled", presence.device_id)

    async def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        """Publish ``payload`` on ``topic`` (QoS 1 unless told, as the TCP client does).

        Raises:
            LinkClosed: the client is not attached (not running, or the broker stopped).
        """
        if not self.connected.is_set() or not self.broker.running:
            raise LinkClosed("not connected to the MQTT broker")
        self.broker.route(topic, payload, qos, False)

    async def run(self) -> None:
        """Stay attached until cancelled: subscribe, report presence, hand messages on."""
        broker = self.broker
        broker.attach(self, self._subscriptions)
        broker.watch(self.presence)
        try:
            self.connected.set()
            self._on_connected()
            for device_id in sorted(broker.online()):  # those already there
                self.presence(Presence(device_id, True))
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            broker.unwatch(self.presence)
            broker.detach(self, self._subscriptions)
            self.connected.clear()
            self._on_disconnected()
