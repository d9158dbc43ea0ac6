"""``handshake_request`` reads a handshake as websockets' parser does, or leaves it to it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request
from websockets.streams import StreamReader

from gateway.net.handshake_request import handshake_request

HANDSHAKE = (
    b"GET /device?x=1 HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\n"
    b"connection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"sec-websocket-version: 13\r\ndevice-id: 02:00:00:00:00:01\r\n\r\n"
)


def websockets_reads(data: bytes) -> Request | None:
    """What websockets' own parser makes of ``data`` (None: it refuses it)."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    parse = Request.parse(reader.read_line)
    try:
        next(parse)
    except StopIteration as done:
        request: Request = done.value
        return request
    except Exception:
        return None
    return None  # pragma: no cover - it wanted more than a whole request


def same(ours: Request, theirs: Request) -> bool:
    return (ours.method, ours.path, ours.protocol, list(ours.headers.raw_items())) == (
        theirs.method, theirs.path, theirs.protocol, list(theirs.headers.raw_items())
    )  # fmt: skip


def test_a_plain_handshake_reads_as_websockets_reads_it() -> None:
    ours, theirs = handshake_request(HANDSHAKE), websockets_reads(HANDSHAKE)
    assert ours is not None and theirs is not None and same(ours, theirs)
    assert ours.path == "/device?x=1" and ours.headers["Device-Id"] == "02:00:00:00:00:01"


@pytest.mark.parametrize(
    "data",
    [
        HANDSHAKE.replace(b"device-id:", b"device id:"),  # not a header name
        HANDSHAKE.replace(b"device-id: 02", b"device-id: \x0002"),  # not a header value
        HANDSHAKE.replace(b"device-id:", b"content-length: 3\r\nx:"),  # a body
        HANDSHAKE.replace(b"device-id:", b"transfer-encoding: chunked\r\nx:"),
        HANDSHAKE.replace(b"HTTP/1.1", b"HTTP/2", 1),
        HANDSHAKE.replace(b"GET /device?x=1", b"GET /d\xc3\xa9vice", 1),  # not ASCII
        HANDSHAKE.replace(b"\r\nupgrade", b"\nupgrade"),  # a bare line feed
        HANDSHAKE.replace(b"GET /device", b"GET /de\nvice", 1),  # one in the request line
        HANDSHAKE.replace(b"GET /device?x=1", b"GET /" + b"d" * MAX_LINE_LENGTH, 1),
        HANDSHAKE.replace(b"02:00", b"0" * MAX_LINE_LENGTH),  # a line over the limit
        HANDSHAKE.replace(b"host:", b"x: y\r\n" * MAX_NUM_HEADERS + b"host:"),  # too many
        HANDSHAKE.replace(b"device-id: 02:00:00:00:00:01\r\n", b"broken\r\n"),
    ],
)
def test_what_websockets_would_refuse_is_left_to_it(data: bytes) -> None:
    assert handshake_request(data) is None


def test_a_request_without_headers_reads_as_websockets_reads_it() -> None:
    data = b"GET / HTTP/1.1\r\n\r\n"
    ours, theirs = handshake_request(data), websockets_reads(data)
    assert ours is not None and theirs is not None and same(ours, theirs)


def test_content_length_zero_is_no_body_for_either() -> None:
    data = HANDSHAKE.replace(b"device-id:", b"content-length: 0\r\nx:")
    ours, theirs = handshake_request(data), websockets_reads(data)
    assert ours is not None and theirs is not None and same(ours, theirs)


_LINE = st.sampled_from(
    [b"host: a", b"x-y:\tz ", b"a b: c", b"c:", b": v", b"v: \x7f", b"v: \xe9", b"n\x00: v",
     b"content-length: 0", b"content-length: 1", b"Transfer-Encoding: x", b"k: a\rb", b"x\ny: z"]
)  # fmt: skip


@given(
    start=st.sampled_from(
        [
            b"GET / HTTP/1.1",
            b"GET /a b HTTP/1.1",
            b"GET / HTTP/1.0",
            b"GET /\xff HTTP/1.1",
            b"GET  / HTTP/1.1",
            b"GET /",
        ]
    ),  # fmt: skip
    lines=st.lists(st.one_of(_LINE, st.binary(max_size=12)), max_size=6),
)
def test_any_request_reads_as_websockets_reads_it_or_is_left_to_it(
    start: bytes, lines: list[bytes]
) -> None:
    """Never a request websockets would refuse, never one that differs from its own."""
    data = b"\r\n".join([start, *lines]) + b"\r\n\r\n"
    ours = handshake_request(data)
    if ours is not None:
        theirs = websockets_reads(data)
        assert theirs is not None and same(ours, theirs)
