"""Callbacks told of one kind of event, each from ``subscribe`` until its unsubscribe is called.

The synchronous sibling of ``Broadcast`` (broadcast.py): a subscriber is called in the turn the
event happens, for what must not wait for a task (a counter in /metrics, a grant ended now);
``AwaitedSubscribers`` are awaited one after the other, by the code that tells them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, ParamSpec, TypeVar

__all__ = ["AwaitedSubscribers", "Subscribers", "Unsubscribe"]

P = ParamSpec("P")
C = TypeVar("C")

Unsubscribe = Callable[[], None]
"""Stops the callback ``subscribe`` was given from being called (idempotent)."""


class _Callbacks(Generic[C]):
    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        # A tuple, replaced whole: one that unsubscribes while being told stops no other.
        self._callbacks: tuple[C, ...] = ()

    def subscribe(self, callback: C) -> Unsubscribe:
        """Tell ``callback`` of each event from now on; return what stops it."""
        self._callbacks += (callback,)

        def unsubscribe() -> None:
            self._callbacks = tuple(c for c in self._callbacks if c is not callback)

        return unsubscribe


class Subscribers(_Callbacks[Callable[P, object]], Generic[P]):
    """The callbacks subscribed to one kind of event, called in the order they subscribed."""

    __slots__ = ()

    def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Tell every subscriber (one that unsubscribes meanwhile is still told this once)."""
        for callback in self._callbacks:
            callback(*args, **kwargs)


class AwaitedSubscribers(_Callbacks[Callable[P, Awaitable[object]]], Generic[P]):
    """Coroutine functions subscribed to one kind of event, awaited in the order they
    subscribed."""

    __slots__ = ()

    async def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Await every subscriber in turn."""
        for callback in self._callbacks:
            await callback(*args, **kwargs)
