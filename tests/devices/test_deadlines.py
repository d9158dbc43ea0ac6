"""Tests for gateway.devices.deadlines: call timeouts on a timer shared by their length."""

from __future__ import annotations

import asyncio

import pytest

from gateway.devices.deadlines import Deadlines
from tests.conftest import bound

pytestmark = pytest.mark.anyio


async def _overrun(deadlines: Deadlines, seconds: float) -> asyncio.Timeout:
    """A call that never ends by itself, ended by its deadline; returns its timeout."""
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        async with deadlines.within(seconds) as timeout:
            await never
    return timeout


async def test_a_call_past_its_deadline_raises_timeout_error_and_says_it_expired() -> None:
    """The call is cancelled at its deadline, as with ``asyncio.timeout``: TimeoutError out,
    and ``expired()`` tells it from a cancellation."""
    async with asyncio.timeout(bound(5)):
        timeout = await _overrun(Deadlines(), 0.01)
    assert timeout.expired()


async def test_a_call_of_the_same_length_never_expires_early() -> None:
    """A call that began after an earlier one ended runs its whole length, although the
    timer was armed for the earlier one."""
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    async with deadlines.within(0.2):
        pass  # the timer is armed for this one's deadline
    await asyncio.sleep(0.1)  # the gap under test: the next call starts later
    started = loop.time()
    async with asyncio.timeout(bound(5)):
        await _overrun(deadlines, 0.2)
    assert loop.time() - started >= 0.2


async def test_calls_of_different_lengths_expire_each_at_its_own_time() -> None:
    """A short call expires while a longer one that began before it runs on."""
    deadlines = Deadlines()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    async with asyncio.timeout(bound(5)):
        async with deadlines.within(bound(60)) as long:
            await _overrun(deadlines, 0.01)
            never.cancel()  # the long call ends by itself
            with pytest.raises(asyncio.CancelledError):
                await never
    assert not long.expired()


async def test_a_cancelled_call_is_cancelled_not_timed_out() -> None:
    """A caller's cancellation stays a cancellation (CancelledError, not expired)."""
    deadlines = Deadlines()
    entered = asyncio.Event()
    timeouts: list[asyncio.Timeout] = []

    async def call() -> None:
        async with deadlines.within(bound(60)) as timeout:
            timeouts.append(timeout)
            entered.set()
            await asyncio.get_running_loop().create_future()

    task = asyncio.create_task(call())
    async with asyncio.timeout(bound(5)):
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not timeouts[0].expired()


async def test_calls_of_one_length_share_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hundred calls in a row arm one timer between them, not one each (issue 29)."""
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: object, *args: object, **kw: object) -> object:
        if getattr(callback, "__qualname__", "") == "Expiries._fire":
            armed.append(when)
        return call_at(when, callback, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_at", counting)
    for _ in range(100):
        async with deadlines.within(30):
            await asyncio.sleep(0)
    assert len(armed) == 1
