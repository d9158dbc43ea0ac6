"""A raw MQTT client's bytes, for tests that need what a well-behaved library never sends."""

from __future__ import annotations

import asyncio

from gateway.device_side.broker import GATEWAY_LOGIN
from gateway.protocol.mqtt import remaining_length
from tests.conftest import bound


def field(text: str | bytes) -> bytes:
    """A length-prefixed string (MQTT 3.1.1 §1.5.3)."""
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def connect_packet(
    client_id: str, username: str, password: str, *, keepalive: int = 60,
    will: tuple[str, bytes] | None = None, level: int = 4,
) -> bytes:  # fmt: skip
    """CONNECT, clean session, username and password (and a QoS 0 will)."""
    flags = 0xC2 | (0x04 if will else 0)
    variable = field("MQTT") + bytes([level, flags]) + keepalive.to_bytes(2, "big")
    if level == 5:
        variable += b"\x00"  # no properties
    body = variable + field(client_id)
    if will is not None:
        body += field(will[0]) + field(will[1])
    body += field(username) + field(password)
    return b"\x10" + remaining_length(len(body)) + body


def publish_head(topic: str, payload_size: int) -> bytes:
    """A QoS 0 PUBLISH up to its payload, which ``payload_size`` bytes must follow."""
    topic_field = field(topic)
    return b"\x30" + remaining_length(len(topic_field) + payload_size) + topic_field


async def logged_in(
    port: int, device_id: str, password: str, **options: object
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw MQTT client past CONNACK (accepted)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(connect_packet(device_id, device_id, password, **options))  # type: ignore[arg-type]
    async with asyncio.timeout(bound(5)):
        assert await reader.readexactly(4) == b"\x20\x02\x00\x00"
    return reader, writer


async def dropped(reader: asyncio.StreamReader) -> None:
    """Wait until the broker closes the connection."""
    async with asyncio.timeout(bound(5)):
        try:
            while await reader.read(65536):
                pass  # what was sent before the end
        except ConnectionResetError:
            pass


class Listener:
    """The gateway's side, in process: every message the broker routes to it."""

    username = GATEWAY_LOGIN

    def __init__(self) -> None:
        self.messages: asyncio.Queue[tuple[str, bytes, int, bool]] = asyncio.Queue()

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        self.messages.put_nowait((topic, payload, qos, retain))

    async def next(self) -> tuple[str, bytes, int, bool]:
        async with asyncio.timeout(bound(5)):
            return await self.messages.get()
