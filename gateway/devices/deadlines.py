"""Call deadlines on shared timers: one timer per timeout length, not one per call.

Every call is bounded by its timeout (30 s by default). ``asyncio.timeout(seconds)`` arms a
timer per call and cancels it when the call ends, most often long before it would fire: a
handle made and pushed on the loop's heap, then left there cancelled until the loop sweeps it.
With a call every few milliseconds the heap holds a hundred or more such dead handles, which
every other timer's push and pop in the process (each host connection's) wades through.

Calls of one timeout length fall due in the order they start, so they share one timer
(``gateway.net.expiries``): when it fires, every call due by then expires exactly as its own
``asyncio.Timeout`` would have (it is that object, rescheduled to when it fell due: the same
cancellation, ``TimeoutError`` and ``expired()``).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from gateway.net.expiries import Expiries, Expiry

__all__ = ["Deadline", "Deadlines"]


def _expire(timeout: asyncio.Timeout, due: float) -> None:
    timeout.reschedule(due)  # due already: it fires on the next turn


class Deadlines:
    """The deadlines of one loop's calls: ``async with deadlines.within(seconds) as timeout``."""

    def __init__(self) -> None:
        self._queues: dict[float, Expiries[asyncio.Timeout]] = {}  # length -> its calls

    def within(self, seconds: float) -> Deadline:
        """An ``asyncio.timeout(seconds)`` whose timer is shared with other calls."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(seconds)
        if queue is None or queue.loop is not loop:  # a router outliving its loop (tests)
            queue = self._queues[seconds] = Expiries(loop, seconds, _expire)
        return Deadline(queue)


class Deadline:
    """One call's deadline: enters an ``asyncio.Timeout`` that only the shared timer fires."""

    __slots__ = ("_entry", "_queue", "_timeout")

    _entry: Expiry[asyncio.Timeout]

    def __init__(self, queue: Expiries[asyncio.Timeout]) -> None:
        self._queue = queue

    async def __aenter__(self) -> asyncio.Timeout:
        self._timeout = timeout = asyncio.timeout(None)  # no timer of its own
        await timeout.__aenter__()
        self._entry = self._queue.start(timeout)
        return timeout

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._queue.end(self._entry)
        await self._timeout.__aexit__(exc_type, exc, traceback)  # TimeoutError when it fired
