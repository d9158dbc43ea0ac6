"""``DeviceSocket`` on a bare guarded uvicorn listener, with an echo endpoint in place of the
device route: messages pulled rather than pushed, keepalive pings, shutdown."""

from __future__ import annotations

import asyncio
import struct

import pytest
from websockets.asyncio.client import connect

from gateway.device_side.transports.device_socket import DeviceSocket
from gateway.device_side.transports.websocket import DeviceSockets
from tests.conftest import bound
from tests.device_side.transports.test_device_socket import CLOSE, PING, TEXT, Peer, frame
from tests.net.test_limits import LIMITS, opened, serving

pytestmark = pytest.mark.anyio

HANDSHAKE = (
    b"GET /device HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def echo(socket: DeviceSocket) -> None:
    """Accept, then send each message back, pulled one by one (as the cluster bridge reads)."""
    if socket.accept():
        async for text in socket:
            await socket.send(text)


SOCKETS = DeviceSockets({"/device"}, echo)


async def test_pulled_messages_come_in_order_and_end_with_the_close() -> None:
    async with serving(LIMITS, SOCKETS) as (port, guard):
        async with connect(f"ws://127.0.0.1:{port}/device") as ws, asyncio.timeout(bound(5)):
            for n in range(20):  # more than wait before reading pauses
                await ws.send(f"m{n}")
            assert [await ws.recv() for _ in range(20)] == [f"m{n}" for n in range(20)]
            assert guard.unauthenticated == {}  # accepted: its slot authenticated
        await guard.until(0)


async def test_a_pong_keeps_a_device_and_a_missing_one_drops_it_with_1011() -> None:
    settings = {"ws_ping_interval": 0.1, "ws_ping_timeout": 0.2}
    async with serving(LIMITS, SOCKETS, **settings) as (port, guard):
        reader, writer = await opened(port, HANDSHAKE)
        device = Peer(reader, writer)
        assert (await device.head()).startswith(b"HTTP/1.1 101")
        async with asyncio.timeout(bound(5)):
            first, payload = await reader.readexactly(2)
            assert first & 0x0F == PING
            ping = await reader.readexactly(payload & 0x7F)
        await device.send(frame(0xA, ping))  # answered: the next ping comes
        await device.send(frame(TEXT, b"still here"))
        assert await device.frame() == (TEXT, b"still here")
        async with asyncio.timeout(bound(5)):
            first, payload = await reader.readexactly(2)
            assert first & 0x0F == PING  # this one goes unanswered
            await reader.readexactly(payload & 0x7F)
        opcode, reason = await device.frame()
        assert (opcode, reason[:2]) == (CLOSE, struct.pack("!H", 1011))
        await device.closed()
        writer.close()
        await guard.until(0)


async def test_shutdown_closes_an_open_device_with_1012() -> None:
    async with serving(LIMITS, SOCKETS) as (port, _):
        reader, writer = await opened(port, HANDSHAKE)
        device = Peer(reader, writer)
        assert (await device.head()).startswith(b"HTTP/1.1 101")
    opcode, reason = await device.frame()  # the listener stopped on leaving ``serving``
    assert (opcode, reason[:2]) == (CLOSE, struct.pack("!H", 1012))
    writer.close()


async def test_a_path_it_does_not_serve_goes_to_the_asgi_app() -> None:
    async with serving(LIMITS, SOCKETS) as (port, _):
        async with connect(f"ws://127.0.0.1:{port}/echo") as ws, asyncio.timeout(bound(5)):
            await ws.send("through ASGI")
            assert await ws.recv() == "through ASGI"
