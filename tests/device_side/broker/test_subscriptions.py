"""The broker's subscription table: a client's work does not grow with the fleet."""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import pytest

from gateway.device_side.broker import EmbeddedBroker
from gateway.device_side.broker.subscriptions import SubscriptionTable
from tests.conftest import bound
from tests.device_side.broker.test_embedded import (
    DEVICE,
    OTHER,
    TOKEN,
    broker,
    client,
    first_message,
    gateway_client,
    next_presence,
)

pytestmark = pytest.mark.anyio

FLEET = 40


def _device(n: int) -> str:
    return f"aa:bb:cc:dd:{n >> 8:02x}:{n & 255:02x}"


def _count_calls(b: EmbeddedBroker, names: tuple[str, ...]) -> Counter[str]:
    """Count calls of the amqtt broker's methods ``names`` from now on."""
    calls: Counter[str] = Counter()
    inner: Any = b._broker
    for name in names:
        method = getattr(inner, name)

        def counted(*args: Any, _method: Any = method, _name: str = name) -> Any:
            calls[_name] += 1
            return _method(*args)

        setattr(inner, name, counted)
    return calls


def _cleaned_up(b: EmbeddedBroker, client_id: str) -> asyncio.Event:
    """Set once amqtt's session monitor has removed ``client_id``'s ended session."""
    done = asyncio.Event()
    inner: Any = b._broker
    cleanup = inner._cleanup_session

    async def cleaned(cid: str) -> None:
        await cleanup(cid)
        if cid == client_id:
            done.set()

    inner._cleanup_session = cleaned
    return done


async def test_a_device_joining_a_fleet_walks_only_its_own_subscriptions() -> None:
    """Connecting and leaving visit the device's own filter, not one per device in the fleet."""
    async with broker() as b, gateway_client(b) as gw, AsyncExitStack() as fleet:
        feed = b.presence()
        for n in range(FLEET):
            await fleet.enter_async_context(client(b, _device(n), TOKEN))
            await next_presence(feed)
        calls = _count_calls(
            b, ("_publish_retained_messages_for_subscription", "_del_subscription")
        )
        cleaned = _cleaned_up(b, DEVICE)
        async with client(b, DEVICE, TOKEN) as device:
            await next_presence(feed)
            await gw.publish(f"xiaozhi/{DEVICE}/down", b"hi", qos=1)
            await first_message(device)  # its session is past the retained messages' step
        async with asyncio.timeout(bound(5)):
            await cleaned.wait()
        # Its own down topic at most once each (the broker subscribes it there in a task of its
        # own, which may come after the retained messages' step): amqtt 0.12 made FLEET + 2.
        assert calls["_publish_retained_messages_for_subscription"] <= 1
        assert calls["_del_subscription"] == 1
        feed.close()


async def test_a_connecting_device_gets_no_retained_message_of_another_device() -> None:
    """Retained messages under the gateway's wildcard filters stay with the gateway."""
    async with broker() as b, gateway_client(b) as gw:
        await gw.subscribe("xiaozhi/+/status", qos=0)
        async with client(b, OTHER, TOKEN) as other:
            await other.publish(f"xiaozhi/{OTHER}/status", b"online", qos=1, retain=True)
        assert (await first_message(gw)).payload == b"online"
        feed = b.presence()
        async with client(b, DEVICE, TOKEN) as device:
            await next_presence(feed)
            await gw.publish(f"xiaozhi/{DEVICE}/down", b"first", qos=1)
            message = await first_message(device)
        assert (message.topic.value, message.payload) == (f"xiaozhi/{DEVICE}/down", b"first")
        feed.close()


async def test_a_subscribing_client_does_not_build_the_whole_table_for_a_log_line() -> None:
    """amqtt logs repr(table) after each SUBSCRIBE: it is the table's size, not its content."""
    async with broker() as b, gateway_client(b) as gw:
        await gw.subscribe("xiaozhi/+/up", qos=0)  # SUBACK: amqtt has logged its line
        table = b._broker._subscriptions if b._broker is not None else None
        assert isinstance(table, SubscriptionTable)
        assert repr(table) == "<1 subscription filters>"


def test_the_table_knows_each_clients_filters() -> None:
    """Subscribed and unsubscribed filters are kept per client; the next client's iteration
    yields only its own filters, once."""
    table = SubscriptionTable()
    for n in range(100):
        table[f"xiaozhi/{n}/down"] = [("session", 0)]
        table.subscribed(f"c{n}", f"xiaozhi/{n}/down")
    table["xiaozhi/+/up"] = [("gateway", 0)]
    table.subscribed("gw", "xiaozhi/+/up")
    table.subscribed("c7", "xiaozhi/+/up")
    assert sorted(table.filters_of("c7")) == ["xiaozhi/+/up", "xiaozhi/7/down"]
    table.next_client = "c7"
    assert sorted(table) == ["xiaozhi/+/up", "xiaozhi/7/down"]
    assert len(list(table)) == 101  # the hint is used once
    table.unsubscribed("c7", "xiaozhi/+/up")
    table.unsubscribed("c7", "xiaozhi/7/down")
    table.unsubscribed("nobody", "xiaozhi/7/down")
    assert table.filters_of("c7") == []
    table.clear()
    assert table.filters_of("gw") == [] and repr(table) == "<0 subscription filters>"
