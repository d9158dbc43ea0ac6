"""The firmware's MQTT client (fw_mqtt), byte for byte against a scripted broker."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from device_fw.fw_mqtt import MqttClient, _packet
from tests.conftest import bound

pytestmark = pytest.mark.anyio


class ScriptedBroker:
    """Accepts one client; hands its packets to the test and writes what the test says."""

    def __init__(self) -> None:
        self.packets: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.writer: asyncio.StreamWriter | None = None
        self.done = asyncio.Event()
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        try:
            while True:
                kind = (await reader.readexactly(1))[0]
                size, shift = 0, 0
                while True:
                    digit = (await reader.readexactly(1))[0]
                    size |= (digit & 0x7F) << shift
                    shift += 7
                    if not digit & 0x80:
                        break
                await self.packets.put((kind, await reader.readexactly(size)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.done.set()

    async def next(self) -> tuple[int, bytes]:
        async with asyncio.timeout(bound(5)):
            return await self.packets.get()

    async def send(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)
        await self.writer.drain()


@asynccontextmanager
async def scripted_broker() -> AsyncIterator[ScriptedBroker]:
    broker = ScriptedBroker()
    listener = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
    async with listener:
        broker.port = listener.sockets[0].getsockname()[1]
        yield broker
        if broker.writer is not None:
            broker.writer.close()
            async with asyncio.timeout(bound(5)):
                await broker.done.wait()


def strings(data: bytes) -> list[bytes]:
    """Split a run of MQTT length-prefixed strings."""
    found = []
    while data:
        (size,) = struct.unpack("!H", data[:2])
        found.append(data[2 : 2 + size])
        data = data[2 + size :]
    return found


async def test_connect_carries_client_id_will_and_credentials() -> None:
    """CONNECT: MQTT 3.1.1, clean session, retained QoS 1 will, user and password, keepalive."""
    async with scripted_broker() as broker:
        client = MqttClient("dev", "127.0.0.1", broker.port, "dev", "tok", 45,
                            ("x/dev/status", b"offline", True, 1))  # fmt: skip
        connecting = asyncio.create_task(client.connect())
        kind, body = await broker.next()
        await broker.send(b"\x20\x02\x00\x00")
        async with asyncio.timeout(bound(5)):
            await connecting
        client.abort()
    assert kind == 0x10
    assert body[:7] == b"\x00\x04MQTT\x04"
    flags, keepalive = body[7], struct.unpack("!H", body[8:10])[0]
    assert flags == 0x80 | 0x40 | 0x20 | 0x08 | 0x04 | 0x02 and keepalive == 45
    assert strings(body[10:]) == [b"dev", b"x/dev/status", b"offline", b"dev", b"tok"]


async def test_subscribe_publish_and_incoming_qos1_is_acknowledged() -> None:
    """SUBSCRIBE waits for SUBACK; a QoS 1 PUBLISH in gets a PUBACK; QoS 0 out, long payload."""
    async with scripted_broker() as broker:
        client = MqttClient("dev", "127.0.0.1", broker.port)
        connecting = asyncio.create_task(client.connect())
        await broker.next()
        await broker.send(b"\x20\x02\x00\x00")
        await connecting
        subscribing = asyncio.create_task(client.subscribe("x/dev/down", 1))
        kind, body = await broker.next()
        assert kind == 0x82 and strings(body[2:-1]) == [b"x/dev/down"] and body[-1] == 1
        topic = struct.pack("!H", 10) + b"x/dev/down"
        await broker.send(_packet(0x32, topic + b"\x00\x07" + b'{"a":1}'))  # before the SUBACK
        await broker.send(b"\x90\x03" + body[:2] + b"\x01")
        async with asyncio.timeout(bound(5)):
            await subscribing
            received = await client.read()
        acked = await broker.next()
        await client.publish("x/dev/up", "y" * 300)
        kind, published = await broker.next()
        client.abort()
    assert received == ("x/dev/down", b'{"a":1}')
    assert acked == (0x40, b"\x00\x07")
    assert (
        kind == 0x30 and strings(published[:10]) == [b"x/dev/up"] and published[10:] == b"y" * 300
    )


async def test_a_silent_broker_past_the_timeout_ends_read() -> None:
    """read(timeout) returns None when no packet at all arrives in time (a dead link)."""
    async with scripted_broker() as broker:
        client = MqttClient("dev", "127.0.0.1", broker.port)
        connecting = asyncio.create_task(client.connect())
        await broker.next()
        await broker.send(b"\x20\x02\x00\x00")
        await connecting
        async with asyncio.timeout(bound(5)):
            assert await client.read(0.05) is None
    assert client.writer is None


def test_remaining_length_is_a_base_128_varint() -> None:
    """0 -> one zero byte, 321 -> 0xC1 0x02 (MQTT 3.1.1 2.2.3)."""
    assert _packet(0xC0, b"") == b"\xc0\x00"
    assert _packet(0x30, b"z" * 321)[:3] == b"\x30\xc1\x02"
