"""The embedded MQTT broker: amqtt in this process, so MQTT works with nothing else installed.

``EmbeddedBroker`` owns the policy its amqtt plugins (``gateway.device_side.broker.plugin``) apply:

- Login: the gateway's own client (a random password made at start), or a device whose client
  id and username are both its device id and whose password ``admits`` accepts (a device token
  for our firmware, the OTA-issued per-device password for stock firmware). Anonymous and
  MQTT 5 logins are refused (amqtt speaks 3.1.1 only; reference/libraries.md §3).
- Topics: a device may publish only to its own ``up`` and ``status`` topics and subscribe to,
  and receive, only its own ``down`` topic; the broker subscribes it there when it connects.
- Presence: devices connecting and leaving become ``Presence`` items of ``presence()``.
- Limits: a packet over ``max_packet_bytes`` closes its client before its body is read; the
  connection caps and the CONNECT deadline of ``limits`` hold (``broker.packets``;
  amqtt has no such options).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from amqtt.broker import Broker

from gateway.config import ListenAddress
from gateway.device_side.broker.packets import LimitedBroker
from gateway.device_side.broker.plugin import (
    AUTH_PLUGIN,
    TOPIC_PLUGIN,
    GatewayAuthPlugin,
    GatewayTopicPlugin,
    topic_allowed,
)
from gateway.device_side.broker.queues import install_lean_queues
from gateway.device_side.broker.sessions import AuthenticateFirst
from gateway.device_side.broker.states import install_session_states
from gateway.device_side.broker.subscriptions import FleetSubscriptions
from gateway.device_side.broker.topics import Topics, is_device_id
from gateway.devices.broadcast import Broadcast, Subscription
from gateway.errors import GatewayError, PortTaken
from gateway.net.addresses import local_host
from gateway.net.limits import Guard, ListenerLimits

__all__ = ["GATEWAY_LOGIN", "EmbeddedBroker", "Presence", "PresenceFeed"]

logger = logging.getLogger(__name__)
# How long a device's CONNECT waits for the gateway's own client to listen (until_heard): well
# inside stock firmware's CONNACK wait, and the listener's CONNECT deadline.
_HEARD_PATIENCE = 5.0

# Not a device id (those never contain "@"), so no device can claim the gateway's rights.
GATEWAY_LOGIN = "@esp-mcp-gateway"


class _GatewayBroker(FleetSubscriptions, AuthenticateFirst, LimitedBroker):
    """amqtt's broker with a packet size limit, authenticating before session take-over, and a
    subscription table whose work per client does not grow with the fleet."""

    policy: EmbeddedBroker | None = None

    async def _topic_filtering(self, session: Any, topic: str, action: Any) -> bool:
        # The topic plugin's answer, asked directly: amqtt's plugin manager made a task and a
        # wait for every PUBLISH and every delivery to ask it.
        return topic_allowed(self.policy, session, topic, action)


@dataclass(frozen=True, slots=True)
class Presence:
    """A device connected to the broker (``online``) or left it."""

    device_id: str
    online: bool


PresenceFeed = Subscription[Presence]
"""An async iterator of ``Presence`` items; the first ones are the devices already there."""


class EmbeddedBroker:
    """An amqtt broker on ``listen``; ``async with`` starts and stops it."""

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
            max_packet_bytes: a bigger packet closes the client's connection (packets.py).
            limits: connection caps and the CONNECT deadline (none when None).
            settle: awaited after a device's login is admitted, before it is accepted (the
                registry commits what the login decided).
        """
        self.listen = listen
        self.topics = topics
        self._admits = admits
        self._settle = settle
        self.max_packet_bytes = max_packet_bytes
        self._guard = Guard(limits) if limits is not None else None
        self.gateway_password = secrets.token_urlsafe(24)
        self._broker: Broker | None = None
        self._online: set[str] = set()
        self._presence: Broadcast[Presence] = Broadcast()
        self.port = listen.port
        # Set while the gateway's own client is subscribed (app.py hands it the transport's
        # ``connected``): until then a device's PUBLISH would reach nobody and be lost.
        self.heard: asyncio.Event | None = None

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
        _quiet_library_logs()
        install_session_states()
        install_lean_queues()
        bind = f"[{self.listen.host}]" if ":" in self.listen.host else self.listen.host
        broker = _GatewayBroker(
            {
                "listeners": {"default": {"type": "tcp", "bind": f"{bind}:{self.port}"}},
                "plugins": {AUTH_PLUGIN: {}, TOPIC_PLUGIN: {}},
            },
            self.max_packet_bytes,
            self._guard,
        )
        broker.policy = self
        for plugin in broker.plugins_manager.plugins:
            if isinstance(plugin, GatewayAuthPlugin | GatewayTopicPlugin):
                plugin.owner = self
        try:
            await broker.start()
        except Exception as exc:  # amqtt wraps the OSError in a BrokerError
            cause = exc.__cause__ or exc
            if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
                raise PortTaken(
                    f"the embedded MQTT broker cannot use port {self.listen.port}: another "
                    f"program (an MQTT broker such as mosquitto?) listens on {self.listen}; "
                    'stop it, use it ([mqtt] mode = "external"), or move the embedded broker '
                    "(--mqtt-listen HOST:PORT, or --mqtt-listen off)",
                    "mqtt",
                ) from None
            raise GatewayError(f"cannot start the MQTT broker on {self.listen}: {cause}") from None
        self._broker = broker
        server = broker._servers["default"].instance  # port 0: the only way to learn the port
        self.port = server.sockets[0].getsockname()[1]
        logger.info("embedded MQTT broker listening on %s:%d", self.listen.host, self.port)

    async def stop(self) -> None:
        """Disconnect every client and stop listening; every device goes offline."""
        broker, self._broker = self._broker, None
        if broker is None:
            return
        for device_id in sorted(self._online):
            self.device_disconnected(device_id)
        await broker.shutdown()

    def online(self) -> frozenset[str]:
        """The devices connected right now."""
        return frozenset(self._online)

    def presence(self) -> PresenceFeed:
        """Subscribe to devices connecting and leaving (those connected now come first)."""
        first = (Presence(device_id, True) for device_id in sorted(self._online))
        return self._presence.subscribe(first=first)

    # --- policy, called by the plugins ------------------------------------------------------

    def is_device_login(self, username: str | None) -> bool:
        """True for a device's login (anything but the gateway's own)."""
        return username != GATEWAY_LOGIN

    def admit(
        self, client_id: str | None, username: str | None, password: object,
        peer: str | None = None,
    ) -> bool:  # fmt: skip
        """Decide a CONNECT: the gateway itself, or a device with a valid password."""
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        if not isinstance(password, str) or not password or not username:
            logger.warning("refused MQTT client %r: no username or password", client_id)
            return False
        if username == GATEWAY_LOGIN:
            return secrets.compare_digest(password.encode(), self.gateway_password.encode())
        if client_id != username or not is_device_id(username):
            logger.warning(
                "refused MQTT client %r: client id and username must both be the device id "
                "(lower-case MAC)",
                client_id,
            )
            return False
        if not self._admits(username, password, peer):
            logger.warning(
                "refused MQTT device %s from %s (the audit log says why)", username, peer
            )
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
        if self.heard is None or self.heard.is_set():
            return
        try:
            async with asyncio.timeout(_HEARD_PATIENCE):
                await self.heard.wait()
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
        self._presence.publish(presence)


def _quiet_library_logs() -> None:
    # amqtt and its state machine library log every connection and transition at INFO: keep the
    # gateway's log readable unless it is debugging (or the user set their levels).
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ("amqtt", "transitions"):
            library = logging.getLogger(name)
            if library.level == logging.NOTSET:
                library.setLevel(logging.WARNING)
    # start() raises why it failed and the CLI says it in one line: not a traceback as well.
    broker_log = logging.getLogger("amqtt.broker")
    if not any(isinstance(f, _StartupFailureSaidElsewhere) for f in broker_log.filters):
        broker_log.addFilter(_StartupFailureSaidElsewhere())


class _StartupFailureSaidElsewhere(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Broker startup failed"
