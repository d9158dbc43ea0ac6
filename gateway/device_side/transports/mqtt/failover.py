"""Staying on a broker cluster: the next node when one fails, and subscriptions a node refuses.

``Failover`` is the order in which a client tries a cluster's nodes (``[cluster] broker``, a
list): after a lost or failed connection, the next node at once; only once a whole round of
nodes failed in a row does it wait, with backoff. One login is the single-broker case: the
backoff alone.

``subscribe_all`` subscribes and checks what the broker granted. A node that cannot serve a
subscription yet says so in its SUBACK (a NATS node while JetStream elects a new leader after
another node died refuses for a few seconds), and aiomqtt does not raise for it: the
subscription is asked again until it is granted, and the connection given up past ``patience``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

import aiomqtt
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["Failover", "refused", "subscribe_all"]

_REFUSED = 0x80  # SUBACK: the first failure code (MQTT 3.1.1 0x80, MQTT 5 0x80 and above)
_ASK_AGAIN = 0.5  # seconds between two asks of a refused subscription


class Node(Protocol):
    """Where a broker node listens (client.py's ``BrokerLogin``)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


N = TypeVar("N", bound=Node)


class Failover(Generic[N]):
    """The broker nodes a client tries, in turn; ``current`` is the one to try now."""

    def __init__(self, logins: Sequence[N], retry: tuple[float, float]) -> None:
        if not logins:
            raise ValueError("at least one broker login")
        self.logins = tuple(logins)
        self._retry = retry
        self._index = 0
        self._failures = 0  # connections failed or lost since the last that was ready
        self._delay = retry[0]

    @property
    def current(self) -> N:
        return self.logins[self._index]

    @property
    def where(self) -> str:
        return f"{self.current.host}:{self.current.port}"

    @property
    def away(self) -> bool:
        """Is ``current`` another node than the first (the preferred one)?"""
        return self._index != 0

    def home(self) -> None:
        """Connected and subscribed on the first node again (a move back, not a failure)."""
        self._index = 0
        self.ready()

    def ready(self) -> None:
        """Connected and subscribed: the next failure starts a new round, with no wait."""
        self._failures, self._delay = 0, self._retry[0]

    def failed(self) -> float:
        """The connection to ``current`` failed or was lost: move to the next node; the seconds
        to wait first (none until every node failed in this round, then backoff)."""
        self._failures += 1
        self._index = (self._index + 1) % len(self.logins)
        if self._failures % len(self.logins):
            return 0.0
        delay, self._delay = self._delay, min(self._delay * 2, self._retry[1])
        return delay


def refused(granted: Sequence[int | ReasonCode]) -> bool:
    """Did the broker refuse any subscription of a SUBACK?"""
    return any((code if isinstance(code, int) else code.value) >= _REFUSED for code in granted)


async def subscribe_all(
    client: aiomqtt.Client, subscriptions: Sequence[tuple[str, int]], patience: float
) -> None:
    """Subscribe to each ``(topic, qos)``, asking again for any the broker refuses.

    Raises:
        aiomqtt.MqttError: the connection failed, or a subscription was still refused after
            ``patience`` seconds (the caller moves to another node).
    """
    for topic, qos in subscriptions:
        try:
            async with asyncio.timeout(patience):
                # Polled: the broker tells nothing when it could grant it.
                while refused(await client.subscribe(topic, qos=qos)):  # noqa: ASYNC110
                    await asyncio.sleep(_ASK_AGAIN)
        except TimeoutError:
            raise aiomqtt.MqttError(
                f"the broker refused the subscription to {topic} for {patience:g} s"
            ) from None
