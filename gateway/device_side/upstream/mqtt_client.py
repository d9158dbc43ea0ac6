"""One proxied device's MQTT connection to its voice server, with the upstream's credentials.

The gateway logs in as the device would have (client id, user name and password from the
upstream's OTA reply; TLS exactly on port 8883, against the public CAs as on the device),
subscribes to the upstream's ``subscribe_topic`` when it names one (xiaozhi.me says ``"null"``
and pushes unasked; a plain broker such as xiaozhi-esp32-server's needs the subscription),
publishes what the device says to ``publish_topic`` and hands every message of the upstream to
``deliver``. aiomqtt on the event loop, like the gateway's own client (no thread).

What the device says while the connection is being opened waits for it and then goes out in
order: stock firmware reconnects and publishes its ``hello`` in the same instant, and that
hello must get the server's back. The wait is bounded: ``MAX_QUEUED`` messages,
``MAX_QUEUED_BYTES`` bytes, and ``HOLD_SECONDS`` (the device's own wait for its server's hello;
an older message is dropped, not sent late). Each device has its own client, queue and tasks,
so a slow or dead upstream holds up only its own device's voice traffic: beyond those bounds
what the device says is dropped (the device then sees what it sees when its own server is
down). The client reconnects with backoff and says once per outage why.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiomqtt

from gateway.compat.aiomqtt import consume_disconnect, mend_socket_registration
from gateway.device_side.broker.aiomqtt_fixes import honour_cancellation, subscribe_all
from gateway.device_side.upstream.mqtt_settings import UpstreamMqtt
from gateway.device_side.upstream.settings import UpstreamSettingsError
from gateway.net.destinations import Destination, DestinationRefused

__all__ = ["UpstreamMqttClient"]

logger = logging.getLogger(__name__)

MAX_QUEUED = 64  # device messages waiting for the upstream; a conversation's worth of JSON
MAX_QUEUED_BYTES = 256 * 1024  # and at most this much of them
HOLD_SECONDS = 10.0  # the device waits 10 s for its server's hello; older messages are stale
_CONNECT_TIMEOUT = 10.0  # seconds: the device itself allows its server 10 s
_SUBSCRIBE_PATIENCE = 10.0  # seconds a refused subscription is asked again before reconnecting


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
        resolve: Callable[[], Awaitable[Destination]] | None = None,
    ) -> None:
        """Prepare the client; nothing connects before ``run()``.

        Args:
            device_id: the device it speaks for (log lines).
            settings: the upstream's broker, login and topics.
            deliver: called with each message the upstream sends the device.
            retry: the first and the longest wait between connection attempts, in seconds.
            ca_file: extra CAs to trust for TLS (tests); the public ones otherwise.
            on_state: told how the connection stands (``connected``, ``unreachable: why``).
            resolve: where to connect, checked after resolution, asked before every attempt
                (``destination_of``; it raises ``UpstreamSettingsError`` or
                ``DestinationRefused``); None connects to the settings' host as it is (tests).
        """
        self.device_id = device_id
        self.settings = settings
        self.connected = asyncio.Event()
        self.dropped = 0  # device messages that never reached the upstream
        self._deliver = deliver
        self._retry = retry
        self._ca_file = ca_file
        self._on_state = on_state
        self._resolve = resolve
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_QUEUED)
        self._queued_bytes = 0
        self._warned = False

    def send(self, payload: bytes) -> bool:
        """Queue ``payload`` for the upstream's publish topic; False if it had to be dropped.

        While the connection is being opened it waits (see the module docstring).
        """
        if self._queue.full() or self._queued_bytes + len(payload) > MAX_QUEUED_BYTES:
            self._drop("is behind" if self.connected.is_set() else "is not connected")
            return False
        self._queue.put_nowait((time.monotonic(), payload))
        self._queued_bytes += len(payload)
        return True

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if not self._warned:  # once until the next message goes through
            self._warned = True
            logger.warning("device %s: its upstream %s %s; its messages are dropped",
                           self.device_id, self.settings.where, why)  # fmt: skip

    async def flush(self, within: float) -> bool:
        """Wait until what was queued so far has gone to the broker's connection, at most
        ``within`` seconds; False when it had not by then (not connected, stalled)."""
        try:
            async with asyncio.timeout(within):
                await self._queue.join()
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        """Connect, relay both ways, reconnect with backoff; return only by cancellation."""
        delay, longest = self._retry
        failure = ""
        while True:
            client: aiomqtt.Client | None = None
            try:
                client = self._client(await self._destination())
                async with client:
                    honour_cancellation()
                    topic = self.settings.subscribe_topic
                    if topic is not None:  # refused for that long: reconnect, not deaf
                        await subscribe_all(client, [(topic, 0)], _SUBSCRIBE_PATIENCE)
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
                if client is not None:
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
            queued, payload = await self._queue.get()
            try:
                self._queued_bytes -= len(payload)
                if time.monotonic() - queued > HOLD_SECONDS:
                    self._drop("was away")  # the device has given up on it: not sent late
                    continue
                # QoS 0 as stock firmware publishes; aiomqtt returns once paho wrote it out, so
                # a stalled upstream holds this here (its queue fills and drops) for as long as
                # it stalls, until the keepalive gives the connection up (no memory grows).
                await client.publish(topic, payload, qos=0, timeout=math.inf)
                self._warned = False
            finally:
                self._queue.task_done()  # sent, dropped or lost with the connection: flush()

    async def _destination(self) -> Destination | None:
        """Where to connect now, as checked; a refusal is a failed attempt (retried: DNS and
        the settings may change)."""
        if self._resolve is None:
            return None
        try:
            return await self._resolve()
        except (UpstreamSettingsError, DestinationRefused) as exc:
            raise aiomqtt.MqttError(str(exc)) from None

    def _client(self, destination: Destination | None) -> aiomqtt.Client:
        settings = self.settings
        context = None
        if settings.tls:
            cafile = str(self._ca_file) if self._ca_file else None
            context = _NamedContext(settings.host, cafile)
        client = aiomqtt.Client(
            destination.address if destination is not None else settings.host,
            settings.port,
            username=settings.username,
            password=settings.password,
            identifier=settings.client_id,
            keepalive=settings.keepalive,
            timeout=_CONNECT_TIMEOUT,
            clean_session=True,
            tls_context=context,
        )
        return mend_socket_registration(client)


class _NamedContext(ssl.SSLContext):
    """The public CAs' context, naming the broker's host whatever address paho connects to.

    paho names its TLS peer by the host it was given: here the checked address, so the
    broker's name (SNI, the certificate check) is put back in.
    """

    def __new__(cls, host: str, cafile: str | None) -> _NamedContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_CLIENT)

    def __init__(self, host: str, cafile: str | None) -> None:
        self._host = host
        if cafile is None:  # as ssl.create_default_context(cafile=...)
            self.load_default_certs()
        else:
            self.load_verify_locations(cafile)

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        kwargs["server_hostname"] = self._host
        return super().wrap_socket(sock, *args, **kwargs)
