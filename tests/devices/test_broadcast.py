"""Tests for gateway.devices.broadcast: fan-out to independent subscribers, latest-only folding."""

from __future__ import annotations

import pytest

from gateway.devices.broadcast import Broadcast

pytestmark = pytest.mark.anyio


async def test_every_subscriber_gets_every_item_in_order() -> None:
    """Two subscribers each see all items; one that closed sees none after."""
    feed: Broadcast[int] = Broadcast()
    first, second = feed.subscribe(first=[0]), feed.subscribe()
    for item in (1, 2):
        feed.publish(item)
    assert [await anext(first) for _ in range(3)] == [0, 1, 2]
    async with second:
        assert [await anext(second) for _ in range(2)] == [1, 2]
    assert feed.subscribers == 1
    second.close()  # closing twice is harmless


async def test_latest_only_folds_a_storm_into_one_item() -> None:
    """A latest-only subscriber holds one wake-up however many items came."""
    feed: Broadcast[None] = Broadcast()
    changes = feed.subscribe(latest_only=True)
    assert not changes.pending
    for _ in range(1000):
        feed.publish(None)
    assert changes.pending
    await anext(changes)
    assert not changes.pending
