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


def test_params_that_are_not_json_are_refused_at_once() -> None:
    with pytest.raises(LocalProtocolError, match="not JSON"):
        initialize_params({"name": object()}, None)
    with pytest.raises(LocalProtocolError, match="not JSON"):
        initialize_params(None, {"url": float("nan")})  # type: ignore[dict-item]


def test_an_unsafe_session_id_never_reaches_a_frame() -> None:
    with pytest.raises(LocalProtocolError):
        initialize_frame('s"1', 1, initialize_params(None, None))
