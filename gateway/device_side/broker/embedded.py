"""The embedded MQTT broker: our own MQTT 3.1.1 server in this process, for stock firmware.

``EmbeddedBroker`` listens (one ``ClientConnection`` per client, connection.py) and owns the
policy its connections apply:

- Login: only devices, each with client id and username both its device id and a password
  ``admits`` accepts (a device token for our firmware, the OTA-issued per-device password for
  stock firmware). Anonymous logins are refused; MQTT 5 gets CONNACK 1. The gateway itself
  has no login: its client is in-process (below), so no password can open its rights.
- Topics: a device may publish only to its own ``up`` and ``status`` topics and subscribe to,
  and receive, only its own ``down`` topic; the broker subscribes it there when it connects.
  Retained messages and wills obey the same rule when they are delivered or published.
- The gateway's own client is in-process (``attach``/``route``): no loopback hop, and no
  second parse of what the broker already read.
- Presence: devices connecting and leaving become ``Presence`` items of ``presence()``.
- Limits: a packet over ``max_packet_bytes`` closes its client before its body is read; the
  connection caps and the CONNECT deadline of ``limits`` hold; a client that lets more than
  ``write_limit`` bytes wait unread is closed.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

from gateway.config import ListenAddress
from gateway.device_side.broker.connection import ClientConnection
from gateway.device_side.broker.routes import Routes, Subscriber
from gateway.device_side.broker.topics import Topics, is_device_id
from gateway.devices.broadcast import Broadcast, Subscription
from gateway.errors import GatewayError, PortTaken
from gateway.net.addresses import local_host
from gateway.net.limits import Guard, ListenerLimits, ThrottledLog
from gateway.net.listeners import LISTEN_BACKLOG

__all__ = ["GATEWAY_LOGIN", "EmbeddedBroker", "Presence", "PresenceFeed"]

logger = logging.getLogger(__name__)
# Anyone who can reach the port can send CONNECTs: refusals are logged at a bounded rate.
_log = ThrottledLog(logger)
# How long a device's CONNECT waits for the gateway's own client to listen (until_heard): well
# inside stock firmware's CONNACK wait, and the listener's CONNECT deadline.
_HEARD_PATIENCE = 5.0

# The in-process client's name in the ACL; not a device id (those never contain "@"), and no
# CONNECT can log in with it, so no client over TCP can claim the gateway's rights.
GATEWAY_LOGIN = "@esp-mcp-gateway"


def _shown(client_id: str | None) -> str | None:
    # A client id may be 65,535 characters, chosen by whoever connects: the log gets its start.
    return client_id if client_id is None or len(client_id) <= 64 else client_id[:64] + "..."


@dataclass(frozen=True, slots=True)
class Presence:
    """A device connected to the broker (``online``) or left it."""

    device_id: str
    online: bool


PresenceFeed = Subscription[Presence]
"""An async iterator of ``Presence`` items; the first ones are the devices already there."""


class EmbeddedBroker:
    """The MQTT server on ``listen``; ``async with`` starts and stops it."""

    def __init__(
        self,
        listen: ListenAddress,
        topics: Topics,
        admits: Callable[[str, str, str | None], bool],
        max_packet_bytes: int = 256 * 1024,
        limits: ListenerLimits | None = None,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Prepare the broker.

        Args:
            listen: where devices connect (port 0 picks a free port).
            topics: the device topics.
            admits: ``admits(device_id, password, peer)`` decides whether a device may log in
                (``peer``: the address it came from).
            max_packet_bytes: a bigger packet closes the client's connection, unread.
            limits: connection caps and the CONNECT deadline (none when None).
            settle: awaited after a device's login is admitted, before it is accepted (the
                registry commits what the login decided).
        """
        self.listen = listen
        self.topics = topics
        self._admits = admits
        self._settle = settle
        self.max_packet_bytes = max_packet_bytes
        self.guard = Guard(limits) if limits is not None else None
        # A slow reader's backlog: room for a few of the biggest packets, then it is closed.
        self.write_limit = max(4 * max_packet_bytes, 64 * 1024)
        self.routes = Routes(max_retained_bytes=64 * max_packet_bytes)
        self.sessions: dict[str, ClientConnection] = {}
        self._server: asyncio.Server | None = None
        self.connections: set[ClientConnection] = set()  # open, accepted or not
        self._online: set[str] = set()
        self._presence: Broadcast[Presence] = Broadcast()
        self._watchers: list[Callable[[Presence], None]] = []
        self.port = listen.port
        self._heard: asyncio.Event | None = None  # see ``hold_logins_until``

    def hold_logins_until(self, heard: asyncio.Event) -> None:
        """Hold devices' logins until ``heard`` is set: while the gateway's own client (the
        MQTT transport, made once the broker listens) is not subscribed yet, a device's
        PUBLISH would reach nobody and be lost."""
        self._heard = heard

    @property
    def client_host(self) -> str:
        """Where a client on this machine reaches the broker."""
        return local_host(self.listen.host)

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start listening (a restart listens on the port of the first start).

        Raises:
            GatewayError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                self._connection,
                self.listen.host,
                self.port,
                reuse_address=True,
                backlog=LISTEN_BACKLOG,  # a fleet's devices may all connect at once
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortTaken(
                    f"the embedded MQTT broker cannot use port {self.listen.port}: another "
                    f"program (an MQTT broker such as mosquitto?) listens on {self.listen}; "
                    'stop it, use it ([mqtt] mode = "external"), or move the embedded broker '
                    "(--mqtt-listen HOST:PORT, or --mqtt-listen off)",
                    "mqtt",
                ) from None
            raise GatewayError(f"cannot start the MQTT broker on {self.listen}: {exc}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        logger.info("embedded MQTT broker listening on %s:%d", self.listen.host, self.port)

    def _connection(self) -> ClientConnection:
        return ClientConnection(self)

    async def stop(self) -> None:
        """Disconnect every client and stop listening; every device goes offline."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for device_id in sorted(self._online):
            self.device_disconnected(device_id)
        for connection in list(self.connections):
            connection.taken_over = True  # the broker's end: no wills, presence already told
            connection.abort()
        self.sessions.clear()
        await server.wait_closed()

    @property
    def running(self) -> bool:
        """True while the broker listens (between ``start()`` and ``stop()``)."""
        return self._server is not None

    def online(self) -> frozenset[str]:
        """The devices connected right now."""
        return frozenset(self._online)

    def watch(self, watcher: Callable[[Presence], None]) -> None:
        """Call ``watcher`` with each ``Presence`` as it happens, before the device's packets
        that follow (the gateway's in-process client: its sessions open before a message)."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[Presence], None]) -> None:
        """Undo ``watch``."""
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    def presence(self) -> PresenceFeed:
        """Subscribe to devices connecting and leaving (those connected now come first)."""
        first = (Presence(device_id, True) for device_id in sorted(self._online))
        return self._presence.subscribe(first=first)

    # --- the gateway's own client, in process ---------------------------------------------

    def attach(self, subscriber: Subscriber, filters: Iterable[tuple[str, int]]) -> None:
        """Subscribe the gateway's in-process client (it receives every match, no ACL)."""
        for topic_filter, qos in filters:
            self.routes.subscribe(subscriber, topic_filter, qos)
            for topic, payload, kept in self.routes.retained_for(topic_filter):
                subscriber.deliver(topic, payload, min(qos, kept), True)

    def detach(self, subscriber: Subscriber, filters: Iterable[tuple[str, int]]) -> None:
        """Undo ``attach``."""
        for topic_filter, _ in filters:
            self.routes.unsubscribe(subscriber, topic_filter)

    def route(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """Deliver a message to each subscriber the ACL lets receive it; keep it if retained."""
        if retain and not self.routes.keep(topic, payload, qos):
            _log.warning("retained", "MQTT: retained messages fill their %d bytes (64 times "
                         "limits.mqtt_max_packet_bytes): the one on %s was delivered, not kept",
                         self.routes.max_retained_bytes, topic)  # fmt: skip
        for subscriber, wanted in self.routes.matching(topic):
            if self.allows(subscriber.username, topic, publish=False):
                subscriber.deliver(topic, payload, min(qos, wanted), False)

    # --- policy, asked by the connections ---------------------------------------------------

    def admit(
        self, client_id: str | None, username: str | None, password: object,
        peer: str | None = None,
    ) -> bool:  # fmt: skip
        """Decide a CONNECT: a device with a valid password."""
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        if not isinstance(password, str) or not password or not username:
            _log.warning("anonymous", "refused MQTT client %r from %s: no username or password",
                         _shown(client_id), peer)  # fmt: skip
            return False
        if client_id != username or not is_device_id(username):
            _log.warning("not_device", "refused MQTT client %r from %s: client id and username "
                         "must both be the device id (lower-case MAC)", _shown(client_id),
                         peer)  # fmt: skip
            return False
        if not self._admits(username, password, peer):
            _log.warning("refused", "refused MQTT device %s from %s (the audit log says why)",
                         username, peer)  # fmt: skip
            return False
        return True

    async def settle(self) -> None:
        """Commit what an admitted device login decided (``settle``), before accepting it."""
        if self._settle is not None:
            await self._settle()

    async def until_heard(self) -> None:
        """Hold a device's CONNECT until the gateway's own client listens, at most a few s.

        Stock firmware publishes its hello the instant it is accepted (OpenAudioChannel after
        a reconnect), and after a gateway restart devices are back before the gateway's own
        client has subscribed: a hello nobody heard is lost, and the device's conversation
        with it. A device held past the bound is let in (nothing better is coming).
        """
        if self._heard is None or self._heard.is_set():
            return
        try:
            async with asyncio.timeout(_HEARD_PATIENCE):
                await self._heard.wait()
        except TimeoutError:
            logger.warning("the gateway's own MQTT client is not listening yet; device let in")

    def allows(self, username: str | None, topic: str, *, publish: bool) -> bool:
        """May ``username`` publish to (or else subscribe to / receive) ``topic``?"""
        if username == GATEWAY_LOGIN:
            return True
        parsed = self.topics.parse(topic)
        if parsed is None or parsed[0] != username:
            return False
        kind = parsed[1]
        return kind in ("up", "status") if publish else kind == "down"

    def device_connected(self, device_id: str) -> None:
        """A device logged in (and is subscribed to its down topic)."""
        self._online.add(device_id)
        self._announce(Presence(device_id, True))

    def device_disconnected(self, device_id: str) -> None:
        """A device's connection ended."""
        if device_id in self._online:
            self._online.discard(device_id)
            self._announce(Presence(device_id, False))

    def _announce(self, presence: Presence) -> None:
        for watcher in list(self._watchers):
            watcher(presence)
        self._presence.publish(presence)
