"""One producer, many async subscribers: the registry's change feed and the broker's presence feed.

Each subscriber has its own queue, so a slow one never holds up the producer or the others. A
``latest_only`` subscription keeps at most one item waiting: for "something changed, look
again" signals, a storm of changes folds into one wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["Broadcast", "Subscription"]

T = TypeVar("T")


class Broadcast(Generic[T]):
    """Fans each published item out to every current subscriber."""

    def __init__(self) -> None:
        self._queues: list[asyncio.Queue[T]] = []

    @property
    def subscribers(self) -> int:
        """How many subscriptions are open."""
        return len(self._queues)

    def publish(self, item: T) -> None:
        """Give ``item`` to every subscriber (never blocks)."""
        for queue in self._queues:
            if queue.maxsize == 0 or queue.empty():  # a full latest-only queue says it already
                queue.put_nowait(item)

    def subscribe(self, *, first: Iterable[T] = (), latest_only: bool = False) -> Subscription[T]:
        """A new subscription; ``first`` are items it receives before anything published."""
        queue: asyncio.Queue[T] = asyncio.Queue(maxsize=1 if latest_only else 0)
        for item in first:
            if queue.maxsize == 0 or queue.empty():
                queue.put_nowait(item)
        self._queues.append(queue)
        return Subscription(self._queues, queue)


class Subscription(Generic[T]):
    """A subscriber's end: an async iterator, and an async context manager that closes it."""

    def __init__(self, queues: list[asyncio.Queue[T]], queue: asyncio.Queue[T]) -> None:
        self._queues = queues
        self._queue = queue

    @property
    def pending(self) -> bool:
        """True when an item is waiting."""
        return not self._queue.empty()

    def close(self) -> None:
        """Stop receiving items."""
        if self._queue in self._queues:
            self._queues.remove(self._queue)

    async def __aenter__(self) -> Subscription[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> Subscription[T]:
        return self

    async def __anext__(self) -> T:
        return await self._queue.get()
