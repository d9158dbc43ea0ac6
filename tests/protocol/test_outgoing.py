"""Tests for gateway.protocol.outgoing: the discovery requests, written as frame text, and the
frames of an Outbox: what encoding each message whole gives."""

from __future__ import annotations

import json
import logging

import pytest

from gateway import __version__
from gateway.errors import LocalProtocolError
from gateway.protocol import envelope
from gateway.protocol.jsonrpc import make_request
from gateway.protocol.outbox import Outbox
from gateway.protocol.outgoing import (
    PROTOCOL_VERSION,
    initialize_frame,
    initialize_params,
    list_frame,
)

HEAD = envelope.mcp_head("s-1")

VISION = {"url": "http://gw.local:8765/vision/explain", "token": "per-session-token"}


@pytest.mark.parametrize(
    ("client_info", "vision", "capabilities", "info"),
    [
        (None, None, {}, {"name": "esp-mcp-gateway", "version": __version__}),
        (None, VISION, {"vision": VISION}, {"name": "esp-mcp-gateway", "version": __version__}),
        (
            {"name": "ünï", "version": "2"},
            VISION,
            {"vision": VISION},
            {"name": "ünï", "version": "2"},
        ),
    ],
)
def test_the_initialize_frame_is_what_encoding_the_request_gives(
    client_info: dict[str, str] | None,
    vision: dict[str, str] | None,
    capabilities: dict[str, object],
    info: dict[str, str],
) -> None:
    """The pieces encoded once make the same frame, byte for byte, as encoding it all."""
    params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": capabilities, "clientInfo": info}
    whole = envelope.encode(envelope.mcp_envelope("s-1", make_request(3, "initialize", params)))
    frame = initialize_frame(HEAD, 3, initialize_params(client_info, vision))
    assert frame == whole and json.loads(frame)["payload"]["params"] == params


@pytest.mark.parametrize(
    "url",
    [
        "http://192.168.1.20:8765/vision/explain",
        'http://gw.local/"quoted"\\back\u2028line',
        "http://gätewäy.local/vision/explain",
        "http://gw.local/\ud800",  # a lone surrogate: only valid escaped
    ],
)
def test_a_session_vision_block_means_what_encoding_it_gives(url: str) -> None:
    """The usual block, a hex token and the upload URL encoded once, is valid JSON with the
    same meaning as encoding the dict, and can be sent (UTF-8), whatever the URL holds."""
    vision = {"url": url, "token": envelope.new_session_id()}
    for _ in range(2):  # the URL's text the second time comes from the cache
        frame = initialize_frame(HEAD, 3, initialize_params(None, vision))
        frame.encode("utf-8")
        assert json.loads(frame)["payload"]["params"]["capabilities"] == {"vision": vision}
    if url.isascii():  # and byte for byte what encoding it whole gives
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {"vision": vision},
                  "clientInfo": {"name": "esp-mcp-gateway", "version": __version__}}  # fmt: skip
        request = make_request(3, "initialize", params)
        assert frame == envelope.encode(envelope.mcp_envelope("s-1", request))


@pytest.mark.parametrize(
    "vision",
    [{"url": 1.0, "token": "ab"}, {"url": "u", "token": 12}, {"url": "u", "token": "ab", "x": "y"}],
)
def test_an_unusual_vision_block_is_encoded_as_it_is(vision: dict[str, object]) -> None:
    """Values that are not strings, or more keys, take the general path: the same meaning."""
    text = initialize_params(None, vision)  # type: ignore[arg-type]
    assert json.loads(text)["capabilities"] == {"vision": vision}


def test_params_that_are_not_json_are_refused_at_once() -> None:
    with pytest.raises(LocalProtocolError, match="not JSON"):
        initialize_params({"name": object()}, None)
    with pytest.raises(LocalProtocolError, match="not JSON"):
        initialize_params(None, {"url": float("nan")})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "cursor", [None, "", "self.led_strip.set_effect", 'a"b\\c\n', "ünï\u2028", "x\ud800"]
)
def test_a_page_request_is_what_encoding_the_request_gives(cursor: str | None) -> None:
    """Byte for byte, for any cursor a device may send (a lone surrogate: only valid escaped)."""
    params: dict[str, object] = {"withUserTools": True}
    if cursor is not None:
        params["cursor"] = cursor
    whole = envelope.encode(envelope.mcp_envelope("s-1", make_request(7, "tools/list", params)))
    frame = list_frame(HEAD, 7, cursor)
    assert frame == whole and json.loads(frame)["payload"]["params"] == params
    frame.encode("utf-8")


@pytest.mark.parametrize(
    "payload",
    [
        make_request(9, "tools/call", {"name": "self.ä", "arguments": {"text": "x\ud800"}}),
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}},
    ],
)
def test_an_outbox_frames_a_message_as_encoding_its_envelope_gives(
    payload: dict[str, object],
) -> None:
    outbox = Outbox("s-1", logging.getLogger("test"))
    frame = outbox.encode_mcp(payload)
    assert frame == envelope.encode(envelope.mcp_envelope("s-1", payload))
    assert json.loads(frame) == {"session_id": "s-1", "type": "mcp", "payload": payload}


def test_an_unsafe_session_id_never_reaches_a_frame() -> None:
    for unsafe in ('s"1', "", "s 1", "s\u00e91"):
        with pytest.raises(LocalProtocolError):
            envelope.mcp_head(unsafe)
        with pytest.raises(LocalProtocolError):
            Outbox(unsafe, logging.getLogger("test"))
