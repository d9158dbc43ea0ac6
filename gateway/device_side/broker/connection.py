"""One device's MQTT connection to the embedded broker: an ``asyncio.Protocol``, no task per packet.

Bytes go through ``MqttReader`` (gateway/protocol) and each packet is handled at once, in
``data_received``. A connection holds at most one timer: the CONNECT deadline until its login
is accepted, then its keep-alive check (§3.1.2.10: 1.5 keep-alive periods of silence close it),
which re-arms itself only when it fires, not on every packet. The one task it may ever have is
its login (the registry commits it, ``settle``; a device waits for the gateway to listen,
``until_heard``); the few packets that may come meanwhile are held (``BEFORE_CONNACK_BYTES`` in
all), and a client hanging up ends its login with it. What it writes goes to the transport's
buffer; a client that lets it pass ``write_limit`` (a slow or stalled reader) is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway.device_side.broker.routes import Routes
from gateway.device_side.broker.topics import Topics
from gateway.net.limits import Guard, Slot, ThrottledLog
from gateway.protocol.mqtt import (
    ACCEPTED,
    IDENTIFIER_REJECTED,
    NOT_AUTHORIZED,
    PINGRESP,
    REFUSED_FILTER,
    UNACCEPTABLE_PROTOCOL,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    PingReq,
    PubAck,
    Publish,
    Subscribe,
    Unsubscribe,
    Will,
    connack,
    puback,
    publish,
    suback,
    unsuback,
)
from gateway.protocol.mqtt_reader import MqttReader, check_filter

__all__ = ["BEFORE_CONNACK_BYTES", "BrokerCore", "ClientConnection"]

logger = logging.getLogger(__name__)
_log = ThrottledLog(logger)

_HELD_PACKETS = 16  # packets a client may send before its CONNACK (stock firmware: one, hello)
# Bytes a client may send before its CONNACK, all packets together: stock firmware sends a
# CONNECT of about 200 bytes and perhaps its hello (about 300). Past it, it is no device.
BEFORE_CONNACK_BYTES = 16 * 1024


class BrokerCore(Protocol):
    """What a connection needs of its broker (``EmbeddedBroker``)."""

    topics: Topics
    routes: Routes
    sessions: dict[str, ClientConnection]
    connections: set[ClientConnection]
    guard: Guard | None
    max_packet_bytes: int
    write_limit: int

    def admit(
        self, client_id: str | None, username: str | None, password: object, peer: str | None
    ) -> bool:
        """Whether this login (from address ``peer``) may connect."""
        ...

    async def settle(self) -> None:
        """Commit what an admitted login decided, before it is accepted."""
        ...

    async def until_heard(self) -> None:
        """Return once what a device publishes would reach the gateway (bounded)."""
        ...

    def allows(self, username: str | None, topic: str, *, publish: bool) -> bool:
        """Whether this login may publish to (or subscribe to, receive) ``topic``."""
        ...

    def route(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """Deliver a message to its subscribers (and keep it if ``retain``)."""
        ...

    def device_connected(self, device_id: str) -> None:
        """A device's session began."""
        ...

    def device_disconnected(self, device_id: str) -> None:
        """A device's session ended."""
        ...


class ClientConnection(asyncio.Protocol):
    """One client, from its TCP connection to its end (only devices log in)."""

    __slots__ = ("_broker", "_early", "_held", "_heard", "_login", "_next_id", "_reader",
                 "_slot", "_timer", "_transport", "accepted", "client_id", "closed", "filters",
                 "keepalive", "peer", "taken_over", "username", "will")  # fmt: skip

    def __init__(self, broker: BrokerCore) -> None:
        self._broker = broker
        self._reader = MqttReader(broker.max_packet_bytes)
        self._transport: asyncio.Transport | None = None
        self._slot: Slot | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._login: asyncio.Task[None] | None = None
        self._held: list[Packet] | None = None  # read while the login is decided
        self._early = BEFORE_CONNACK_BYTES  # what it may still send before its CONNACK
        self._heard = 0.0  # loop time of the last bytes from the client
        self._next_id = 0
        self.peer = "?"
        self.client_id = ""
        self.username: str | None = None
        self.keepalive = 0
        self.will: Will | None = None
        self.filters: set[str] = set()
        self.accepted = self.closed = self.taken_over = False

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Take a slot of the listener and start the CONNECT deadline."""
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._broker.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        transport.set_write_buffer_limits(high=self._broker.write_limit)
        guard = self._broker.guard
        if guard is not None:
            self._slot = guard.admit(transport, deadlines=False)
            if self._slot is None:
                self.closed = True  # over a cap: aborted
                return
            self._timer = asyncio.get_running_loop().call_later(
                guard.limits.handshake_timeout, self._connect_overdue
            )

    def data_received(self, data: bytes) -> None:
        """Handle each packet completed by ``data``."""
        if self.closed:
            return
        self._heard = asyncio.get_running_loop().time()
        if not self.accepted:
            self._early -= len(data)
            if self._early < 0:  # whatever the password: a CONNECT is tiny, so is a hello
                _log.warning("early", "MQTT client at %s sent over %d bytes before its CONNACK; "
                             "closed it", self.peer, BEFORE_CONNACK_BYTES)  # fmt: skip
                self.abort()
                return
        try:
            for packet in self._reader.packets(data):  # none parsed after a close
                if self._login is not None and not self.accepted:
                    self._hold(packet)
                else:
                    self._handle(packet)
                if self.closed:
                    return
        except MalformedPacket as exc:
            if "over the limit" in str(exc):
                _log.warning("too_big", "MQTT client at %s: %s (limits.mqtt_max_packet_bytes); "
                             "closed its connection", self.peer, exc)  # fmt: skip
            else:
                _log.warning("malformed", "MQTT client at %s: %s; closed its connection",
                             self.peer, exc)  # fmt: skip
            self.abort()

    def _hold(self, packet: Packet) -> None:
        # Kept until the login is decided; a client that floods meanwhile is not a device.
        if self._held is None:
            self._held = []
        if len(self._held) >= _HELD_PACKETS:
            _log.warning("flood", "MQTT client %r at %s sent over %d packets before its CONNACK; "
                         "closed it", self.client_id, self.peer, _HELD_PACKETS)  # fmt: skip
            self.abort()
        else:
            self._held.append(packet)

    def pause_writing(self) -> None:
        """The client does not read what it is sent: drop it before its backlog grows."""
        _log.warning("slow", "MQTT client %r at %s reads too slowly (over %d bytes waiting); "
                     "closed its connection", self.client_id, self.peer,
                     self._broker.write_limit)  # fmt: skip
        self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        """Release everything the connection held; publish its will unless it said goodbye."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._login is not None and not self._login.done():
            self._login.cancel()
        if self._slot is not None:
            self._slot.release()
        broker = self._broker
        broker.connections.discard(self)
        for topic_filter in self.filters:
            broker.routes.unsubscribe(self, topic_filter)
        if not self.accepted or self.taken_over:
            return
        if broker.sessions.get(self.client_id) is self:
            del broker.sessions[self.client_id]
        will, self.will = self.will, None
        if will is not None and broker.allows(self.username, will.topic, publish=True):
            broker.route(will.topic, will.payload, min(will.qos, 1), will.retain)
        broker.device_disconnected(self.client_id)

    # --- what the broker does to it --------------------------------------------------------

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """Send a PUBLISH (QoS 1 ones are numbered; their PUBACK ends nothing kept here)."""
        if self.closed or self._transport is None:
            return
        packet_id = 0
        if qos:
            self._next_id = packet_id = self._next_id % 0xFFFF + 1
        self._transport.write(publish(topic, payload, qos, retain, packet_id))

    def abort(self) -> None:
        """Drop the connection now (its will is published)."""
        if self._transport is not None:  # closing too: a client that never reads never flushes
            self._transport.abort()
        self.closed = True

    def take_over(self) -> None:
        """A newer connection logged in with this client id (MQTT-3.1.4-2): end this one,
        without its will and without telling anyone the client left."""
        self.taken_over = True
        self.abort()

    # --- packets ---------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self.closed:
            self._transport.write(data)

    def _handle(self, packet: Packet) -> None:
        if not self.accepted:
            if isinstance(packet, Connect) and self._login is None:
                self._connect(packet)
            else:
                _log.warning("order", "MQTT client at %s sent %s before its CONNECT was "
                             "accepted; closed its connection", self.peer,
                             type(packet).__name__.upper())  # fmt: skip
                self.abort()
        elif isinstance(packet, Publish):
            self._publish(packet)
        elif isinstance(packet, PingReq):
            self._write(PINGRESP)
        elif isinstance(packet, Subscribe):
            self._subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            for topic_filter in packet.filters:
                self.filters.discard(topic_filter)
                self._broker.routes.unsubscribe(self, topic_filter)
            self._write(unsuback(packet.packet_id))
        elif isinstance(packet, Disconnect):
            self.will = None  # §3.14.4: a clean end discards the will
            self._leave()
        elif isinstance(packet, Connect):
            _log.warning("order", "MQTT client %r at %s sent a second CONNECT; closed its "
                         "connection", self.client_id, self.peer)  # fmt: skip
            self.abort()
        else:
            assert isinstance(packet, PubAck)  # of a QoS 1 delivery: nothing is kept to retry

    def _connect(self, packet: Connect) -> None:
        if packet.level not in (3, 4):
            logger.info("MQTT client at %s speaks protocol level %d; this broker speaks "
                        "MQTT 3.1.1 (and 3.1)", self.peer, packet.level)  # fmt: skip
            self._refuse(UNACCEPTABLE_PROTOCOL)
            return
        if not packet.client_id:
            self._refuse(IDENTIFIER_REJECTED)
            return
        broker = self._broker
        if not broker.admit(packet.client_id, packet.username, packet.password, self.peer):
            self._refuse(NOT_AUTHORIZED)
            return
        self.client_id, self.username = packet.client_id, packet.username
        self.keepalive, self.will = packet.keepalive, packet.will
        self._login = asyncio.get_running_loop().create_task(
            self._settle(), name=f"gateway.mqtt.login[{self.client_id}]"
        )

    def _leave(self) -> None:
        """The client said goodbye: nothing more is owed to it. A close would wait to flush what
        it left unread, and a client that never reads never lets it: with keep-alive 0 nothing
        else would ever end the connection, which holds its place under the listener's cap."""
        transport = self._transport
        self.closed = True
        if transport is not None:
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()

    def _refuse(self, code: int) -> None:
        self._write(connack(code))
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    async def _settle(self) -> None:
        broker = self._broker
        await broker.settle()
        await broker.until_heard()  # its first PUBLISH may follow the CONNACK at once
        if not self.closed:
            self._login = None  # done: an idle connection keeps no task
            self._accept()

    def _accept(self) -> None:
        broker = self._broker
        assert self._transport is not None
        older = broker.sessions.get(self.client_id)
        if older is not None:
            older.take_over()
        broker.sessions[self.client_id] = self
        self.accepted = True
        self._write(connack(ACCEPTED))
        if self._slot is not None:
            self._slot.authenticate()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.keepalive:
            self._timer = asyncio.get_running_loop().call_later(
                self.keepalive * 1.5, self._check_alive
            )
        # Stock firmware never subscribes (docs/protocol.md §2): the broker does it for it.
        self._add_filter(broker.topics.down(self.client_id), 0)
        broker.device_connected(self.client_id)
        held, self._held = self._held or [], None
        for packet in held:
            if self.closed:
                return
            self._handle(packet)

    def _publish(self, packet: Publish) -> None:
        broker = self._broker
        if broker.allows(self.username, packet.topic, publish=True):
            broker.route(packet.topic, packet.payload, packet.qos, packet.retain)
        else:
            logger.debug("MQTT client %r may not publish to %s; dropped", self.client_id,
                         packet.topic)  # fmt: skip
        if packet.qos:
            self._write(puback(packet.packet_id))

    def _subscribe(self, packet: Subscribe) -> None:
        allows = self._broker.allows
        codes = []
        granted: list[tuple[str, int]] = []
        for topic_filter, qos in packet.filters:
            if check_filter(topic_filter) and allows(self.username, topic_filter, publish=False):
                codes.append(min(qos, 1))  # no QoS 2 here: stock firmware never uses it
                granted.append((topic_filter, min(qos, 1)))
            else:
                codes.append(REFUSED_FILTER)
        self._write(suback(packet.packet_id, codes))
        for topic_filter, qos in granted:
            self._add_filter(topic_filter, qos)

    def _add_filter(self, topic_filter: str, qos: int) -> None:
        broker = self._broker
        self.filters.add(topic_filter)
        broker.routes.subscribe(self, topic_filter, qos)
        for topic, payload, kept_qos in broker.routes.retained_for(topic_filter):
            if broker.allows(self.username, topic, publish=False):
                self.deliver(topic, payload, min(qos, kept_qos), True)

    # --- timers ----------------------------------------------------------------------------

    def _connect_overdue(self) -> None:
        self._timer = None
        if not self.accepted and not self.closed:
            timeout = self._broker.guard.limits.handshake_timeout if self._broker.guard else 0
            _log.warning("handshake", "mqtt listener: closed a connection from %s: no accepted "
                         "CONNECT within %g s", self.peer, timeout)  # fmt: skip
            self.abort()

    def _check_alive(self) -> None:
        loop = asyncio.get_running_loop()
        allowed = self.keepalive * 1.5
        silent = loop.time() - self._heard
        if silent >= allowed:
            self._timer = None
            _log.warning("silent", "MQTT client %r at %s was silent for 1.5 times its keep "
                         "alive (%d s); closed its connection", self.client_id, self.peer,
                         self.keepalive)  # fmt: skip
            self.abort()
        else:
            self._timer = loop.call_later(allowed - silent, self._check_alive)
