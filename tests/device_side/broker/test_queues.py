"""amqtt's per-client queues: the same queues, their deques made only when used."""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import AsyncExitStack
from typing import Any

import pytest

from gateway.device_side.broker.queues import LeanQueue
from tests.conftest import bound
from tests.device_side.broker.test_embedded import TOKEN, broker, client, next_presence

pytestmark = pytest.mark.anyio

DEVICES = 10


def _queue_parts(holder: Any) -> tuple[int, int, int]:
    """Queues of ``holder`` and the deques and Events they hold."""
    queues = [v for v in vars(holder).values() if isinstance(v, asyncio.Queue)]
    parts = [v for q in queues for v in vars(q).values()]
    deques = sum(isinstance(p, deque) for p in parts)
    return len(queues), deques, sum(isinstance(p, asyncio.Event) for p in parts)


async def test_an_idle_mqtt_devices_queues_hold_only_what_they_use() -> None:
    """A device's session and handler kept four queues of three deques and an Event each (16
    deques); those of an idle stock device now hold what its three waiting readers use (items
    and getters: 6 deques) and the retained messages' items (1)."""
    async with broker() as b, AsyncExitStack() as fleet:
        feed = b.presence()
        for n in range(DEVICES):
            await fleet.enter_async_context(client(b, f"aa:bb:cc:dd:ee:{n:02x}", TOKEN))
            await next_presence(feed)
        inner = b._broker
        assert inner is not None
        totals = [0, 0, 0]
        for session, handler in inner._sessions.values():
            for holder in (session, handler):
                for index, count in enumerate(_queue_parts(holder)):
                    totals[index] += count
        queues, deques, events = (total / DEVICES for total in totals)
        assert queues == 4  # the same queues as amqtt's
        assert deques <= 7 and events == 0
        feed.close()


async def test_a_lean_queue_behaves_as_asyncios() -> None:
    """FIFO, waiting getters and putters, a bound, task_done and join."""
    q = LeanQueue(maxsize=2)
    assert q.empty() and q.qsize() == 0 and not q.full()
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()
    async with asyncio.timeout(bound(5)):
        await q.join()  # nothing unfinished
        getter = asyncio.create_task(q.get())
        await asyncio.wait([getter], timeout=0)
        await q.put("a")
        assert await getter == "a"
        q.task_done()
        q.put_nowait("b")
        q.put_nowait("c")
        assert q.full()
        with pytest.raises(asyncio.QueueFull):
            q.put_nowait("d")
        putter = asyncio.create_task(q.put("d"))
        await asyncio.wait([putter], timeout=0)
        assert not putter.done()
        assert [q.get_nowait(), await q.get()] == ["b", "c"]
        await putter
        assert q.get_nowait() == "d"
        joined = asyncio.create_task(q.join())
        await asyncio.wait([joined], timeout=0)
        assert not joined.done()  # three put, none done
        for _ in range(3):
            q.task_done()
        await joined
