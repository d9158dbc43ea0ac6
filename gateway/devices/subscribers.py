"""Callbacks told of one kind of event, each from ``subscribe`` until its unsubscribe is called.

The synchronous sibling of ``Broadcast`` (broadcast.py): a subscriber is called in the turn the
event happens, for what must not wait for a task (a counter in /metrics, a grant ended now).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec

__all__ = ["Subscribers", "Unsubscribe"]

P = ParamSpec("P")

Unsubscribe = Callable[[], None]
"""Stops the callback ``subscribe`` was given from being called (idempotent)."""


class Subscribers(Generic[P]):
    """The callbacks subscribed to one kind of event, called in the order they subscribed."""

    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: tuple[Callable[P, object], ...] = ()

    def subscribe(self, callback: Callable[P, object]) -> Unsubscribe:
        """Call ``callback`` with each event from now on; return what stops it."""
        self._callbacks += (callback,)

        def unsubscribe() -> None:
            self._callbacks = tuple(c for c in self._callbacks if c is not callback)

        return unsubscribe

    def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Tell every subscriber (one that unsubscribes meanwhile is still told this once)."""
        for callback in self._callbacks:
            callback(*args, **kwargs)
