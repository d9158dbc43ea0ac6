"""The gateway's one MQTT client (aiomqtt, on the event loop) and the broker it logs in to.

``BrokerClient.run()`` connects, subscribes, hands every message on, and reconnects for as long
as it runs (to a broker cluster's next node at once, failover.py; then with backoff); losing
the broker is told to the transport at once, so its links close now (pending calls fail now,
not at their timeout).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt

from gateway.compat.aiomqtt import FleetClient, consume_disconnect, mend_socket_registration
from gateway.device_side.broker.aiomqtt_fixes import (
    honour_cancellation,
    publish_honouring_cancellation,
    subscribe_all,
)
from gateway.device_side.transports.mqtt.failover import Failover
from gateway.devices.link import LinkClosed

__all__ = ["BrokerClient", "BrokerLogin", "honour_cancellation"]

logger = logging.getLogger(__package__)  # one logger for the whole transport

_KEEPALIVE = 30  # seconds: the gateway notices a dead broker within about 1.5 of these
_PENDING_PUBLISHES_WARNING = 5000
_SUBSCRIBE_PATIENCE = 30.0  # seconds a node may refuse a subscription before the next is tried


@dataclass(frozen=True, slots=True)
class BrokerLogin:
    """Where the gateway's MQTT client connects, and how it logs in."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: Path | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context to connect with (``ca_file``, else the system's CAs); None: plain."""
        if not self.tls:
            return None
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)


class BrokerClient:
    """The client on the loop: connected, it hands each message to ``on_message``."""

    def __init__(
        self,
        login: BrokerLogin | Sequence[BrokerLogin],
        subscriptions: Sequence[tuple[str, int]],
        *,
        on_connected: Callable[[], None],
        on_disconnected: Callable[[], None],
        on_message: Callable[[str, object], None],
        retry: tuple[float, float],
    ) -> None:
        self._nodes = Failover([login] if isinstance(login, BrokerLogin) else login, retry)
        self.client_id = f"esp-mcp-gateway-{secrets.token_hex(4)}"
        self.connected = asyncio.Event()
        self._subscriptions = subscriptions
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._on_message = on_message
        self._client: aiomqtt.Client | None = None

    @property
    def login(self) -> BrokerLogin:
        """The broker node connected to, or tried next."""
        return self._nodes.current

    async def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        """Publish ``payload`` on ``topic`` (QoS 1 unless told).

        Raises:
            LinkClosed: the gateway is not connected to the broker, or the publish failed.
        """
        client = self._client
        if client is None:
            raise LinkClosed("not connected to the MQTT broker")
        try:
            await publish_honouring_cancellation(client, topic, payload, qos=qos)
        except aiomqtt.MqttError as exc:
            raise LinkClosed(f"MQTT publish failed: {exc}") from None

    def _client_for(self) -> aiomqtt.Client:
        login = self.login
        client = FleetClient(
            login.host,
            login.port,
            username=login.username,
            password=login.password,
            identifier=self.client_id,
            keepalive=_KEEPALIVE,
            timeout=10,
            clean_session=True,
            tls_context=login.ssl_context(),
        )
        # aiomqtt warns past 10 publishes awaiting their PUBACK; a storm of devices being
        # discovered has a few per device in flight, so warn only when the broker really lags.
        client.pending_calls_threshold = _PENDING_PUBLISHES_WARNING
        return mend_socket_registration(client)

    async def run(self) -> None:
        """Stay connected (forever): subscribe, hand messages on, reconnect (the next node
        first, then with backoff)."""
        failure = ""
        while True:
            client = self._client_for()
            where = self._nodes.where
            try:
                async with client:
                    honour_cancellation()
                    await subscribe_all(client, self._subscriptions, _SUBSCRIBE_PATIENCE)
                    honour_cancellation()
                    logger.info("connected to the MQTT broker at %s", where)
                    failure = ""
                    self._nodes.ready()
                    self._client = client
                    self.connected.set()
                    self._on_connected()
                    async for message in client.messages:
                        self._on_message(message.topic.value, message.payload)
            except aiomqtt.MqttError as exc:
                if str(exc) != failure:  # say it once, not at every retry
                    failure = str(exc)
                    logger.warning("MQTT broker at %s: %s; retrying", where, failure or "lost")
            finally:
                self._client = None
                self.connected.clear()
                self._on_disconnected()
                consume_disconnect(client)
            honour_cancellation()
            await asyncio.sleep(self._nodes.failed())
