"""Frames as devices write them, to ``DeviceSocket`` on a real listener with an echo endpoint:
what the device gets back, whether a frame is read in place or by websockets."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from websockets.asyncio.client import connect

from gateway.device_side.transports.device_socket import DeviceSocket
from tests.conftest import bound
from tests.device_side.transports.test_device_socket import (
    BINARY,
    CLOSE,
    CONT,
    PING,
    TEXT,
    Peer,
    frame,
)
from tests.device_side.transports.test_device_socket_wire import HANDSHAKE, SOCKETS
from tests.net.test_limits import LIMITS, opened, serving

pytestmark = pytest.mark.anyio

PONG = 0xA
MESSAGE = json.dumps({"type": "mcp", "payload": {"text": "x" * 200}}).encode()


class Reads:
    """How many packets the device sockets have read; ``read(n)`` waits for the n-th."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def arrived(self) -> None:
        self.count += 1
        self._changed.set()

    async def read(self, count: int) -> None:
        async with asyncio.timeout(bound(5)):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Each packet a device socket reads from now on: a test sends its next one once the socket
    read the last, so that each arrives alone, as a device wrote it."""
    seen = Reads()
    received = DeviceSocket.data_received

    def counted(self: DeviceSocket, data: bytes) -> None:
        received(self, data)
        seen.arrived()

    monkeypatch.setattr(DeviceSocket, "data_received", counted)
    yield seen


@asynccontextmanager
async def device(**settings: int) -> AsyncIterator[Peer]:
    """A raw device, its handshake accepted by a listener that echoes each text message."""
    async with serving(LIMITS, SOCKETS, **settings) as (port, _):
        reader, writer = await opened(port, HANDSHAKE)
        peer = Peer(reader, writer)
        try:
            assert (await peer.head()).startswith(b"HTTP/1.1 101")
            yield peer
        finally:
            writer.close()


async def sent_apart(peer: Peer, reads: Reads, *packets: bytes) -> None:
    """Send ``packets`` one by one, each once the socket read the one before."""
    start = reads.count
    for index, packet in enumerate(packets):
        await peer.send(packet)
        await reads.read(start + index + 1)


def masked(opcode: int, payload: bytes, key: bytes) -> tuple[bytes, bytes]:
    """A client frame's header (with its mask ``key``), and its payload masked by it."""
    head = bytes([0x80 | opcode]) + (
        bytes([0x80 | len(payload)])
        if len(payload) < 126
        else bytes([0x80 | 126]) + struct.pack("!H", len(payload))
    )
    body = bytes(byte ^ key[index % 4] for index, byte in enumerate(payload))
    return head + key, body


async def test_a_header_and_its_payload_sent_apart_are_one_message(reads: Reads) -> None:
    """esp_websocket_client writes a frame's header and its payload in two writes."""
    async with device() as peer:
        head, body = masked(TEXT, MESSAGE, b"\x12\x34\x56\x78")
        await sent_apart(peer, reads, head, body)
        assert await peer.frame() == (TEXT, MESSAGE)
        await sent_apart(peer, reads, head[:1], head[1:3], head[3:], body[:10], body[10:])
        assert await peer.frame() == (TEXT, MESSAGE)


async def test_a_payload_that_looks_like_a_whole_frame_is_the_payload_of_its_frame(
    reads: Reads,
) -> None:
    """A payload arriving alone whose masked bytes read as one whole masked text frame (a
    16-bit length, a mask, the rest): it is the end of the frame begun, not a frame."""
    size = len(MESSAGE)
    looks_like = bytes([0x81, 0x80 | 126]) + struct.pack("!H", size - 8)
    key = bytes(a ^ b for a, b in zip(MESSAGE[:4], looks_like, strict=True))
    head, body = masked(TEXT, MESSAGE, key)
    assert body[:4] == looks_like  # a whole text frame of size - 8 bytes, masked
    async with device() as peer:
        await sent_apart(peer, reads, head, body)
        assert await peer.frame() == (TEXT, MESSAGE)
        await sent_apart(peer, reads, head + body)  # and read in place once whole
        assert await peer.frame() == (TEXT, MESSAGE)


async def test_fragments_with_a_ping_between_each_alone_are_one_message(reads: Reads) -> None:
    """Fragments arriving alone, the last a whole final frame (a continuation, never read in
    place as a text frame); a ping between them is answered at once."""
    third = len(MESSAGE) // 3
    async with device() as peer:
        await sent_apart(
            peer,
            reads,
            frame(TEXT, MESSAGE[:third], fin=False),
            frame(PING, b"still there?"),
            frame(CONT, MESSAGE[third : 2 * third], fin=False),
        )
        assert await peer.frame() == (PONG, b"still there?")
        await sent_apart(peer, reads, frame(CONT, MESSAGE[2 * third :]))
        assert await peer.frame() == (TEXT, MESSAGE)
        await sent_apart(peer, reads, frame(BINARY, b"opus", fin=False), frame(CONT, b"audio"))
        await sent_apart(peer, reads, frame(TEXT, b"after the audio"))
        assert await peer.frame() == (TEXT, b"after the audio")  # the audio was not kept


async def test_a_whole_text_frame_inside_a_fragmented_message_fails_it_with_1002(
    reads: Reads,
) -> None:
    """A new text message while one is in fragments is a protocol error (RFC 6455 5.4), even
    when it arrives alone and whole."""
    async with device() as peer:
        await sent_apart(peer, reads, frame(TEXT, b"first part", fin=False))
        await peer.send(frame(TEXT, MESSAGE))
        opcode, reason = await peer.frame()
        assert (opcode, reason[:2]) == (CLOSE, struct.pack("!H", 1002))
        await peer.closed()


async def test_frames_in_one_packet_and_a_frame_across_two_come_in_order(reads: Reads) -> None:
    first, second = frame(TEXT, b"one"), frame(TEXT, MESSAGE)
    async with device() as peer:
        await sent_apart(peer, reads, first + second[:9], second[9:] + first)
        assert [await peer.frame() for _ in range(3)] == [
            (TEXT, b"one"),
            (TEXT, MESSAGE),
            (TEXT, b"one"),
        ]


async def test_an_unmasked_frame_fails_the_websocket_with_1002() -> None:
    """RFC 6455 5.1: a server must close on a frame that a client did not mask."""
    async with device() as peer:
        await peer.send(b"\x81\x05hello")
        opcode, reason = await peer.frame()
        assert (opcode, reason[:2]) == (CLOSE, struct.pack("!H", 1002))
        await peer.closed()


@pytest.mark.parametrize(
    "oversize",
    [
        frame(TEXT, b"x" * 1001),
        frame(TEXT, b"x" * 600, fin=False) + frame(CONT, b"x" * 600),
        frame(TEXT, length=70000),  # a 64-bit length, refused from its header
    ],
    ids=["one-frame", "fragments", "64-bit-length"],
)
async def test_a_message_over_the_size_limit_fails_with_1009(oversize: bytes) -> None:
    async with device(ws_max_size=1000) as peer:
        await peer.send(frame(TEXT, b"x" * 1000))  # at the limit: read
        assert await peer.frame() == (TEXT, b"x" * 1000)
        await peer.send(oversize)
        opcode, reason = await peer.frame()
        assert (opcode, reason[:2]) == (CLOSE, struct.pack("!H", 1009))
        await peer.closed()


@pytest.mark.parametrize("size", [0, 125, 126, 300, 65535, 65536, 70000])
async def test_every_length_width_goes_both_ways_with_a_websockets_client(size: int) -> None:
    """7-, 16- and 64-bit lengths, from a real websockets client (no compression: the frames
    are plain), echoed whole."""
    text = "é" * (size // 2) + "x" * (size % 2)
    async with serving(LIMITS, SOCKETS) as (port, guard):
        url = f"ws://127.0.0.1:{port}/device"
        async with connect(url, compression=None) as ws, asyncio.timeout(bound(5)):
            await ws.send(text)
            assert await ws.recv() == text
            await ws.send([text[: size // 4], text[size // 4 :]])  # in two fragments
            assert await ws.recv() == text
        await guard.until(0)
