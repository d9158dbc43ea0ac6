"""Deadlines of one length on one timer: what most deadlines of a server cost is arming them.

A server bounds most things by a fixed length (a call's timeout, a connection's handshake and
authentication deadlines), and most of them end long before they would fire. A timer each
(``loop.call_at``) is a handle made and pushed on the loop's heap, then cancelled and left there
until the loop sweeps it: with a host connection per tool call, or a call every few
milliseconds, the heap holds hundreds of dead handles that every other timer's push and pop
wades through.

Deadlines of one length fall due in the order they start. So ``Expiries`` keeps them in a
queue, oldest first, with one timer armed for the oldest still running: a deadline joins the
queue (an append) and leaves it when what it bounds ends (a flag); when the timer fires, every
deadline due by then is handed to ``expire`` with the time it fell due, and the timer is armed
again for the oldest still running, if any. Deadlines that ended are dropped on the way, so an
idle server holds no timer and no dead entry for long.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Expiries", "Expiry"]

T = TypeVar("T")


class Expiry(Generic[T]):
    """One deadline in its queue: ``item`` until it ends (then None), due at ``due``."""

    __slots__ = ("due", "item")

    def __init__(self, due: float, item: T) -> None:
        self.due = due
        self.item: T | None = item


class Expiries(Generic[T]):
    """Deadlines ``seconds`` long on one loop; ``expire(item, due)`` runs for each that passes."""

    __slots__ = ("entries", "expire", "loop", "seconds", "timer")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, expire: Callable[[T, float], None]
    ) -> None:
        self.loop, self.seconds, self.expire = loop, seconds, expire
        self.entries: deque[Expiry[T]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def start(self, item: T) -> Expiry[T]:
        """A deadline for ``item``, ``seconds`` from now; ``end()`` it when ``item`` is done."""
        entry = Expiry(self.loop.time() + self.seconds, item)
        self.entries.append(entry)
        if self.timer is None:
            self.timer = self.loop.call_at(entry.due, self._fire)
        return entry

    def end(self, entry: Expiry[T]) -> None:
        """``entry``'s item is done before its deadline (idempotent)."""
        entry.item = None
        entries = self.entries
        while entries and entries[0].item is None:  # most end in the order they began
            entries.popleft()

    def _fire(self) -> None:
        assert self.timer is not None
        fired_at, self.timer = self.timer.when(), None
        entries = self.entries
        due: list[Expiry[T]] = []
        while entries and (entries[0].item is None or entries[0].due <= fired_at):
            entry = entries.popleft()
            if entry.item is not None:
                due.append(entry)
        if entries:  # armed before the expiries run: one may start a deadline of its own
            self.timer = self.loop.call_at(entries[0].due, self._fire)
        for entry in due:
            item, entry.item = entry.item, None
            if item is not None:  # an earlier expiry may have ended it
                self.expire(item, entry.due)
