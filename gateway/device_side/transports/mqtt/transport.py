"""``MqttTransport``: routes each message by topic and decides when a device has a link.

When is a device present (docs/mqtt.md)?

- With the embedded broker: from when it connects to when it leaves (the broker's own events,
  told to the gateway's in-process client, ``LocalClient``); nothing else counts, since the
  broker knows.
- On an external broker: its retained ``status`` says ``online`` (our firmware, whose last will
  says ``offline``), or it published on its ``up`` topic; devices with no last will are probed
  (``liveness``).

A fresh sign of life (broker connect, ``online``) starts a fresh link, so the device's tools are
listed again after a reboot. When the gateway itself ends a session (discovery gave up), the
device is left alone for a while: a stray message does not reopen it at once, so a device that
cannot finish discovery costs one attempt per backoff period, never a close-and-reopen loop; a
device still present is tried again when the period ends.

Losing the broker closes every link at once (pending calls fail now, not at their timeout); the
client reconnects with backoff and finds its devices again.

cluster: ``owns`` says whether this replica runs a device's session (discovery, hello reply,
keepalive, probes); ``reown()`` applies it again when the live replicas change. The messages of a
device another replica owns go to ``foreign`` (the replies to this replica's direct calls).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from types import TracebackType

from gateway.device_side.broker import EmbeddedBroker, Presence, Topics
from gateway.device_side.broker.aiomqtt_fixes import cancel_all
from gateway.device_side.transports.mqtt.client import BrokerClient, BrokerLogin
from gateway.device_side.transports.mqtt.link import MqttLink
from gateway.device_side.transports.mqtt.liveness import Liveness, Peer
from gateway.device_side.transports.mqtt.local import LocalClient
from gateway.device_side.transports.mqtt.stalls import DirectCalls, Stalls
from gateway.devices.link import DeviceIdentity

__all__ = ["MqttTransport"]

logger = logging.getLogger(__package__)  # one logger for the whole transport

# cluster: seconds a session owned elsewhere now is kept for its new owner to announce it (an
# owner takes a device in milliseconds; a replica cut from the broker never hears it)
_HANDOVER = 10.0


class MqttTransport:
    """The gateway's MQTT client and the devices behind it; ``async with`` runs it."""

    def __init__(
        self,
        login: BrokerLogin | Sequence[BrokerLogin] | EmbeddedBroker,
        topics: Topics,
        *,
        probe_interval: float | None = None,
        keepalive_interval: float | None = None,
        known: Callable[[], Iterable[str]] = tuple,
        retry: tuple[float, float] = (0.5, 5.0),
        quiet: tuple[float, float] = (5.0, 300.0),
        owns: Callable[[str], bool] | None = None,
        foreign: Callable[[str, str], None] | None = None,
        direct: DirectCalls | None = None,
    ) -> None:
        """Prepare the transport; nothing connects before ``async with``.

        Args:
            login: the broker to connect to (a cluster's nodes: tried in turn), or the embedded
                broker itself: the client is then in-process, and so is presence.
            topics: the device topics.
            probe_interval: seconds between presence probes; None disables probing.
            keepalive_interval: seconds of silence on a device's link (both ways) after which
                it gets a ``ping``; None sends none.
            known: the ids of devices to probe (those the registry knows over MQTT).
            retry: the first and the longest wait between connection attempts, in seconds.
            quiet: the first and the longest time a device whose session the gateway ended is
                left alone, in seconds.
            owns: cluster: does this replica run the device's session? None: every device.
            foreign: cluster: takes each message of a device another replica owns.
            direct: cluster: the calls made directly to devices another replica owns (failed
                with those of this replica's sessions when their device went with its node).
        """
        self.topics = topics
        # QoS 0 both: the session is clean (what is in flight is lost with the connection at
        # any QoS, and presence probes heal it), while on NATS a QoS 1 subscription is a
        # JetStream consumer that takes seconds to make for minutes after a node dies.
        subscriptions = [(topics.every("up"), 0), (topics.every("status"), 0)]
        self._client: BrokerClient | LocalClient
        if isinstance(login, EmbeddedBroker):
            self._client = LocalClient(
                login,
                subscriptions,
                on_connected=self._connected,
                on_disconnected=self._disconnected,
                on_message=self._dispatch,
                on_presence=self._on_presence,
            )
        else:
            self._client = BrokerClient(
                login,
                subscriptions,
                on_connected=self._connected,
                on_disconnected=self._disconnected,
                on_message=self._dispatch,
                retry=retry,
            )
        # The embedded broker says who is there (in-process): status messages do not.
        self._broker_presence = isinstance(login, EmbeddedBroker)
        self.client_id = self._client.client_id
        self.connected = self._client.connected
        self._probe_interval = probe_interval
        self._keepalive_interval = keepalive_interval
        self._quiet = quiet
        self._owns = owns
        self._foreign = foreign
        self._peers: dict[str, Peer] = {}
        self._liveness = Liveness(
            self._peers, self.connected, self.publish, self._forget, known, self.owns
        )
        self._new_links: asyncio.Queue[MqttLink] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        nodes = [] if isinstance(login, BrokerLogin | EmbeddedBroker) else list(login)
        # A broker cluster's node may die with devices on it: their calls end within seconds.
        self._stalls = (
            Stalls(nodes, self._peers, self._liveness.ping, direct) if len(nodes) > 1 else None
        )

    async def __aenter__(self) -> MqttTransport:
        self._start(self._client.run(), "client")
        if self._probe_interval is not None:
            self._start(self._liveness.probe_loop(self._probe_interval), "probe")
        if self._keepalive_interval is not None:
            self._start(self._liveness.keepalive_loop(self._keepalive_interval), "keepalive")
        if self._stalls is not None:
            self._start(self._stalls.run(), "stalls")
        return self

    def _start(self, work: Coroutine[None, None, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(work, name=f"gateway.mqtt.{name}"))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await cancel_all(self._tasks)
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

    async def publish(self, device_id: str, text: str, qos: int = 1) -> None:
        """Publish ``text`` to the down topic of ``device_id`` (QoS 1 unless told).

        Raises:
            LinkClosed: the gateway is not connected to the broker, or the publish failed.
        """
        if self.connected.is_set() and (peer := self._peers.get(device_id)) is not None:
            peer.sent = asyncio.get_running_loop().time()
            # A call awaits an answer (hello replies, notifications do not): stalls.py watches it.
            if peer.asked <= peer.heard and '"tools/call"' in text:
                peer.asked = peer.sent
        await self._client.publish(self.topics.down(device_id), text.encode(), qos)

    def owns(self, device_id: str) -> bool:
        """Does this gateway run the device's session (always, outside a cluster)?"""
        return self._owns is None or self._owns(device_id)

    def reown(self) -> None:
        """cluster: the live replicas changed: close the sessions of devices owned elsewhere
        now, open those of the devices this replica owns now (no device action needed)."""
        loop = asyncio.get_running_loop()
        for device_id, peer in list(self._peers.items()):
            live = peer.link is not None and not peer.link.closed
            if live and not self.owns(device_id):
                # Kept until the new owner announces it (the cluster then hands the device over
                # and this session ends) or _HANDOVER passes: hosts see no offline blink.
                if not peer.leaving:
                    peer.leaving = True
                    loop.call_later(_HANDOVER, self._handed_over, peer.link)
            elif not live and self.owns(device_id) and peer.heard >= peer.quiet_until:
                self._open(device_id, fresh=True)
            else:
                peer.leaving = False
        self._liveness.soon()  # devices it owns now and has not heard from: found

    def _handed_over(self, link: MqttLink | None) -> None:
        peer = self._peers.get(link.device_id) if link is not None else None
        if link is not None and peer is not None and peer.link is link and peer.leaving:
            link.close()

    # --- the connection --------------------------------------------------------------------

    def _connected(self) -> None:
        for device_id, peer in list(self._peers.items()):
            if peer.on_broker:
                self._open(device_id, fresh=True)
        self._liveness.soon()  # and again: devices come back to a restarted broker in turn

    def checked_in(self, device_id: str) -> None:
        """The device checked in through OTA (it is booting): look for it on the broker soon."""
        if self._probe_interval is not None:
            self._liveness.follow(device_id)

    def _disconnected(self) -> None:
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
        peer = self._peers.setdefault(device_id, Peer())
        peer.heard = asyncio.get_running_loop().time()
        if self._foreign is not None and text is not None:
            self._foreign(device_id, text)  # cluster: a reply to a direct call from here?
        if not self.owns(device_id) and not peer.leaving:
            return
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
        if self._broker_presence:
            return  # the embedded broker's own events are the truth
        state = (text or "").strip().lower()
        if state == "online":
            self._fresh_sign_of_life(device_id).status_online = True
            self._open(device_id, fresh=True)
        elif state in ("offline", ""):  # "" clears a retained status
            self._forget(device_id)
        else:
            logger.debug("device %s: unknown status %r", device_id, state[:40])

    def _on_presence(self, presence: Presence) -> None:
        if presence.online:
            self._fresh_sign_of_life(presence.device_id).on_broker = True
            self._open(presence.device_id, fresh=True)
        else:
            self._forget(presence.device_id)

    # --- sessions --------------------------------------------------------------------------

    def _open(self, device_id: str, *, fresh: bool) -> MqttLink | None:
        """Give the device a link; a ``fresh`` sign of life replaces a live one."""
        peer = self._peers.setdefault(device_id, Peer())
        if not self.connected.is_set() or not self.owns(device_id):
            return None  # links open when the gateway is connected; owned elsewhere: none
        if peer.link is not None and not peer.link.closed and not fresh:
            return peer.link
        # A live old link is closed by the registry when the new session takes the device over,
        # so the device does not blink offline in between.
        peer.link, peer.leaving = MqttLink(self, device_id), False
        peer.heard = peer.sent = asyncio.get_running_loop().time()
        self._new_links.put_nowait(peer.link)
        return peer.link

    def _fresh_sign_of_life(self, device_id: str) -> Peer:
        """The device (re)appeared: whatever sessions ended before, it starts afresh."""
        peer = self._peers.setdefault(device_id, Peer())
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


def _text(payload: object) -> str | None:
    if isinstance(payload, bytes | bytearray):
        try:
            return bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return payload if isinstance(payload, str) else None
