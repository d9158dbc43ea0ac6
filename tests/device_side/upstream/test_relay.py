"""The relay's link to the gateway: bounded (the device waits, memory does not grow), and
detaching the gateway never ends the conversation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.device_side.upstream.relay import _GATEWAY_QUEUE, TappedLink
from gateway.devices.link import LinkClosed

pytestmark = pytest.mark.anyio


class Device:
    """What the link sends to (a Starlette WebSocket's ``send_text``)."""

    def __init__(self, gone: bool = False) -> None:
        self.sent: list[str] = []
        self.gone = gone

    async def send_text(self, text: str) -> None:
        if self.gone:
            raise RuntimeError("WebSocket is not connected")
        self.sent.append(text)


def tapped(device: Any) -> TappedLink:
    return TappedLink(device)


async def test_a_gateway_behind_makes_the_device_wait_not_memory_grow() -> None:
    link = tapped(Device())
    for n in range(_GATEWAY_QUEUE):
        await link.feed(f"frame {n}")
    blocked = asyncio.create_task(link.feed("one too many"))
    await asyncio.sleep(0)
    assert not blocked.done()  # the device's reading pauses here (backpressure)
    frames = aiter(link)
    assert await anext(frames) == "frame 0"
    await asyncio.wait_for(blocked, 5)  # one read made room for it
    link.end()
    rest = [frame async for frame in frames]
    assert rest == [f"frame {n}" for n in range(1, _GATEWAY_QUEUE)] + ["one too many"]


async def test_detaching_the_gateway_frees_the_device_and_stops_its_sends() -> None:
    device = Device()
    link = tapped(device)
    for n in range(_GATEWAY_QUEUE):
        await link.feed(f"frame {n}")
    blocked = asyncio.create_task(link.feed("waiting"))
    await asyncio.sleep(0)
    await link.aclose()  # e.g. the gateway's discovery timed out: the voice goes on
    await asyncio.wait_for(blocked, 5)
    await link.feed("dropped")
    with pytest.raises(LinkClosed):
        await link.send("late")
    assert device.sent == []


async def test_a_device_gone_is_a_closed_link() -> None:
    link = tapped(Device(gone=True))
    with pytest.raises(LinkClosed):
        await link.send("hello")
    working = Device()
    await tapped(working).send("hello")
    assert working.sent == ["hello"]
