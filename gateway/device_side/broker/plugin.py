"""The amqtt plugins of the embedded broker: they only forward to ``EmbeddedBroker``.

amqtt loads plugins by dotted path and instantiates them itself (reference/libraries.md §3), so
``EmbeddedBroker`` finds its two plugins after building the broker and hands them itself as
``owner``; every decision (who may log in, who may use which topic, what a connection means for
presence) is made there. The plugins know the owner only as ``BrokerPolicy``, so this module
depends on nothing of the broker and the broker depends on it alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from amqtt.contexts import Action
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin

from gateway.device_side.broker.topics import Topics

__all__ = [
    "AUTH_PLUGIN",
    "TOPIC_PLUGIN",
    "BrokerPolicy",
    "GatewayAuthPlugin",
    "GatewayTopicPlugin",
    "topic_allowed",
]

AUTH_PLUGIN = f"{__name__}.GatewayAuthPlugin"
TOPIC_PLUGIN = f"{__name__}.GatewayTopicPlugin"


class BrokerPolicy(Protocol):
    """What the plugins ask of their owner (``EmbeddedBroker``)."""

    topics: Topics

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
        """Whether this login may publish to (or subscribe to) ``topic``."""
        ...

    def is_device_login(self, username: str | None) -> bool:
        """Whether this login is a device's (not the gateway's own client)."""
        ...

    def device_connected(self, device_id: str) -> None:
        """A device's session began."""
        ...

    def device_disconnected(self, device_id: str) -> None:
        """A device's session ended."""
        ...


def topic_allowed(owner: BrokerPolicy | None, session: Any, topic: str | None, action: Any) -> bool:
    """Whether ``session`` may ``action`` (publish, subscribe, receive) on ``topic``."""
    if owner is None or session is None or topic is None:
        return False
    return owner.allows(session.username, topic, publish=action == Action.PUBLISH)


class GatewayAuthPlugin(BaseAuthPlugin):  # type: ignore[misc]  # amqtt is untyped
    """Admits the gateway's own client and devices with a valid password."""

    owner: BrokerPolicy | None = None

    @dataclass
    class Config:
        """No options: the owner holds the policy."""

    async def authenticate(self, *, session: Any) -> bool:
        """Ask the owner; refuse everyone before it is attached."""
        if self.owner is None:
            return False
        owner = self.owner
        peer = getattr(session, "remote_address", None)
        admitted = owner.admit(session.client_id, session.username, session.password, peer)
        if admitted:
            await owner.settle()
            if owner.is_device_login(session.username):
                await owner.until_heard()  # its first PUBLISH may follow the CONNACK at once
        return admitted


class GatewayTopicPlugin(BaseTopicPlugin):  # type: ignore[misc]  # amqtt is untyped
    """Keeps each device to its own topics, and reports connections to the owner."""

    owner: BrokerPolicy | None = None

    @dataclass
    class Config:
        """No options: the owner holds the policy."""

    async def topic_filtering(
        self, *, session: Any = None, topic: str | None = None, action: Any = None
    ) -> bool:
        """Ask the owner whether ``session`` may ``action`` on ``topic``."""
        return topic_allowed(self.owner, session, topic, action)

    async def on_broker_client_connected(self, *, client_id: str, client_session: Any) -> None:
        """Subscribe a device to its own down topic, then tell the owner it is there."""
        owner = self.owner
        if owner is None or not owner.is_device_login(client_session.username):
            return
        # Stock firmware never subscribes (docs/protocol.md §2): the broker does it for it.
        await self.context.add_subscription(client_id, owner.topics.down(client_id), 0)
        owner.device_connected(client_id)

    async def on_broker_client_disconnected(self, *, client_id: str, client_session: Any) -> None:
        """Tell the owner a device left, unless a newer connection took its client id over."""
        owner = self.owner
        if owner is None or not owner.is_device_login(client_session.username):
            return
        current = self.context.get_session(client_id)
        if current is not None and current is not client_session:
            if current.transitions.is_connected():
                return
        owner.device_disconnected(client_id)
