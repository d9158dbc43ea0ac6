"""Call deadlines on shared timers: one timer per timeout length, not one per call.

Every call is bounded by its timeout (30 s by default). ``asyncio.timeout(seconds)`` arms a
timer per call and cancels it when the call ends, most often long before it would fire: a
handle made and pushed on the loop's heap, then left there cancelled until the loop sweeps it.
With a call every few milliseconds the heap holds a hundred or more such dead handles, which
every other timer's push and pop in the process (each host connection's) wades through.

Calls of one timeout length fall due in the order they start. So one timer per length, armed
for the oldest call of that length still running, bounds them all: a call joins its length's
queue and leaves it when it ends; when the timer fires, every call due by then expires
exactly as its own ``asyncio.Timeout`` would have (it is that object, rescheduled to now: the
same cancellation, ``TimeoutError`` and ``expired()``), and the timer is armed again for the
oldest call still running, if any.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

__all__ = ["Deadline", "Deadlines"]


class _Entry:
    __slots__ = ("due", "timeout")

    def __init__(self, due: float, timeout: asyncio.Timeout) -> None:
        self.due = due
        self.timeout: asyncio.Timeout | None = timeout  # None once its call ended


class _Queue:
    """The running calls of one timeout length, oldest first, and the timer for the oldest."""

    __slots__ = ("entries", "loop", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entries: deque[_Entry] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def join(self, seconds: float, timeout: asyncio.Timeout) -> _Entry:
        loop = self.loop
        entry = _Entry(loop.time() + seconds, timeout)
        self.entries.append(entry)
        if self.timer is None:
            self.timer = loop.call_at(entry.due, self._fire)
        return entry

    def leave(self, entry: _Entry) -> None:
        entry.timeout = None
        entries = self.entries
        while entries and entries[0].timeout is None:  # calls mostly end in the order they began
            entries.popleft()

    def _fire(self) -> None:
        assert self.timer is not None
        fired_at, self.timer = self.timer.when(), None
        entries = self.entries
        while entries and (entries[0].timeout is None or entries[0].due <= fired_at):
            entry = entries.popleft()
            if entry.timeout is not None:
                entry.timeout.reschedule(entry.due)  # due already: it fires on the next turn
                entry.timeout = None
        if entries:
            self.timer = self.loop.call_at(entries[0].due, self._fire)


class Deadlines:
    """The deadlines of one loop's calls: ``async with deadlines.within(seconds) as timeout``."""

    def __init__(self) -> None:
        self._queues: dict[float, _Queue] = {}  # timeout length -> its calls (a few lengths)

    def within(self, seconds: float) -> Deadline:
        """An ``asyncio.timeout(seconds)`` whose timer is shared with other calls."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(seconds)
        if queue is None or queue.loop is not loop:  # a router outliving its loop (tests)
            queue = self._queues[seconds] = _Queue(loop)
        return Deadline(queue, seconds)


class Deadline:
    """One call's deadline: enters an ``asyncio.Timeout`` that only the shared timer fires."""

    __slots__ = ("_entry", "_queue", "_seconds", "_timeout")

    def __init__(self, queue: _Queue, seconds: float) -> None:
        self._queue, self._seconds = queue, seconds

    async def __aenter__(self) -> asyncio.Timeout:
        self._timeout = timeout = asyncio.timeout(None)  # no timer of its own
        await timeout.__aenter__()
        self._entry = self._queue.join(self._seconds, timeout)
        return timeout

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._queue.leave(self._entry)
        await self._timeout.__aexit__(exc_type, exc, traceback)  # TimeoutError when it fired
