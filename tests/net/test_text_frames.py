"""Plain text frames read and written in place: exactly websockets' reading where they apply,
and websockets' own reading of everything else."""

from __future__ import annotations

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import CLOSING, OPEN, Protocol
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from gateway.compat.websockets import frame_text, text_frame, writes_plainly

# A short payload, one with a 16-bit length and one at the 16-bit length's end.
SIZES = (0, 5, 125, 126, 300, 65535)


def _server(max_size: int | None = 1 << 20) -> ServerProtocol:
    conn = ServerProtocol(max_size=max_size)
    conn.state = OPEN  # past the handshake, as the device socket is when frames come
    conn.parser = Protocol.parse(conn)  # what ServerProtocol runs once it read the request
    next(conn.parser)
    return conn


def _client_bytes(*frames: Frame) -> bytes:
    """What a client (a device) sends: masked frames."""
    client = ClientProtocol(parse_uri("ws://127.0.0.1/"))
    client.state = OPEN
    for frame in frames:
        client.send_frame(frame)
    return b"".join(client.data_to_send())


@pytest.mark.parametrize("size", SIZES)
def test_a_whole_masked_text_frame_is_read_as_websockets_reads_it(size: int) -> None:
    payload = ("x" * size).encode()
    data = _client_bytes(Frame(Opcode.TEXT, payload))
    assert frame_text(_server(), data) == payload
    reference = _server()
    reference.receive_data(data)
    [frame] = reference.events_received()
    assert isinstance(frame, Frame) and frame.data == payload


def _fragment() -> ServerProtocol:
    conn = _server()
    conn.receive_data(_client_bytes(Frame(Opcode.TEXT, b"first part", fin=False)))
    return conn


def _buffered() -> ServerProtocol:
    conn = _server()
    conn.receive_data(_client_bytes(Frame(Opcode.TEXT, b"hello"))[:3])  # half a header
    return conn


def _closing() -> ServerProtocol:
    conn = _server()
    conn.state = CLOSING
    return conn


TEXT = _client_bytes(Frame(Opcode.TEXT, b'{"type":"mcp"}'))


def _payload_pending() -> ServerProtocol:
    """A frame's whole header (with its mask) read, its payload not yet come: the reader's
    buffer is empty, but the parser is inside a frame."""
    conn = _server()
    conn.receive_data(bytes((0x81, 0x80 | len(TEXT))) + b"\0\0\0\0")  # a zero mask
    return conn


@pytest.mark.parametrize(
    ("conn", "data"),
    [
        (_server(), TEXT[:-1]),  # not all of it yet
        (_server(), TEXT + TEXT),  # two frames
        (_server(), TEXT[:5]),  # shorter than any masked frame
        (_server(), _client_bytes(Frame(Opcode.TEXT, b"x" * 126))[:7]),  # a cut 16-bit length
        (_server(), _client_bytes(Frame(Opcode.TEXT, b"part", fin=False))),  # a first fragment
        (_server(), _client_bytes(Frame(Opcode.BINARY, b"audio"))),
        (_server(), _client_bytes(Frame(Opcode.PING, b"ping"))),
        (_server(), _client_bytes(Frame(Opcode.CLOSE, b"\x03\xe8"))),
        (_server(), b"\x81\x05hello"),  # not masked: a protocol error for websockets to answer
        (_server(1 << 20), _client_bytes(Frame(Opcode.TEXT, b"x" * 70000))),  # 64-bit length
        (_server(100), _client_bytes(Frame(Opcode.TEXT, b"x" * 101))),  # over the limit: 1009
        (_fragment(), _client_bytes(Frame(Opcode.CONT, b"last part"))),
        (_fragment(), TEXT),  # a new message while one is in progress: websockets fails it
        (_buffered(), TEXT),
        (_payload_pending(), TEXT),  # the payload of the frame begun, that looks like a frame
        (_closing(), TEXT),
    ],
    ids=[
        "not-all-yet",
        "two-frames",
        "too-short",
        "cut-length",
        "first-fragment",
        "binary",
        "ping",
        "close",
        "unmasked",
        "64-bit-length",
        "over-limit",
        "continuation",
        "new-message-in-fragment",
        "half-a-header",
        "payload-pending",
        "closing",
    ],
)
def test_anything_else_is_left_to_websockets(conn: ServerProtocol, data: bytes) -> None:
    assert frame_text(conn, data) is None


@pytest.mark.parametrize("size", (*SIZES, 65536, 70000))
def test_a_text_frame_written_in_place_is_what_websockets_writes(size: int) -> None:
    payload = ("é" * size).encode()[:size]  # UTF-8 bytes of any length (cut or not)
    reference = _server()
    reference.send_frame(Frame(Opcode.TEXT, payload))
    assert text_frame(payload) == b"".join(reference.data_to_send())


def test_frames_are_written_in_place_only_on_a_plain_open_connection() -> None:
    assert writes_plainly(_server())
    assert not writes_plainly(_closing())
    queued = _server()
    queued.send_ping(b"ping")  # not written yet: a frame written in place would pass it
    assert not writes_plainly(queued)
    fragmenting = _server()
    fragmenting.send_text(b"part", fin=False)
    fragmenting.data_to_send()
    assert not writes_plainly(fragmenting)


def test_a_payload_that_looks_like_a_frame_is_the_payload_of_the_frame_it_follows() -> None:
    """A device that writes a frame's header and its payload apart: the payload's bytes arrive
    alone. Whatever they look like, they end the frame begun, as websockets reads them."""
    conn = _payload_pending()
    assert frame_text(conn, TEXT) is None
    conn.receive_data(TEXT)
    [frame] = conn.events_received()
    assert isinstance(frame, Frame) and frame.data == TEXT  # the zero mask leaves it as sent
    assert frame_text(conn, TEXT) == b'{"type":"mcp"}'  # between frames again: read in place
