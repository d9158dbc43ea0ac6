"""Subscribers: callbacks told of each event, in order, until they unsubscribe."""

from __future__ import annotations

import pytest

from gateway.devices.subscribers import AwaitedSubscribers, Subscribers


def test_each_subscriber_is_told_of_each_event_until_it_unsubscribes() -> None:
    told: list[tuple[str, int]] = []
    events: Subscribers[[int]] = Subscribers()
    stop_first = events.subscribe(lambda n: told.append(("first", n)))
    events.subscribe(lambda n: told.append(("second", n)))
    events.notify(1)
    stop_first()
    stop_first()  # idempotent
    events.notify(2)
    assert told == [("first", 1), ("second", 1), ("second", 2)]


def test_a_subscriber_that_unsubscribes_while_told_leaves_the_others_told() -> None:
    told: list[str] = []
    events: Subscribers[[]] = Subscribers()

    def once() -> None:
        told.append("once")
        stop()

    stop = events.subscribe(once)
    events.subscribe(lambda: told.append("always"))
    events.notify()
    events.notify()
    assert told == ["once", "always", "always"]


@pytest.mark.anyio
async def test_awaited_subscribers_are_awaited_in_turn_until_they_unsubscribe() -> None:
    told: list[str] = []
    events: AwaitedSubscribers[[str]] = AwaitedSubscribers()

    async def first(what: str) -> None:
        told.append(f"first {what}")

    async def second(what: str) -> None:
        told.append(f"second {what}")

    stop_first = events.subscribe(first)
    events.subscribe(second)
    await events.notify("photo")
    stop_first()
    await events.notify("another")
    assert told == ["first photo", "second photo", "second another"]
