"""The stock handshake pieces: request headers, server hello acceptance, frame decoding."""

from __future__ import annotations

import pytest

from gateway.simulator import HelloFailed
from gateway.simulator.handshake import decode_frame, request_headers, server_hello_session


def test_request_headers_follow_the_firmware_order() -> None:
    """Authorization (only with a token), then Client-Id, Device-Id, Protocol-Version."""
    assert request_headers("t", "c", "d") == [
        ("Authorization", "Bearer t"),
        ("Client-Id", "c"),
        ("Device-Id", "d"),
        ("Protocol-Version", "1"),
    ]
    assert request_headers("", "c", "d")[0] == ("Client-Id", "c")
    assert request_headers("Token abc", "c", "d")[0] == ("Authorization", "Token abc")


def test_server_hello_session_rules() -> None:
    """websocket transport sets the id, another transport is ignored, none keeps the old."""
    hello = {"type": "hello", "transport": "websocket", "session_id": "s"}
    assert server_hello_session(hello, "old") == "s"
    assert server_hello_session({**hello, "transport": "udp"}, "old") is None
    assert server_hello_session({**hello, "session_id": 5}, "old") == "old"
    with pytest.raises(HelloFailed):
        server_hello_session({"type": "hello", "transport": None}, "old")


def test_decode_frame_ignores_binary_and_garbage() -> None:
    """Only text frames holding a JSON object decode."""
    assert decode_frame('{"type":"x"}') == {"type": "x"}
    assert decode_frame(b'{"type":"x"}') is None
    assert decode_frame("nope") is None
