"""Staying on a broker cluster: the next node when one fails, and subscriptions a node refuses.

``Failover`` is the order in which a client tries a cluster's nodes (``[cluster] broker``, a
list): after a lost or failed connection, the next node at once; only once a whole round of
nodes failed in a row does it wait, with backoff. One login is the single-broker case: the
backoff alone.

A node that refuses a subscription is asked again, then left for the next
(``aiomqtt_fixes.subscribe_all``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["Failover"]


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
