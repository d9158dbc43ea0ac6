"""What a stock device sends and accepts when it opens its WebSocket (xiaozhi-protocol.md §1).

Pure functions and constants; :mod:`gateway.simulator.device` does the I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TypeAlias

from .cjson import JsonObject, loads_object
from .errors import HelloFailed

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "HELLO",
    "HELLO_TIMEOUT",
    "MAX_FRAME",
    "decode_frame",
    "request_headers",
    "server_hello_session",
]

logger = logging.getLogger(__name__)
Log: TypeAlias = "logging.Logger | logging.LoggerAdapter[logging.Logger]"

#: The device hello, sent right after the 101 (§1 "Device hello").
HELLO: JsonObject = {
    "type": "hello",
    "version": 1,
    "features": {"mcp": True},
    "transport": "websocket",
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}
#: Seconds a stock device allows for the upgrade and for the server hello (§1).
HANDSHAKE_TIMEOUT = 10.0
HELLO_TIMEOUT = 10.0
#: esp-ml307 cannot send a frame above 64 KiB; the channel dies instead (§7.3).
MAX_FRAME = 65535


def request_headers(token: str | None, client_id: str, device_id: str) -> list[tuple[str, str]]:
    """Return the upgrade request's extra headers, in the firmware's order (a std::map's)."""
    headers: list[tuple[str, str]] = []
    if token:
        # Stock firmware sends a token that already contains a space verbatim.
        headers.append(("Authorization", token if " " in token else f"Bearer {token}"))
    headers += [("Client-Id", client_id), ("Device-Id", device_id), ("Protocol-Version", "1")]
    return headers


def server_hello_session(
    hello: Mapping[str, object], current: str, log: Log = logger
) -> str | None:
    """Return the session id a server hello leaves the device with, or None if it is ignored.

    A stock device ignores a hello whose transport is not ``"websocket"`` (and so times out),
    and keeps ``current`` when the hello has no string ``session_id``.

    Raises:
        HelloFailed: the hello has no string ``transport``, on which a stock device crashes.
    """
    transport = hello.get("transport")
    if not isinstance(transport, str):
        # §1 and §7.1: the firmware dereferences NULL here.
        raise HelloFailed("a server hello without a string transport crashes a stock device")
    if transport != "websocket":
        log.warning("ignoring a server hello with transport %r", transport)
        return None
    session_id = hello.get("session_id")
    if isinstance(session_id, str):
        return session_id
    log.warning("server hello without a session_id; keeping %r", current)
    return current


def decode_frame(frame: str | bytes, log: Log = logger) -> JsonObject | None:
    """Parse a text frame into a JSON object; binary frames (audio) and garbage give None."""
    if isinstance(frame, bytes):
        return None
    message = loads_object(frame)
    if message is None:
        log.warning("dropping a text frame that is not a JSON object")
    return message
