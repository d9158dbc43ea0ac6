"""Tests for gateway.protocol.outgoing: the initialize request, encoded once but per session."""

from __future__ import annotations

import json

import pytest

from gateway import __version__
from gateway.errors import LocalProtocolError
from gateway.protocol import envelope
from gateway.protocol.jsonrpc import make_request
from gateway.protocol.outgoing import PROTOCOL_VERSION, initialize_frame, initialize_params

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
    frame = initialize_frame("s-1", 3, initialize_params(client_info, vision))
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
        frame = initialize_frame("s-1", 3, initialize_params(None, vision))
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


def test_an_unsafe_session_id_never_reaches_a_frame() -> None:
    with pytest.raises(LocalProtocolError):
        initialize_frame('s"1', 1, initialize_params(None, None))
