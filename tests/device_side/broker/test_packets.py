"""The embedded broker's limits: packets over the size are dropped before their body, and
connections have caps and a CONNECT deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiomqtt
import pytest
from amqtt.adapters import StreamReaderAdapter
from amqtt.mqtt.packet import MQTTFixedHeader

from gateway.config import ListenAddress
from gateway.device_side.broker import GATEWAY_LOGIN, EmbeddedBroker, Topics
from gateway.device_side.broker.packets import install_packet_limit
from gateway.net.limits import ListenerLimits
from tests.conftest import bound

pytestmark = pytest.mark.anyio

TOKEN = "device-token"
DEVICE = "aa:bb:cc:dd:ee:01"
LIMIT = 1024


def varint(n: int) -> bytes:
    """MQTT's remaining-length encoding (MQTT 3.1.1 §2.2.3)."""
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def connect_packet(client_id: str, username: str, password: str) -> bytes:
    """CONNECT, MQTT 3.1.1, clean session, username and password, keepalive 60 s."""
    variable = field("MQTT") + bytes([4, 0xC2]) + (60).to_bytes(2, "big")
    body = variable + field(client_id) + field(username) + field(password)
    return b"\x10" + varint(len(body)) + body


def publish_head(topic: str, payload_size: int) -> bytes:
    """A QoS 0 PUBLISH up to its payload, which ``payload_size`` bytes must follow."""
    topic_field = field(topic)
    return b"\x30" + varint(len(topic_field) + payload_size) + topic_field


async def logged_in(port: int, device_id: str, password: str) -> tuple[
    asyncio.StreamReader, asyncio.StreamWriter
]:  # fmt: skip
    """A raw MQTT client past CONNACK (accepted)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(connect_packet(device_id, device_id, password))
    async with asyncio.timeout(bound(5)):
        assert await reader.readexactly(4) == b"\x20\x02\x00\x00"
    return reader, writer


async def dropped(reader: asyncio.StreamReader) -> None:
    """Wait until the broker closes the connection."""
    async with asyncio.timeout(bound(5)):
        try:
            assert await reader.read() == b""
        except ConnectionResetError:
            pass


@asynccontextmanager
async def broker(
    limit: int = LIMIT, limits: ListenerLimits | None = None
) -> AsyncIterator[EmbeddedBroker]:
    def admits(device_id: str, password: str, peer: str | None = None) -> bool:
        return password == TOKEN

    listen = ListenAddress("127.0.0.1", 0)
    embedded = EmbeddedBroker(listen, Topics(), admits, max_packet_bytes=limit, limits=limits)
    async with embedded:
        yield embedded


def gateway_client(b: EmbeddedBroker) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", b.port, username=GATEWAY_LOGIN, identifier="gw-test",
                          password=b.gateway_password, timeout=bound(5))  # fmt: skip


async def test_a_publish_over_the_limit_drops_the_client_before_its_body() -> None:
    """Only the header of a too-big PUBLISH is sent: the broker hangs up without the body."""
    async with broker() as b:
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        writer.write(publish_head(Topics().up(DEVICE), LIMIT))
        await dropped(reader)
        writer.close()


async def test_a_publish_up_to_the_limit_is_delivered() -> None:
    """A packet of exactly max_packet_bytes passes, and the client stays connected."""
    topic = Topics().up(DEVICE)
    async with broker() as b, gateway_client(b) as gateway:
        await gateway.subscribe(topic)
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        payload = b"x" * (LIMIT - len(field(topic)))
        writer.write(publish_head(topic, len(payload)) + payload + b"\xc0\x00")  # + PINGREQ
        async with asyncio.timeout(bound(5)):
            message = await anext(aiter(gateway.messages))
            assert await reader.readexactly(2) == b"\xd0\x00"  # PINGRESP: still connected
        assert message.payload == payload
        writer.close()


async def test_a_connect_over_the_limit_is_refused_before_login() -> None:
    """The limit holds for anyone, not only logged-in devices."""
    async with broker() as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(connect_packet(DEVICE, DEVICE, "p" * LIMIT))
        await dropped(reader)
        writer.close()
        _, writer = await logged_in(b.port, DEVICE, TOKEN)  # the broker serves on
        writer.close()


async def test_readers_of_other_brokers_and_clients_are_not_limited() -> None:
    """The check is on the reader: a plain amqtt reader decodes any length, as before."""
    install_packet_limit()
    install_packet_limit()  # once is enough; twice changes nothing
    stream = asyncio.StreamReader()
    stream.feed_data(b"\x30" + varint(200 * 1024 * 1024))
    header = await MQTTFixedHeader.from_stream(StreamReaderAdapter(stream))
    assert header.remaining_length == 200 * 1024 * 1024


async def test_a_client_without_an_accepted_connect_is_closed_at_the_deadline() -> None:
    """amqtt would wait for ever; a logged-in device is past the deadline and stays."""
    limits = ListenerLimits("mqtt", 100, 100, handshake_timeout=0.3, auth_timeout=30)
    async with broker(limits=limits) as b:
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        loop = asyncio.get_running_loop()
        start = loop.time()
        silent, silent_writer = await asyncio.open_connection("127.0.0.1", b.port)
        partial, partial_writer = await asyncio.open_connection("127.0.0.1", b.port)
        partial_writer.write(connect_packet(DEVICE, DEVICE, TOKEN)[:10])
        await dropped(silent)
        await dropped(partial)
        assert loop.time() - start >= 0.25
        writer.write(b"\xc0\x00")  # PINGREQ
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(2) == b"\xd0\x00"
        for w in (writer, silent_writer, partial_writer):
            w.close()


async def test_connection_caps_hold_on_the_broker_too() -> None:
    """Past per_address clients without an accepted CONNECT, the next is dropped at once."""
    limits = ListenerLimits("mqtt", 100, per_address=2, handshake_timeout=10, auth_timeout=30)
    async with broker(limits=limits) as b:
        _, device = await logged_in(b.port, DEVICE, TOKEN)  # accepted: it does not count
        held = [await asyncio.open_connection("127.0.0.1", b.port) for _ in range(2)]
        extra, extra_writer = await asyncio.open_connection("127.0.0.1", b.port)
        await dropped(extra)
        assert [reader.at_eof() for reader, _ in held] == [False, False]
        for w in (device, extra_writer, *(w for _, w in held)):
            w.close()
