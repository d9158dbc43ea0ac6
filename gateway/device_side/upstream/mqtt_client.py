"""One proxied device's MQTT connection to its voice server, with the upstream's credentials.

The gateway logs in as the device would have (client id, user name and password from the
upstream's OTA reply; TLS exactly on port 8883, against the public CAs as on the device),
subscribes to the upstream's ``subscribe_topic`` when it names one (xiaozhi.me says ``"null"``
and pushes unasked; a plain broker such as xiaozhi-esp32-server's needs the subscription),
publishes what the device says to ``publish_topic`` and hands every message of the upstream to
``deliver``. aiomqtt on the event loop, like the gateway's own client (no thread).

Each device has its own client, queue and tasks, so a slow or dead upstream holds up only its
own device's voice traffic: what the device says while the upstream is away or behind is
dropped beyond a small bound (the device then sees what it sees when its own server is down),
never buffered without end. The client reconnects with backoff and says once per outage why.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
from collections.abc import Callable
from pathlib import Path

import aiomqtt

from gateway.device_side.broker.aiomqtt_fixes import consume_disconnect, honour_cancellation
from gateway.device_side.upstream.mqtt_settings import UpstreamMqtt

__all__ = ["UpstreamMqttClient"]

logger = logging.getLogger(__name__)

MAX_QUEUED = 64  # device messages waiting for the upstream; a conversation's worth of JSON
_CONNECT_TIMEOUT = 10.0  # seconds: the device itself allows its server 10 s


class UpstreamMqttClient:
    """The upstream connection of one device; ``run()`` keeps it up until cancelled."""

    def __init__(
        self,
        device_id: str,
        settings: UpstreamMqtt,
        deliver: Callable[[bytes], None],
        *,
        retry: tuple[float, float] = (1.0, 60.0),
        ca_file: Path | None = None,
        on_state: Callable[[str], None] = lambda state: None,
    ) -> None:
        """Prepare the client; nothing connects before ``run()``.

        Args:
            device_id: the device it speaks for (log lines).
            settings: the upstream's broker, login and topics.
            deliver: called with each message the upstream sends the device.
            retry: the first and the longest wait between connection attempts, in seconds.
            ca_file: extra CAs to trust for TLS (tests); the public ones otherwise.
            on_state: told how the connection stands (``connected``, ``unreachable: why``).
        """
        self.device_id = device_id
        self.settings = settings
        self.connected = asyncio.Event()
        self.dropped = 0  # device messages that never reached the upstream
        self._deliver = deliver
        self._retry = retry
        self._ca_file = ca_file
        self._on_state = on_state
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(MAX_QUEUED)
        self._warned = False

    def send(self, payload: bytes) -> bool:
        """Queue ``payload`` for the upstream's publish topic; False if it had to be dropped."""
        if not self.connected.is_set() or self._queue.full():
            self.dropped += 1
            if not self._warned:  # once until the next message goes through
                self._warned = True
                why = "is behind" if self.connected.is_set() else "is not connected"
                logger.warning("device %s: its upstream %s %s; its messages are dropped",
                               self.device_id, self.settings.where, why)  # fmt: skip
            return False
        self._queue.put_nowait(payload)
        return True

    async def run(self) -> None:
        """Connect, relay both ways, reconnect with backoff; return only by cancellation."""
        delay, longest = self._retry
        failure = ""
        while True:
            client = self._client()
            try:
                async with client:
                    honour_cancellation()
                    topic = self.settings.subscribe_topic
                    if topic is not None:
                        await client.subscribe(topic, qos=0)
                    honour_cancellation()
                    logger.info("device %s: connected to its upstream %s", self.device_id,
                                self.settings.where)  # fmt: skip
                    failure, delay = "", self._retry[0]
                    self._on_state("connected")
                    await self._relay(client)
            except aiomqtt.MqttError as exc:
                if str(exc) != failure:  # once per kind of failure, not at every retry
                    failure = str(exc)
                    self._on_state(f"unreachable: {failure or 'connection lost'}")
                    logger.warning("device %s: upstream %s: %s; retrying", self.device_id,
                                   self.settings.where, failure or "connection lost")  # fmt: skip
            except Exception:  # a bug of ours must cost this connection, never the relay
                logger.exception("device %s: upstream %s: relaying failed; reconnecting",
                                 self.device_id, self.settings.where)  # fmt: skip
            finally:
                self.connected.clear()
                _drain(self._queue)  # stale: the device has long given up on these
                consume_disconnect(client)
            honour_cancellation()
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    async def _relay(self, client: aiomqtt.Client) -> None:
        """Both directions until either fails; its error (an ``MqttError``) ends the connection."""
        self.connected.set()
        name = f"gateway.upstream[{self.device_id}]"
        both = {asyncio.create_task(self._publish(client), name=f"{name}.out"),
                asyncio.create_task(self._read(client), name=f"{name}.in")}  # fmt: skip
        try:
            done, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in both:
                task.cancel()
            await asyncio.gather(*both, return_exceptions=True)
        for task in done:
            task.result()  # raises what ended it
        raise aiomqtt.MqttError("")  # the broker ended the message stream: lost, reconnect

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = message.payload
            if isinstance(payload, bytes | bytearray):
                self._deliver(bytes(payload))

    async def _publish(self, client: aiomqtt.Client) -> None:
        topic = self.settings.publish_topic
        while True:
            payload = await self._queue.get()
            # QoS 0 as stock firmware publishes; aiomqtt returns once paho wrote it out, so a
            # stalled upstream holds this here (its queue fills and drops) for as long as it
            # stalls, until the keepalive gives the connection up (no memory grows meanwhile).
            await client.publish(topic, payload, qos=0, timeout=math.inf)
            self._warned = False

    def _client(self) -> aiomqtt.Client:
        settings = self.settings
        context = None
        if settings.tls:
            cafile = str(self._ca_file) if self._ca_file else None
            context = ssl.create_default_context(cafile=cafile)
        return aiomqtt.Client(
            settings.host,
            settings.port,
            username=settings.username,
            password=settings.password,
            identifier=settings.client_id,
            keepalive=settings.keepalive,
            timeout=_CONNECT_TIMEOUT,
            clean_session=True,
            tls_context=context,
        )


def _drain(queue: asyncio.Queue[bytes]) -> None:
    while not queue.empty():
        queue.get_nowait()
