"""The firmware's WebSocket client (fw_ws) against the websockets library's server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode

from device_fw import fw_ws
from device_fw.fw_http import parse_url
from device_fw.fw_ws import HandshakeError, connect
from tests.conftest import bound

pytestmark = pytest.mark.anyio

Handler = Callable[[ServerConnection], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler, **options: Any) -> AsyncIterator[str]:
    """A websockets server on a free port; yields its ws:// URL."""
    async with serve(handler, "127.0.0.1", 0, **options) as running:
        port = running.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/xiaozhi/v1/"


async def echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


def test_urls_are_parsed_with_default_ports() -> None:
    """ws:// defaults to 80, wss:// to 443 with TLS; the path defaults to /."""
    ws = ("ws", "wss")
    assert parse_url("ws://gw.lan:8765/xiaozhi/v1/", ws) == (False, "gw.lan", 8765, "/xiaozhi/v1/")
    assert parse_url("wss://gw.lan/x", ws) == (True, "gw.lan", 443, "/x")
    assert parse_url("ws://[::1]:81", ws) == (False, "::1", 81, "/")
    assert parse_url("https://gw.lan/vision") == (True, "gw.lan", 443, "/vision")
    with pytest.raises(ValueError, match="not a ws:// URL"):
        parse_url("http://gw.lan/", ws)
    with pytest.raises(ValueError, match="not a http:// URL"):
        parse_url("ws://gw.lan/")


async def test_masked_text_frames_cross_both_ways_with_headers_sent() -> None:
    """The server (which refuses unmasked client frames) echoes text, big and small; the
    request carries our headers after the standard ones and the Host with its port."""
    seen: dict[str, Any] = {}

    async def record(ws: ServerConnection) -> None:
        assert ws.request is not None
        seen["headers"] = ws.request.headers
        await echo(ws)

    async with server(record) as url:
        ws = await connect(url, [("Device-Id", "aa:bb"), ("Protocol-Version", "1")])
        for text in ("hé", "x" * 200, "y" * 65_000):
            await ws.send(text)
            async with asyncio.timeout(bound(5)):
                assert await ws.recv() == text
        await ws.close()
    headers = seen["headers"]
    assert headers["Device-Id"] == "aa:bb" and headers["Protocol-Version"] == "1"
    assert headers["Host"] == url.split("/")[2]


async def test_pings_are_answered_and_fragments_joined() -> None:
    """A server ping gets its pong; a message sent in fragments arrives whole; binary as bytes."""
    pong: list[float] = []

    async def talk(ws: ServerConnection) -> None:
        pong.append(await asyncio.wait_for(await ws.ping(b"hi"), bound(5)))
        await ws.send(["frag", "ment", "ed"])
        await ws.send(b"\x00opus")
        await echo(ws)

    async with server(talk) as url:
        ws = await connect(url)
        async with asyncio.timeout(bound(5)):
            assert await ws.recv() == "fragmented"
            assert await ws.recv() == b"\x00opus"
        await ws.close()
    assert pong and pong[0] >= 0


async def test_a_server_close_ends_recv_and_is_echoed() -> None:
    """The server's close frame makes recv() return None; the server sees our echo (1000)."""
    codes: list[int | None] = []

    async def close(ws: ServerConnection) -> None:
        await ws.close(1001, "going away")
        codes.append(ws.close_code)

    async with server(close) as url:
        ws = await connect(url)
        async with asyncio.timeout(bound(5)):
            assert await ws.recv() is None
    assert ws.closed and codes == [1001]


async def test_an_oversize_message_closes_with_1009() -> None:
    """A message over 64 KiB (in one frame or in fragments) closes the connection."""
    closed: list[int | None] = []

    async def flood(ws: ServerConnection) -> None:
        await ws.send(["a" * 40_000, "b" * 40_000])
        try:
            await ws.wait_closed()
        finally:
            closed.append(ws.close_code)

    async with server(flood) as url:
        ws = await connect(url)
        async with asyncio.timeout(bound(5)):
            assert await ws.recv() is None
    assert closed == [1009]


async def test_silence_past_the_timeout_means_a_dead_peer() -> None:
    """With ``timeout`` set, recv() gives up (None) when no frame arrives in time."""
    hold = asyncio.Event()

    async def silent(ws: ServerConnection) -> None:
        await hold.wait()

    async with server(silent) as url:
        ws = await connect(url)
        ws.timeout = 0.05
        async with asyncio.timeout(bound(5)):
            assert await ws.recv() is None
        hold.set()
    assert ws.closed
    with pytest.raises(OSError):
        await ws.send("too late")


async def test_a_refused_upgrade_raises_handshake_error_with_the_status() -> None:
    """HTTP 403 instead of 101 is HandshakeError(403)."""

    def refuse(connection: ServerConnection, request: Any) -> Any:
        return connection.respond(403, "no\n")

    async with server(echo, process_request=refuse) as url:
        with pytest.raises(HandshakeError) as refused:
            await connect(url)
    assert refused.value.status == 403


async def test_a_wrong_accept_key_is_refused() -> None:
    """A 101 whose Sec-WebSocket-Accept does not match our key is not a WebSocket."""

    done = asyncio.Event()

    async def fake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: no\r\n\r\n")
            await writer.drain()
            await reader.read()  # until the client gives up
        finally:
            writer.close()
            done.set()

    listener = await asyncio.start_server(fake, "127.0.0.1", 0)
    async with listener:
        port = listener.sockets[0].getsockname()[1]
        with pytest.raises(HandshakeError, match="Sec-WebSocket-Accept"):
            await connect(f"ws://127.0.0.1:{port}/")
        async with asyncio.timeout(bound(5)):
            await done.wait()


async def test_invalid_utf8_text_closes_with_1007() -> None:
    """A text frame that is not UTF-8 ends the connection (RFC 6455 8.1)."""
    closed: list[int | None] = []

    async def garbage(ws: ServerConnection) -> None:
        ws.protocol.send_frame(Frame(Opcode.TEXT, b"\xff\xfe"))
        ws.send_data()
        try:
            await ws.wait_closed()
        finally:
            closed.append(ws.close_code)

    async with server(garbage) as url:
        ws = await connect(url)
        async with asyncio.timeout(bound(5)):
            assert await ws.recv() is None
    assert closed and closed[0] in (1007, 1002)


def test_masking_round_trips() -> None:
    """XOR masking with a 4-byte key is its own inverse, for any length."""
    key = b"\x01\x02\x03\x04"
    for size in (0, 1, 5, 126, 65_536):
        data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        assert fw_ws._mask(fw_ws._mask(data, key), key) == data
    assert fw_ws._mask(b"\x00\x00\x00\x00\x00", key) == b"\x01\x02\x03\x04\x01"
