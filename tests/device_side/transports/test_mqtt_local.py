"""The transport over the embedded broker, its client in-process: no loopback hop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gateway.config import ListenAddress
from gateway.device_side.broker import EmbeddedBroker, Topics
from gateway.device_side.transports.mqtt import MqttTransport
from gateway.devices.link import LinkClosed
from tests.conftest import bound
from tests.device_side.broker.raw import connect_packet, dropped, logged_in, publish_head
from tests.device_side.transports.test_mqtt import next_link, next_text

pytestmark = pytest.mark.anyio

DEVICE = "aa:bb:cc:dd:ee:01"
TOKEN = "device-token"


@asynccontextmanager
async def embedded() -> AsyncIterator[tuple[EmbeddedBroker, MqttTransport]]:
    def admits(device_id: str, password: str, peer: str | None = None) -> bool:
        return password == TOKEN

    async with EmbeddedBroker(ListenAddress("127.0.0.1", 0), Topics(), admits) as broker:
        async with MqttTransport(broker, Topics()) as transport:
            broker.hold_logins_until(transport.connected)
            async with asyncio.timeout(bound(5)):
                await transport.connected.wait()
            yield broker, transport


async def test_a_hello_sent_with_the_connect_reaches_the_session_the_connect_opened() -> None:
    """Stock firmware publishes at once after CONNACK: the message reaches the link opened by
    its connect (presence comes in-process, before the packets that follow it)."""
    async with embedded() as (broker, transport):
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        hello = b'{"type":"hello"}'
        writer.write(
            connect_packet(DEVICE, DEVICE, TOKEN)
            + publish_head(Topics().up(DEVICE), len(hello))
            + hello
        )
        link = await next_link(transport)
        assert await next_text(link) == '{"type":"hello"}'
        await link.send('{"type":"hello","transport":"udp"}')
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(4) == b"\x20\x02\x00\x00"
            down = Topics().down(DEVICE).encode()
            packet = await reader.readexactly(2 + 2 + len(down) + 34)
        assert packet.endswith(b'{"type":"hello","transport":"udp"}')
        # The only connection the broker has is the device's: the gateway needs none.
        assert len(broker.connections) == 1
        writer.close()
        assert await next_text(link) is None


async def test_the_gateway_publishes_nothing_once_the_broker_stopped() -> None:
    """A publish while the broker is down fails as a lost TCP client's would (LinkClosed)."""
    async with embedded() as (broker, transport):
        reader, writer = await logged_in(broker.port, DEVICE, TOKEN)
        link = await next_link(transport)
        await broker.stop()
        await dropped(reader)
        assert await next_text(link) is None
        with pytest.raises(LinkClosed):
            await transport.publish(DEVICE, "{}")
        writer.close()
