"""A connection's frame boundaries, known from its bytes as websockets' parser reads them; plain
text frames read and written in place exactly as websockets reads and writes them."""

from __future__ import annotations

import random

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import OPEN
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from gateway.net.text_frames import FrameBoundary, text_frame, unmask, whole_text_frame

# A short payload, one with a 16-bit length and one at the 16-bit length's end.
SIZES = (0, 5, 125, 126, 300, 65535)
REQUEST = (
    b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def _client_bytes(*frames: Frame) -> bytes:
    """What a client (a device) sends: masked frames."""
    client = ClientProtocol(parse_uri("ws://127.0.0.1/"), state=OPEN)
    for frame in frames:
        client.send_frame(frame)
    return b"".join(client.data_to_send())


def _opened() -> FrameBoundary:
    frames = FrameBoundary()
    frames.feed(REQUEST)
    return frames


# A message in three fragments with a ping and a pong between, lengths of every width, a
# binary message, a close: each frame, and whether a message is in progress after it.
STREAM = [
    (Frame(Opcode.TEXT, b"a" * 5), False),
    (Frame(Opcode.TEXT, b"b" * 300, fin=False), True),
    (Frame(Opcode.PING, b"are you there"), True),
    (Frame(Opcode.CONT, b"c" * 70000, fin=False), True),
    (Frame(Opcode.PONG, b""), True),
    (Frame(Opcode.CONT, b"d" * 126), False),
    (Frame(Opcode.BINARY, b"\x81\xfe\x00\x10" * 40), False),  # a payload that looks like frames
    (Frame(Opcode.TEXT, b""), False),
    (Frame(Opcode.CLOSE, b"\x03\xe8"), False),
]


def _stream() -> tuple[bytes, dict[int, bool]]:
    """The stream's bytes, and at each frame's end whether a new message may start there."""
    data, ends = b"", {0: True}
    for frame, in_message in STREAM:
        data += _client_bytes(frame)
        ends[len(data)] = not in_message
    return data, ends


@pytest.mark.parametrize("seed", range(20))
def test_frame_boundaries_are_known_in_any_cut_of_the_bytes(seed: int) -> None:
    """Cut anywhere (a header alone, a header in pieces, a payload in pieces, several frames in
    one packet), the bytes say where a new message may start: at the end of a frame that leaves
    no message in fragments, and nowhere else."""
    data, ends = _stream()
    rng = random.Random(seed)
    frames, at = _opened(), 0
    while at < len(data):
        step = rng.choice((1, 2, 3, 7, 14, 100, 5000))
        frames.feed(data[at : at + step])
        at = min(at + step, len(data))
        assert frames.between_messages == ends.get(at, False), at


def test_frame_boundaries_agree_with_websockets_parser_byte_by_byte() -> None:
    """Fed one byte at a time, as websockets' parser is, the boundary is where that parser has
    just completed a frame (and no message is in progress)."""
    data, _ = _stream()
    conn = ServerProtocol()
    frames = FrameBoundary()
    conn.receive_data(REQUEST)
    frames.feed(REQUEST)
    [request] = conn.events_received()
    conn.send_response(conn.accept(request))
    conn.data_to_send()
    in_message = False
    for index in range(len(data)):
        conn.receive_data(data[index : index + 1])
        frames.feed(data[index : index + 1])
        events = conn.events_received()
        for event in events:
            assert isinstance(event, Frame)
            if event.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                in_message = not event.fin
        assert frames.between_messages == (bool(events) and not in_message), index


def test_the_handshake_request_is_no_frame_even_in_pieces() -> None:
    """The request's bytes are not read as frames, its end found across packets; a frame
    sent right behind it, in the same packet, is."""
    frames = FrameBoundary()
    for piece in (REQUEST[:-3], REQUEST[-3:-1]):
        frames.feed(piece)
        assert not frames.between_messages
    frames.feed(REQUEST[-1:] + _client_bytes(Frame(Opcode.TEXT, b"x", fin=False)))
    assert frames.fragmented and not frames.between_messages
    frames.feed(_client_bytes(Frame(Opcode.CONT, b"y")))
    assert frames.between_messages


@pytest.mark.parametrize("size", SIZES)
def test_a_whole_masked_text_frame_is_read_as_websockets_reads_it(size: int) -> None:
    payload = ("x" * size).encode()
    data = _client_bytes(Frame(Opcode.TEXT, payload))
    assert whole_text_frame(data, 1 << 20) == payload
    reference = ServerProtocol(state=OPEN)
    reference.receive_data(data)
    [frame] = reference.events_received()
    assert isinstance(frame, Frame) and frame.data == payload


TEXT = _client_bytes(Frame(Opcode.TEXT, b'{"type":"mcp"}'))


@pytest.mark.parametrize(
    ("data", "max_size"),
    [
        (TEXT[:-1], None),  # not all of it yet
        (TEXT + TEXT, None),  # two frames
        (TEXT[:5], None),  # shorter than any masked frame
        (_client_bytes(Frame(Opcode.TEXT, b"x" * 126))[:7], None),  # a cut 16-bit length
        (_client_bytes(Frame(Opcode.TEXT, b"part", fin=False)), None),  # a first fragment
        (_client_bytes(Frame(Opcode.CONT, b"last part")), None),
        (_client_bytes(Frame(Opcode.BINARY, b"audio")), None),
        (_client_bytes(Frame(Opcode.PING, b"ping")), None),
        (_client_bytes(Frame(Opcode.CLOSE, b"\x03\xe8")), None),
        (b"\x81\x05hello", None),  # not masked: a protocol error for websockets to answer
        (_client_bytes(Frame(Opcode.TEXT, b"x" * 70000)), None),  # 64-bit length
        (_client_bytes(Frame(Opcode.TEXT, b"x" * 101)), 100),  # over the limit: 1009
        (b"\xc1\x81\0\0\0\0x", None),  # RSV1: compressed, or a protocol error
    ],
    ids=[
        "not-all-yet",
        "two-frames",
        "too-short",
        "cut-length",
        "first-fragment",
        "continuation",
        "binary",
        "ping",
        "close",
        "unmasked",
        "64-bit-length",
        "over-limit",
        "rsv1",
    ],
)
def test_anything_else_is_left_to_websockets(data: bytes, max_size: int | None) -> None:
    assert whole_text_frame(data, max_size) is None


@pytest.mark.parametrize("size", (*SIZES, 65536, 70000))
def test_a_text_frame_written_in_place_is_what_websockets_writes(size: int) -> None:
    payload = ("é" * size).encode()[:size]  # UTF-8 bytes of any length (cut or not)
    reference = ServerProtocol(state=OPEN)
    reference.send_frame(Frame(Opcode.TEXT, payload))
    assert text_frame(payload) == b"".join(reference.data_to_send())


@pytest.mark.parametrize("size", (0, 1, 3, 4, 5, 1000))
def test_unmasking_is_rfc_6455_masking(size: int) -> None:
    payload = bytes(random.Random(size).randrange(256) for _ in range(size))
    data = _client_bytes(Frame(Opcode.BINARY, payload))
    start = len(data) - size
    assert unmask(data[start:], data[start - 4 : start]) == payload
