"""uvicorn's websockets-sansio protocol, made lean for fleets of idle WebSockets.

An idle device costs its WebSocket's memory and its keepalive, thousands of times over. Per
connection, uvicorn keeps an ``asyncio.Queue`` (three deques and an ``Event`` with a fourth) and
a ``writable`` ``Event`` (a fifth), about 3.8 KB before anything is queued; the handshake's
request and response headers for the connection's whole life; and two timers per ping (the next
ping, the pong deadline), each a heap push and, for the cancelled deadline, a heap entry left
behind. ``LeanWebSocket`` keeps uvicorn's behaviour and drops those costs:

- ``Inbox`` and ``Flag`` do what uvicorn asks of its queue and events with a list and futures
  made only while someone waits.
- The handshake headers are released once the WebSocket is accepted (uvicorn and the websockets
  parser hold the request until the connection ends; the app has its ASGI scope).
- uvicorn gives each connection some 40 attributes; beyond 30, CPython gives up sharing the
  attribute names between instances and each connection carries a dict of its own (1.6 KB).
  ``LeanWebSocket`` keeps the ones that are set once per connection and never grow in slots,
  so the rest stay in a shared-key dict.
- ``Keepalive``: one timer per loop, ticking ``interval / TICKS`` apart, pings the connections
  due in that tick and drops those whose pong did not come back within the ping timeout. Each
  ping goes out one to two ticks early (never late: pings come a few percent more often) and
  each deadline passes at the first tick after it, so a dead peer is dropped no later than with
  uvicorn's own timers (interval + timeout after its last pong), and a live one never before
  its timeout.

One mend of uvicorn's own (0.54): a WebSocket answered with an HTTP denial response (the ASGI
``websocket.http.response`` extension, e.g. a proxied device's 502) is not marked as done with
its handshake, so uvicorn logged "ASGI callable returned without completing handshake" at ERROR
for every denial. ``send`` marks it once the denial is on the wire, as uvicorn's wsproto
protocol does (Kludex/uvicorn#3138, open).
"""

from __future__ import annotations

import asyncio
import math
import random
import struct
import weakref
from typing import Any, Generic, Protocol, TypeVar

from websockets.frames import Frame

from gateway.compat.uvicorn import WebSocketsSansIOProtocol

__all__ = ["TICKS", "Flag", "Inbox", "KeptAlive", "Keepalive", "LeanWebSocket", "keepalive"]

T = TypeVar("T")

TICKS = 40
"""Keepalive ticks per ping interval (0.5 s apart at the listeners' 20 s): each ping goes out
one to two ticks early."""


class Inbox(Generic[T]):
    """The part of ``asyncio.Queue`` uvicorn uses (unbounded), without its four deques."""

    __slots__ = ("_items", "_getters")

    def __init__(self) -> None:
        self._items: list[T] = []  # a few messages at most: the listener stops reading beyond
        self._getters: list[asyncio.Future[None]] | None = None

    def put_nowait(self, item: T) -> None:
        """Queue ``item`` and wake one getter."""
        self._items.append(item)
        self._wake()

    async def get(self) -> T:
        """The oldest item, once there is one."""
        while not self._items:
            getter = asyncio.get_running_loop().create_future()
            if self._getters is None:
                self._getters = []
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                if self._items and getter.done() and not getter.cancelled():
                    self._wake()  # it was woken for an item it will not take: pass it on
                raise
            finally:
                self._forget(getter)
        return self._items.pop(0)

    def qsize(self) -> int:
        """How many items wait."""
        return len(self._items)

    def empty(self) -> bool:
        """True when no item waits."""
        return not self._items

    def _wake(self) -> None:
        for getter in self._getters or ():
            if not getter.done():
                getter.set_result(None)
                return

    def _forget(self, getter: asyncio.Future[None]) -> None:
        getters = self._getters
        if getters is not None and getter in getters:
            getters.remove(getter)
            if not getters:
                self._getters = None


class Flag:
    """The part of ``asyncio.Event`` uvicorn uses, without a deque per flag."""

    __slots__ = ("_set", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        """True while the flag is set."""
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        """Clear the flag."""
        self._set = False

    async def wait(self) -> bool:
        """Return once the flag is set."""
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return True


class KeptAlive(Protocol):
    """What ``Keepalive`` asks of a WebSocket protocol it pings."""

    keepalive_slot: int | None
    close_sent: bool
    pending_ping_payload: bytes | None
    ping_sent_at: float

    @property
    def transport(self) -> asyncio.Transport: ...

    def send_ping(self, now: float) -> None: ...

    def keepalive_timeout(self) -> None: ...


class Keepalive:
    """The pings of every ``KeptAlive`` WebSocket of one loop with one ping interval and timeout.

    Connections wait in slots, one per tick; a slot holds connections due for a ping, or past
    their pong deadline if a ping is still unanswered when the slot comes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float, timeout: float | None):
        self.interval, self.timeout = interval, timeout
        self.tick = interval / TICKS
        # The loop only by a weak reference: the loop's registry of wheels is keyed weakly by it.
        self._loop_ref = weakref.ref(loop)
        self._slots: dict[int, set[KeptAlive]] = {}
        self._done = math.floor(loop.time() / self.tick)  # every slot up to here was handled
        self._timer: asyncio.TimerHandle | None = None
        self._armed = 0  # the slot the timer is set for

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        assert loop is not None  # only its own callbacks call the wheel
        return loop

    def add(self, ws: KeptAlive) -> None:
        """Keep ``ws`` alive from now on: its first ping goes out about one interval from now."""
        self._ping_after(ws, self._loop.time())

    def answered(self, ws: KeptAlive) -> None:
        """``ws``'s pong came back: move it from its deadline to its next ping."""
        self.remove(ws)
        self._ping_after(ws, ws.ping_sent_at)

    def remove(self, ws: KeptAlive) -> None:
        """Stop keeping ``ws`` alive (idempotent)."""
        slot, ws.keepalive_slot = ws.keepalive_slot, None
        if slot is not None:
            members = self._slots.get(slot)
            if members is not None:
                members.discard(ws)
                if not members:
                    del self._slots[slot]

    def _ping_after(self, ws: KeptAlive, start: float) -> None:
        # Up to a tick early rather than late: the deadline after it then never passes later
        # than uvicorn's own (interval + timeout after the last pong).
        self._put(ws, math.floor((start + self.interval) / self.tick) - 1)

    def _put(self, ws: KeptAlive, slot: int) -> None:
        slot = max(slot, self._done + 1)
        ws.keepalive_slot = slot
        self._slots.setdefault(slot, set()).add(ws)
        if self._timer is not None and slot < self._armed:
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._arm(slot)

    def _arm(self, slot: int) -> None:
        self._armed = slot
        self._timer = self._loop.call_at(slot * self.tick, self._run)

    def _run(self) -> None:
        self._timer = None
        now = self._loop.time()
        # The loop may run a timer a hair before its time: the armed slot is due all the same.
        due = max(math.floor(now / self.tick), self._armed)
        self._done = max(self._done, due)
        for slot in sorted(s for s in self._slots if s <= due):
            for ws in self._slots.pop(slot):
                ws.keepalive_slot = None
                self._visit(ws, now)
        if self._slots and self._timer is None:
            self._arm(min(self._slots))

    def _visit(self, ws: KeptAlive, now: float) -> None:
        if ws.close_sent or ws.transport.is_closing():
            return  # closing: connection_lost follows
        if ws.pending_ping_payload is not None and self.timeout is not None:  # deadline passed
            ws.keepalive_timeout()
            return
        ws.send_ping(now)
        if self.timeout is None:
            self._ping_after(ws, now)
        else:  # the deadline: the first tick at or after it
            self._put(ws, math.ceil((now + self.timeout) / self.tick))


_wheels: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[float, float | None], Keepalive]
] = weakref.WeakKeyDictionary()


def keepalive(loop: asyncio.AbstractEventLoop, interval: float, timeout: float | None) -> Keepalive:
    """The ``Keepalive`` of ``loop`` for this interval and timeout."""
    wheels = _wheels.setdefault(loop, {})
    wheel = wheels.get((interval, timeout))
    if wheel is None:
        wheel = wheels[interval, timeout] = Keepalive(loop, interval, timeout)
    return wheel


class LeanWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, with the lean parts described above."""

    # Set by uvicorn's __init__ (a slot is a data descriptor: it takes the assignment before
    # the instance dict would); they leave the dict under CPython's 30 shared keys.
    __slots__ = ("app", "app_state", "asgi_version", "close_timeout", "close_timer", "config",
                 "connections", "default_headers", "initial_response", "last_ping_rtt", "logger",
                 "loop", "pending_ping_payload", "ping_interval", "ping_sent_at", "ping_timeout",
                 "ping_timer", "pong_timer", "root_path", "tasks")  # fmt: skip

    keepalive_slot: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn needs put_nowait/get/qsize/empty and set/clear/wait of these, nothing more.
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Flag(True)  # type: ignore[assignment]
        self._keepalive: Keepalive | None = None

    async def send(self, message: Any) -> None:  # uvicorn's ASGISendEvent (a private type)
        """uvicorn's ``send``; a denial response once sent ends the handshake (module docstring)."""
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True

    def start_keepalive(self) -> None:
        """The WebSocket is accepted (uvicorn sent 101): release the handshake, start pinging."""
        # The request stays in the websockets parser's frame for the connection's life: empty
        # its headers (uvicorn copied them into the ASGI scope); the response is spent.
        self.request.headers.clear()
        del self.response
        if self.ping_interval is not None and self.ping_interval > 0:
            self._keepalive = keepalive(self.loop, self.ping_interval, self.ping_timeout)
            self._keepalive.add(self)

    def stop_keepalive(self) -> None:
        """No more pings (the connection is closing)."""
        if self._keepalive is not None:
            self._keepalive.remove(self)
        super().stop_keepalive()

    def send_ping(self, now: float) -> None:
        """Send a ping whose pong the keepalive waits for."""
        # A random payload tells this ping's pong from stale or unsolicited ones (as uvicorn).
        self.pending_ping_payload = struct.pack("!I", random.getrandbits(32))
        self.ping_sent_at = now
        self.conn.send_ping(self.pending_ping_payload)
        self.transport.write(b"".join(self.conn.data_to_send()))

    def handle_pong(self, event: Frame) -> None:
        """The pong of the ping in flight: the peer is alive."""
        if self.pending_ping_payload is None or bytes(event.data) != self.pending_ping_payload:
            return  # unsolicited or stale
        self.last_ping_rtt = self.loop.time() - self.ping_sent_at
        self.pending_ping_payload = None
        if self._keepalive is not None:
            self._keepalive.answered(self)
