"""The MQTT transport: each device present on the broker becomes a ``DeviceLink``.

One client (aiomqtt, on the event loop) subscribes to ``<prefix>/+/up`` and
``<prefix>/+/status`` and publishes to ``<prefix>/<device-id>/down`` (``broker.topics``).
``links()`` yields a new link each time a device appears; the gateway runs a ``DeviceConnection``
over it, exactly as for a WebSocket.

When is a device present (docs/mqtt.md)?

- With the embedded broker: from when it connects to when it leaves (``presence``); nothing
  else counts, since the broker knows.
- On an external broker: its retained ``status`` says ``online`` (our firmware, whose last will
  says ``offline``), or it published on its ``up`` topic. Stock firmware sets no last will, so
  the devices known from OTA are probed every ``probe_interval`` (a ``ping`` any device
  answers, ``gateway.protocol.make_probe``); one silent for 2.5 intervals is offline.

A fresh sign of life (broker connect, ``online``) starts a fresh link, so the device's tools are
listed again after a reboot. When the gateway itself ends a session (discovery gave up), the
device is left alone for a while: a stray message does not reopen it at once, so a device that
cannot finish discovery costs one attempt per backoff period, never a close-and-reopen loop; a
device still present is tried again when the period ends.

Keepalive: some devices count only messages on their own link as a sign that the gateway is
still there, not the broker's MQTT PINGREQ/PINGRESP (py-xiaozhi closes its MQTT link after 120 s
without a message and never comes back). So a device whose link has been silent both ways for
``keepalive_interval`` seconds gets the presence probe, a ``ping`` (docs/protocol.md §2): busy
devices get nothing extra.

Losing the broker closes every link at once (pending calls fail now, not at their timeout); the
client reconnects with backoff and finds its devices again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import aiomqtt

from gateway.device_side.broker import PresenceFeed, Topics
from gateway.devices.link import DeviceIdentity, LinkClosed
from gateway.protocol import encode, make_probe, mcp_envelope

__all__ = ["BrokerLogin", "MqttLink", "MqttTransport", "honour_cancellation"]

logger = logging.getLogger(__name__)

_KEEPALIVE = 30  # seconds: the gateway notices a dead broker within about 1.5 of these
_MAX_QUEUED = 256  # messages a device may have waiting; more are dropped (a flood, not a device)
_SILENT_PROBES = 2.5  # probe intervals without a word before a probed device counts as gone
_PROBE_SESSION = "probe"
_PENDING_PUBLISHES_WARNING = 5000


@dataclass(frozen=True, slots=True)
class BrokerLogin:
    """Where the gateway's MQTT client connects, and how it logs in."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: Path | None = None


class MqttLink:
    """A ``DeviceLink`` over the device's ``up`` and ``down`` topics."""

    def __init__(self, transport: MqttTransport, device_id: str) -> None:
        self.device_id = device_id
        self.identity = DeviceIdentity(device_id=device_id, client_id=None, transport="mqtt")
        self.closed = False
        self._transport = transport
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()

    def feed(self, text: str) -> None:
        """Queue a message the device published."""
        if self.closed:
            return
        if self._queue.qsize() >= _MAX_QUEUED:
            logger.warning("device %s floods its up topic; message dropped", self.device_id)
            return
        self._queue.put_nowait(text)

    async def send(self, text: str) -> None:
        """Publish one message to the device's down topic."""
        if self.closed:
            raise LinkClosed(f"device {self.device_id} left")
        await self._transport.publish(self.device_id, text)

    async def __aiter__(self) -> AsyncIterator[str]:
        """Yield the device's messages until the link closes."""
        while (text := await self._queue.get()) is not None:
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
            self._queue.put_nowait(None)


@dataclass(slots=True)
class _Peer:
    """What the transport knows of one device."""

    link: MqttLink | None = None
    on_broker: bool = False  # the embedded broker says it is connected
    status_online: bool = False  # its retained status says online (it has a last will)
    heard: float = 0.0  # loop time of its last message
    sent: float = 0.0  # loop time of the gateway's last publish to it
    quiet_until: float = 0.0  # loop time before which stray messages open no link
    ended: int = 0  # sessions the gateway ended in a row (the backoff grows with it)


class MqttTransport:
    """The gateway's MQTT client and the devices behind it; ``async with`` runs it."""

    def __init__(
        self,
        login: BrokerLogin,
        topics: Topics,
        *,
        presence: PresenceFeed | None = None,
        probe_interval: float | None = None,
        keepalive_interval: float | None = None,
        known: Callable[[], Iterable[str]] = tuple,
        retry: tuple[float, float] = (0.5, 5.0),
        quiet: tuple[float, float] = (5.0, 300.0),
    ) -> None:
        """Prepare the transport; nothing connects before ``async with``.

        Args:
            login: the broker to connect to.
            topics: the device topics.
            presence: the embedded broker's connect/leave events; None for an external broker.
            probe_interval: seconds between presence probes; None disables probing.
            keepalive_interval: seconds of silence on a device's link (both ways) after which
                it gets a ``ping``; None sends none.
            known: the ids of devices to probe (those the registry knows over MQTT).
            retry: the first and the longest wait between connection attempts, in seconds.
            quiet: the first and the longest time a device whose session the gateway ended is
                left alone, in seconds.
        """
        self.login = login
        self.topics = topics
        self.client_id = f"esp-mcp-gateway-{secrets.token_hex(4)}"
        self.connected = asyncio.Event()
        self._presence = presence
        self._probe_interval = probe_interval
        self._keepalive_interval = keepalive_interval
        self._known = known
        self._retry = retry
        self._quiet = quiet
        self._client: aiomqtt.Client | None = None
        self._peers: dict[str, _Peer] = {}
        self._new_links: asyncio.Queue[MqttLink] = asyncio.Queue()
        self._probe_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> MqttTransport:
        self._tasks.append(asyncio.create_task(self._run_client(), name="gateway.mqtt.client"))
        if self._presence is not None:
            task = asyncio.create_task(self._follow_presence(), name="gateway.mqtt.presence")
            self._tasks.append(task)
        if self._probe_interval is not None:
            self._tasks.append(asyncio.create_task(self._probe_loop(), name="gateway.mqtt.probe"))
        if self._keepalive_interval is not None:
            task = asyncio.create_task(self._keepalive_loop(), name="gateway.mqtt.keepalive")
            self._tasks.append(task)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pending = set(self._tasks)
        while pending:  # cancel again if aiomqtt swallowed it (see honour_cancellation)
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        if self._presence is not None:
            self._presence.close()
        for peer in self._peers.values():
            if peer.link is not None:
                peer.link.close()

    async def links(self) -> AsyncIterator[tuple[MqttLink, DeviceIdentity]]:
        """Yield a link for each device session, as devices appear (forever)."""
        while True:
            link = await self._new_links.get()
            yield link, link.identity

    def present(self) -> frozenset[str]:
        """The devices that have a live link now."""
        return frozenset(d for d, p in self._peers.items() if p.link and not p.link.closed)

    async def publish(self, device_id: str, text: str) -> None:
        """Publish ``text`` to the down topic of ``device_id``.

        Raises:
            LinkClosed: the gateway is not connected to the broker, or the publish failed.
        """
        client = self._client
        if client is None:
            raise LinkClosed("not connected to the MQTT broker")
        if (peer := self._peers.get(device_id)) is not None:
            peer.sent = asyncio.get_running_loop().time()
        try:
            await client.publish(self.topics.down(device_id), text.encode(), qos=1)
        except aiomqtt.MqttError as exc:
            raise LinkClosed(f"MQTT publish failed: {exc}") from None

    # --- the connection --------------------------------------------------------------------

    def _client_for(self) -> aiomqtt.Client:
        login = self.login
        context = None
        if login.tls:
            cafile = str(login.ca_file) if login.ca_file else None
            context = ssl.create_default_context(cafile=cafile)
        client = aiomqtt.Client(
            login.host,
            login.port,
            username=login.username,
            password=login.password,
            identifier=self.client_id,
            keepalive=_KEEPALIVE,
            timeout=10,
            clean_session=True,
            tls_context=context,
        )
        # aiomqtt warns past 10 publishes awaiting their PUBACK; a storm of devices being
        # discovered has a few per device in flight, so warn only when the broker really lags.
        client.pending_calls_threshold = _PENDING_PUBLISHES_WARNING
        return client

    async def _run_client(self) -> None:
        delay, longest = self._retry
        where = f"{self.login.host}:{self.login.port}"
        failure = ""
        while True:
            client = self._client_for()
            try:
                async with client:
                    honour_cancellation()
                    await client.subscribe(self.topics.every("up"), qos=0)
                    await client.subscribe(self.topics.every("status"), qos=1)
                    honour_cancellation()
                    logger.info("connected to the MQTT broker at %s", where)
                    failure, delay = "", self._retry[0]
                    self._connected(client)
                    async for message in client.messages:
                        self._dispatch(message.topic.value, message.payload)
            except aiomqtt.MqttError as exc:
                if str(exc) != failure:  # say it once, not at every retry
                    failure = str(exc)
                    logger.warning("MQTT broker at %s: %s; retrying", where, failure or "lost")
            finally:
                self._disconnected()
                _consume_disconnect(client)
            honour_cancellation()
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    def _connected(self, client: aiomqtt.Client) -> None:
        self._client = client
        self.connected.set()
        for device_id, peer in list(self._peers.items()):
            if peer.on_broker:
                self._open(device_id, fresh=True)
        self._probe_now.set()

    def _disconnected(self) -> None:
        self._client = None
        self.connected.clear()
        for device_id, peer in list(self._peers.items()):
            if peer.link is not None:
                peer.link.close()
                peer.link = None
            if not peer.on_broker:  # status and messages are learnt again after reconnecting
                del self._peers[device_id]

    # --- what devices say ------------------------------------------------------------------

    def _dispatch(self, topic: str, payload: object) -> None:
        parsed = self.topics.parse(topic)
        if parsed is None:
            logger.debug("ignored MQTT message on %s", topic)
            return
        device_id, kind = parsed
        text = _text(payload)
        if kind == "status":
            self._on_status(device_id, text)
        elif kind == "up":
            self._on_up(device_id, text)

    def _on_up(self, device_id: str, text: str | None) -> None:
        peer = self._peers.setdefault(device_id, _Peer())
        peer.heard = asyncio.get_running_loop().time()
        link = peer.link if peer.link is not None and not peer.link.closed else None
        if link is None and peer.heard < peer.quiet_until:
            logger.debug("device %s is left alone for now; message dropped", device_id)
            return
        if link is None:  # the first message is a sign of life too
            link = self._open(device_id, fresh=False)
        if text is None:
            logger.info("device %s sent a payload that is not UTF-8; dropped", device_id)
        elif link is not None:
            link.feed(text)

    def _on_status(self, device_id: str, text: str | None) -> None:
        if self._presence is not None:
            return  # the embedded broker's own events are the truth
        state = (text or "").strip().lower()
        if state == "online":
            self._fresh_sign_of_life(device_id).status_online = True
            self._open(device_id, fresh=True)
        elif state in ("offline", ""):  # "" clears a retained status
            self._forget(device_id)
        else:
            logger.debug("device %s: unknown status %r", device_id, state[:40])

    async def _follow_presence(self) -> None:
        assert self._presence is not None
        async for presence in self._presence:
            if presence.online:
                self._fresh_sign_of_life(presence.device_id).on_broker = True
                self._open(presence.device_id, fresh=True)
            else:
                self._forget(presence.device_id)

    def _open(self, device_id: str, *, fresh: bool) -> MqttLink | None:
        """Give the device a link; a ``fresh`` sign of life replaces a live one."""
        peer = self._peers.setdefault(device_id, _Peer())
        if self._client is None:
            return None  # links open when the gateway is connected
        if peer.link is not None and not peer.link.closed and not fresh:
            return peer.link
        # A live old link is closed by the registry when the new session takes the device over,
        # so the device does not blink offline in between.
        peer.link = MqttLink(self, device_id)
        peer.heard = peer.sent = asyncio.get_running_loop().time()
        self._new_links.put_nowait(peer.link)
        return peer.link

    def _fresh_sign_of_life(self, device_id: str) -> _Peer:
        """The device (re)appeared: whatever sessions ended before, it starts afresh."""
        peer = self._peers.setdefault(device_id, _Peer())
        peer.quiet_until, peer.ended = 0.0, 0
        return peer

    def session_ended(self, link: MqttLink) -> None:
        """The gateway ended ``link``'s session: leave the device alone, then try again."""
        peer = self._peers.get(link.device_id)
        if peer is None or peer.link is not link:
            return  # a link already replaced by a fresh one: nothing to back off from
        first, longest = self._quiet
        delay = min(first * 2**peer.ended, longest)
        peer.ended += 1
        loop = asyncio.get_running_loop()
        peer.quiet_until = loop.time() + delay
        loop.call_later(delay, self._try_again, link)

    def _try_again(self, ended: MqttLink) -> None:
        peer = self._peers.get(ended.device_id)
        if peer is not None and peer.link is ended and (peer.on_broker or peer.status_online):
            self._open(ended.device_id, fresh=True)

    def _forget(self, device_id: str) -> None:
        peer = self._peers.pop(device_id, None)
        if peer is not None and peer.link is not None:
            peer.link.close()

    # --- probing ---------------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        assert self._probe_interval is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._probe_interval):
                    await self._probe_now.wait()
            self._probe_now.clear()
            if self._client is not None:
                await self._probe_round(self._probe_interval)

    async def _probe_round(self, interval: float) -> None:
        now = asyncio.get_running_loop().time()
        for device_id, peer in list(self._peers.items()):
            if peer.status_online or peer.on_broker:
                continue  # it has a last will, or the broker tells
            if now - peer.heard > _SILENT_PROBES * interval:
                logger.info("device %s did not answer probes; offline", device_id)
                self._forget(device_id)
        probe = encode(mcp_envelope(_PROBE_SESSION, make_probe()))
        for device_id in sorted(set(self._known()) | set(self._peers)):
            known = self._peers.get(device_id)
            if known is None or not (known.status_online or known.on_broker):
                with contextlib.suppress(LinkClosed):
                    await self.publish(device_id, probe)

    # --- keepalive -------------------------------------------------------------------------

    async def _keepalive_loop(self) -> None:
        assert self._keepalive_interval is not None
        interval = self._keepalive_interval
        # Checked four times an interval: a link is pinged after 1 to 1.25 intervals of silence,
        # at a cost of one pass over the devices per check, not one timer per device.
        while True:
            await asyncio.sleep(interval / 4)
            if self._client is not None:
                await self._keepalive_round(interval)

    async def _keepalive_round(self, interval: float) -> None:
        now = asyncio.get_running_loop().time()
        # The probe, not a message of its own: stock firmware answers a ``ping`` with an
        # error reply and does nothing else (no voice session, no state change), our firmware
        # answers it, and the session drops the answer as one to no request of its own.
        ping = encode(mcp_envelope(_PROBE_SESSION, make_probe()))
        for device_id, peer in list(self._peers.items()):
            if peer.link is None or peer.link.closed:
                continue
            if now - max(peer.heard, peer.sent) >= interval:
                with contextlib.suppress(LinkClosed):
                    await self.publish(device_id, ping)


def honour_cancellation() -> None:
    """Raise ``CancelledError`` if the current task was cancelled but carries on anyway.

    Python 3.11's ``asyncio.wait_for`` (which aiomqtt awaits on connect, subscribe and publish)
    swallows a cancellation that arrives just as its future completes (fixed in 3.12); the task
    still counts it, so a reconnect loop checks here, or it would never stop.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _consume_disconnect(client: aiomqtt.Client) -> None:
    # aiomqtt leaves the error of a connection lost outside message iteration (say, during a
    # subscribe) unretrieved in a private future; asyncio would log it when collected.
    future = getattr(client, "_disconnected", None)
    if isinstance(future, asyncio.Future) and future.done() and not future.cancelled():
        future.exception()


def _text(payload: object) -> str | None:
    if isinstance(payload, bytes | bytearray):
        try:
            return bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return payload if isinstance(payload, str) else None
