"""Deadlines of one length on one timer (gateway/net/expiries.py), on a real loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.net.expiries import Expiries
from tests.conftest import bound

pytestmark = pytest.mark.anyio


async def test_deadlines_that_pass_expire_in_order_and_ended_ones_never_do() -> None:
    loop = asyncio.get_running_loop()
    expired: list[tuple[str, float]] = []
    done = asyncio.Event()

    def expire(item: str, due: float) -> None:
        expired.append((item, due))
        if item == "c":
            done.set()

    queue: Expiries[str] = Expiries(loop, 0.05, expire)
    a, b = queue.start("a"), queue.start("b")
    queue.end(a)
    queue.end(a)  # idempotent
    c = queue.start("c")
    await asyncio.wait_for(done.wait(), bound(5))
    assert expired == [("b", b.due), ("c", c.due)]
    assert b.due <= c.due <= loop.time()
    assert not queue.entries and queue.timer is None  # nothing left: no timer either


async def test_one_timer_serves_every_deadline_and_an_expiry_may_end_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", counting)
    expired: list[str] = []
    done = asyncio.Event()
    entries: dict[str, Any] = {}

    def expire(item: str, due: float) -> None:
        expired.append(item)
        if item == "first":  # what expires first takes the next one down with it
            queue.end(entries["second"])
            queue.start("late")
        if item == "late":
            done.set()

    queue: Expiries[str] = Expiries(loop, 0.05, expire)
    for _ in range(100):  # a hundred that end at once arm the one timer, once
        queue.end(queue.start("quick"))
    assert len(armed) == 1
    entries["first"] = queue.start("first")
    entries["second"] = queue.start("second")
    await asyncio.wait_for(done.wait(), bound(5))
    assert expired == ["first", "late"]
