"""A WebSocket handshake parsed once: which first bytes skip h11, and that they still upgrade."""

from __future__ import annotations

import asyncio

import h11
import pytest
from websockets.asyncio.client import connect

from gateway.net.upgrade import websocket_upgrade
from tests.conftest import bound
from tests.net.test_limits import LIMITS, answered, opened, serving

HANDSHAKE = (
    b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: WebSocket\r\n"
    b"Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\nDevice-Id: 02:00:00:00:00:01\r\n\r\n"
)


def test_a_whole_handshake_comes_back_with_its_header_names_in_lower_case() -> None:
    """ASGI wants lower-case names (the device route looks up ``device-id``); values are kept."""
    request = websocket_upgrade(HANDSHAKE)
    assert request is not None
    assert request.split(b"\r\n")[0] == b"GET /echo HTTP/1.1"
    assert b"device-id: 02:00:00:00:00:01\r\n" in request
    assert b"upgrade: WebSocket\r\n" in request
    assert request.endswith(b"\r\n\r\n") and request.lower() == HANDSHAKE.lower()


@pytest.mark.parametrize(
    "data",
    [
        HANDSHAKE[:-2],  # the headers have not ended yet
        HANDSHAKE + b"\x81\x00",  # bytes after the request
        HANDSHAKE.replace(b"GET", b"POST", 1),
        HANDSHAKE.replace(b"Upgrade: WebSocket", b"Upgrade: h2c"),
        HANDSHAKE.replace(b"keep-alive, Upgrade", b"keep-alive"),  # no upgrade token
        HANDSHAKE.replace(b"Upgrade: WebSocket\r\n", b""),
        HANDSHAKE.replace(b"Device-Id: 02:00:00:00:00:01", b"Device-Id"),  # no header line
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
def test_anything_but_one_whole_websocket_handshake_is_left_to_h11(data: bytes) -> None:
    assert websocket_upgrade(data) is None


class Reads(list[bytes]):
    """What the listener gave h11 to parse, chunk by chunk; ``arrived`` is set at each."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()


@pytest.fixture
def h11_reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    """Every chunk h11 is given from now on."""
    chunks = Reads()
    receive = h11.Connection.receive_data

    def counted(self: h11.Connection, data: bytes) -> None:
        chunks.append(bytes(data))
        chunks.arrived.set()
        receive(self, data)

    monkeypatch.setattr(h11.Connection, "receive_data", counted)
    return chunks


@pytest.mark.anyio
async def test_a_handshake_in_one_piece_never_reaches_h11(h11_reads: Reads) -> None:
    """Each joining device is parsed once, by the WebSocket protocol, not twice."""
    async with serving(LIMITS) as (port, guard):
        for n in range(3):
            async with connect(f"ws://127.0.0.1:{port}/echo") as ws, asyncio.timeout(bound(5)):
                await ws.send(f"m{n}")
                assert await ws.recv() == f"m{n}"
                assert guard.unauthenticated == {}  # accepted: its slot authenticated
        assert h11_reads == []
        reader, writer = await opened(port)  # plain HTTP still goes through h11
        assert await answered(reader, writer)
        writer.close()
        assert h11_reads != []


@pytest.mark.anyio
async def test_a_handshake_in_pieces_still_upgrades_through_h11(h11_reads: Reads) -> None:
    async with serving(LIMITS) as (port, _):
        reader, writer = await opened(port, HANDSHAKE[:40])
        async with asyncio.timeout(bound(5)):
            await h11_reads.arrived.wait()  # the first piece was read alone
        writer.write(HANDSHAKE[40:])
        await writer.drain()
        async with asyncio.timeout(bound(5)):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        writer.close()
    assert b"".join(h11_reads).lower() == HANDSHAKE.lower()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("bad", "statuses"),
    [
        (HANDSHAKE.replace(b"Device-Id:", b"Device Id:"), {b"400"}),  # not a header name
        (HANDSHAKE.replace(b"Device-Id:", b"Content-Length: 3\r\nX:"), {b"400"}),  # a body
        # websockets (17 and later) reads HTTP/1.0, then its handshake answers 505
        (HANDSHAKE.replace(b"HTTP/1.1", b"HTTP/1.0", 1), {b"505"}),
    ],
)
async def test_a_handshake_the_websocket_parser_refuses_is_answered_at_once(
    bad: bytes, statuses: set[bytes]
) -> None:
    """What h11 no longer checks first gets its refusal from the WebSocket parser (a 400, as
    h11 would answer), and the connection closes then, not at the authentication deadline."""
    async with serving(LIMITS) as (port, guard):
        reader, writer = await opened(port, bad)
        async with asyncio.timeout(bound(5)):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head[9:12] in statuses, head
            body = await reader.read()  # then it closes
            if head.startswith(b"HTTP/1.1 400"):
                assert body == b"Invalid HTTP request received."
        writer.close()
        await guard.until(0)
