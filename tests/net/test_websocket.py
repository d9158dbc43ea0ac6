"""The lean WebSocket protocol on a bare uvicorn: keepalive over real sockets, per-connection cost.

Peers here are sans-I/O websockets clients on raw streams, so a test decides whether a ping gets
its pong.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from gateway.net.limits import ListenerLimits
from gateway.net.websocket import Flag, Inbox, LeanWebSocket
from tests.conftest import bound, listener_timers
from tests.net.test_limits import serving as limits_serving

pytestmark = pytest.mark.anyio

LIMITS = ListenerLimits(
    name="test", max_connections=100, per_address=100, handshake_timeout=5.0, auth_timeout=10.0
)
PING = 0.2  # s: the ping interval and timeout of the listeners here
SHARED_KEYS_MAX = 30  # CPython's bound on the attribute names instances of a class share


@asynccontextmanager
async def serving(ping: float = PING, pong: float | None = PING) -> AsyncIterator[int]:
    """The listeners' protocols on a bare uvicorn pinging every ``ping`` s, dropping a peer
    whose pong is ``pong`` s late; yields the port."""
    settings = {"ws_ping_interval": ping, "ws_ping_timeout": pong}
    async with limits_serving(LIMITS, **settings) as (port, _):
        yield port


class Peer:
    """A WebSocket client that counts the pings it gets and answers them only if ``answer``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.protocol = ClientProtocol(parse_uri("ws://127.0.0.1/"))
        self.pings = 0
        self.closed: Close | None = None

    @classmethod
    async def open(cls, port: int) -> Peer:
        """A peer whose WebSocket the server accepted."""
        peer = cls(*await asyncio.open_connection("127.0.0.1", port))
        peer.protocol.send_request(peer.protocol.connect())
        peer.writer.write(b"".join(peer.protocol.data_to_send()))
        async with asyncio.timeout(bound(5)):
            while not any(isinstance(e, Response) for e in peer.protocol.events_received()):
                peer.protocol.receive_data(await peer.reader.read(65536))
        assert peer.protocol.handshake_exc is None
        return peer

    async def run(self, answer: bool, pings: int | None = None) -> None:
        """Read until the server closes, or until ``pings`` pings came."""
        while pings is None or self.pings < pings:
            data = await self.reader.read(65536)
            if not data:
                return
            self.protocol.receive_data(data)
            for event in self.protocol.events_received():
                if isinstance(event, Frame) and event.opcode is Opcode.PING:
                    self.pings += 1
                elif isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                    self.closed = Close.parse(event.data)
            pending = self.protocol.data_to_send()  # pongs, and the reply to a close
            if answer or self.closed is not None:
                self.writer.write(b"".join(pending))

    def close(self) -> None:
        self.writer.close()


async def test_a_peer_that_stops_answering_pings_is_dropped_after_one_unanswered_ping() -> None:
    async with serving() as port:
        peer = await Peer.open(port)
        try:
            async with asyncio.timeout(bound(5)):
                await peer.run(answer=False)
        finally:
            peer.close()
    assert peer.closed is not None and peer.closed.code == 1011  # keepalive ping timeout
    assert peer.pings == 1


async def test_a_peer_that_answers_its_pings_stays_connected() -> None:
    async with serving() as port:
        peer = await Peer.open(port)
        try:
            async with asyncio.timeout(bound(5)):
                await peer.run(answer=True, pings=4)
            assert peer.closed is None and not peer.reader.at_eof()
        finally:
            peer.close()


async def test_without_a_ping_timeout_pings_go_on_unanswered() -> None:
    async with serving(pong=None) as port:
        peer = await Peer.open(port)
        try:
            async with asyncio.timeout(bound(5)):
                await peer.run(answer=False, pings=3)
            assert peer.closed is None
        finally:
            peer.close()


def deques(besides: list[Peer] = []) -> int:  # noqa: B006 (never changed)
    """Deques alive, but for those of the peers' own streams."""
    theirs = {id(v) for p in besides for v in vars(p.writer.transport.get_protocol()).values()}
    return sum(isinstance(o, collections.deque) and id(o) not in theirs for o in gc.get_objects())


async def test_idle_websockets_share_one_keepalive_timer_and_hold_no_deques() -> None:
    """Per idle connection uvicorn kept two timers per ping and five deques (its queue and
    events); the listeners' protocol keeps neither, so an idle fleet costs less of both."""
    count = 20
    async with serving(ping=30.0) as port:
        gc.collect()
        timers, before = listener_timers(), deques()
        peers = [await Peer.open(port) for _ in range(count)]
        try:
            gc.collect()
            # The keepalive's and the listener's handshake and authentication deadlines' (one
            # each, armed by the first connection), whatever the count.
            assert listener_timers() - timers <= 3
            assert deques(peers) - before < count
        finally:
            for peer in peers:
                peer.close()


async def test_idle_websockets_share_their_attribute_names() -> None:
    """uvicorn sets some 40 attributes per connection, and past 30 CPython gives each instance
    a dict of its own (1.6 KB); the listeners' protocol keeps the dict under that bound, so
    its keys are shared by every connection."""
    async with serving(ping=30.0) as port:
        peers = [await Peer.open(port) for _ in range(3)]
        try:
            protocols = [o for o in gc.get_objects() if isinstance(o, LeanWebSocket)]
            assert len(protocols) == 3
            for protocol in protocols:
                assert protocol.scope and protocol.ping_interval == 30.0  # kept, in slots
                assert len(vars(protocol)) <= SHARED_KEYS_MAX
                assert sys.getsizeof(vars(protocol)) < 400  # before: 1,584 bytes
        finally:
            for peer in peers:
                peer.close()


async def test_inbox_hands_each_item_to_one_getter_in_order() -> None:
    inbox: Inbox[int] = Inbox()
    first = asyncio.create_task(inbox.get())
    second = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    assert sorted(await asyncio.gather(first, second)) == [1, 2]
    assert inbox.empty() and inbox.qsize() == 0


async def test_inbox_passes_an_item_on_when_its_getter_is_cancelled() -> None:
    inbox: Inbox[str] = Inbox()
    cancelled = asyncio.create_task(inbox.get())
    waiting = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait("a")  # wakes ``cancelled``, which is cancelled before it runs
    cancelled.cancel()
    async with asyncio.timeout(bound(5)):
        assert await waiting == "a"
    assert cancelled.cancelled()


async def test_flag_wakes_every_waiter_and_waits_only_while_clear() -> None:
    flag = Flag()
    waiters = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    flag.set()
    assert await asyncio.gather(*waiters) == [True] * 3
    assert flag.is_set() and await flag.wait()
    flag.clear()
    assert not flag.is_set()
