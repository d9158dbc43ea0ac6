"""The device WebSocket's handshake, read once by websockets' parser: counted, and checked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import websockets.http11
from websockets.asyncio.client import connect

from tests.conftest import bound
from tests.device_side.transports.test_device_socket import TEXT, Peer, frame
from tests.device_side.transports.test_device_socket_wire import HANDSHAKE, SOCKETS
from tests.net.test_limits import LIMITS, opened, serving
from tests.net.test_upgrade import Reads, h11_reads  # noqa: F401 - a fixture

pytestmark = pytest.mark.anyio


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The request lines websockets' own parser reads from now on (one per parse)."""
    seen: list[bytes] = []
    parse = websockets.http11.Request.parse.__func__  # type: ignore[attr-defined]

    def counted(cls: type[websockets.http11.Request], read_line):  # type: ignore[no-untyped-def]
        request = yield from parse(cls, read_line)
        seen.append(request.path.encode())
        return request

    monkeypatch.setattr(websockets.http11.Request, "parse", classmethod(counted))
    yield seen


async def test_a_whole_handshake_is_parsed_once_by_websockets(parses: list[bytes]) -> None:
    """Each joining device's request is read by websockets' parser alone, once (no h11); the
    socket works as ever (messages both ways, permessage-deflate when the device offers it)."""
    async with serving(LIMITS, SOCKETS) as (port, guard):
        for n in range(3):
            async with connect(f"ws://127.0.0.1:{port}/device") as ws, asyncio.timeout(bound(5)):
                await ws.send(f"m{n}" * 100)
                assert await ws.recv() == f"m{n}" * 100
                assert [e.name for e in ws.protocol.extensions] == ["permessage-deflate"]
        await guard.until(0)
    assert parses == [b"/device"] * 3


async def test_a_handshake_in_pieces_is_read_by_h11_then_by_websockets(
    parses: list[bytes],
    h11_reads: Reads,  # noqa: F811 - the fixture imported above
) -> None:
    """The h11 path (a request in pieces) writes the request back out as bytes, which
    websockets' parser reads once."""
    async with serving(LIMITS, SOCKETS) as (port, guard):
        reader, writer = await opened(port, HANDSHAKE[:40])
        async with asyncio.timeout(bound(5)):
            await h11_reads.arrived.wait()  # the first piece was read alone
        device = Peer(reader, writer)
        await device.send(HANDSHAKE[40:])
        assert (await device.head()).startswith(b"HTTP/1.1 101")
        await device.send(frame(TEXT, b"hello"))
        assert await device.frame() == (TEXT, b"hello")
        writer.close()
        await guard.until(0)
    assert h11_reads and parses == [b"/device"]


@pytest.mark.parametrize(
    ("bad", "statuses"),
    [
        (HANDSHAKE.replace(b"Host:", b"Bad Name: x\r\nHost:"), {b"400"}),
        (HANDSHAKE.replace(b"Host:", b"Content-Length: 3\r\nHost:"), {b"400"}),  # a body
        (HANDSHAKE.replace(b"Host:", b"Transfer-Encoding: chunked\r\nHost:"), {b"400"}),
        (HANDSHAKE.replace(b"HTTP/1.1", b"HTTP/1.0", 1), {b"400", b"505"}),
        (HANDSHAKE.replace(b"Host:", b"X: " + b"y" * 9000 + b"\r\nHost:"), {b"400", b"431"}),
        (HANDSHAKE.replace(b"Host:", b"X: y\r\n" * 130 + b"Host:"), {b"400", b"431"}),
        (
            HANDSHAKE.replace(b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8"),
            {b"400", b"426"},
        ),
        (HANDSHAKE.replace(b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b""), {b"400"}),
    ],
)
async def test_a_bad_device_handshake_gets_websockets_answer_and_closes(
    bad: bytes, statuses: set[bytes]
) -> None:
    """A handshake websockets refuses is answered as websockets answers it, then closed; the
    listener serves the next device."""
    async with serving(LIMITS, SOCKETS) as (port, guard):
        reader, writer = await opened(port, bad)
        async with asyncio.timeout(bound(5)):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head[9:12] in statuses, head
            await reader.read()  # then it closes
        writer.close()
        async with connect(f"ws://127.0.0.1:{port}/device") as ws, asyncio.timeout(bound(5)):
            await ws.send("next")
            assert await ws.recv() == "next"
        await guard.until(0)
