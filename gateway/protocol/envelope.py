"""The xiaozhi message envelope: one JSON object per text frame, ``{"session_id", "type", ...}``.

MCP JSON-RPC travels inside it as ``{"session_id": S, "type": "mcp", "payload": <JSON-RPC>}`` in
both directions (docs/protocol.md §1.1, §4). This module only frames and unframes; no I/O.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

from gateway.errors import LocalProtocolError

__all__ = [
    "MalformedMessage",
    "MessageTooLarge",
    "check_session_id",
    "check_udp_block",
    "decode",
    "encode",
    "mcp_envelope",
    "mcp_head",
    "result_text",
    "new_session_id",
    "parse_json",
    "salvage_error_reply",
    "server_hello",
    "stock_reply_id",
    "too_large",
    "utf8_length",
]

JsonObject = dict[str, Any]

# docs/protocol.md §1 "Server hello": the downlink audio the device should expect.
_AUDIO_PARAMS = {"format": "opus", "sample_rate": 24000, "channels": 1, "frame_duration": 60}

# docs/protocol.md §7.2: the device concatenates the session id into its JSON unescaped.
_SESSION_ID = re.compile(r"[A-Za-z0-9-]+")

# docs/protocol.md §2 "Hello": udp.key and udp.nonce are exactly 16 bytes, hex-encoded.
_HEX_16_BYTES = re.compile(r"[0-9A-Fa-f]{32}")

# docs/protocol.md §4 "Errors", §7.2: stock firmware builds MCP error replies by string
# concatenation without escaping the message, so a quote in it makes the frame invalid JSON.
_UNESCAPED_ERROR_REPLY = re.compile(
    r'\s*\{\s*(?:"session_id"\s*:\s*"(?P<session>[^"\\]*)"\s*,\s*)?'
    r'"type"\s*:\s*"mcp"\s*,\s*"payload"\s*:\s*\{\s*'
    r'"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*(?P<id>\d{1,10})\s*,\s*'
    r'"error"\s*:\s*\{\s*"message"\s*:\s*"(?P<message>.*)"\s*\}\s*\}\s*\}\s*',
    re.DOTALL,
)


# The head of a reply framed as stock firmware (and ours) frames it (``result_text``), up to its
# id: at most 10 digits, so that reading it costs nothing whatever the frame holds.
_STOCK_REPLY_HEAD = re.compile(
    r'\{"session_id":"[A-Za-z0-9-]*","type":"mcp",'
    r'"payload":\{"jsonrpc":"2\.0","id":(0|[1-9][0-9]{0,9}),"(?:result|error)":'
)

# strict=False: the device copies raw control characters (e.g. newlines) into strings. One decoder
# for every frame: json.loads makes a new one per call when given an option.
_DECODER = json.JSONDecoder(strict=False)
# Made once: ``json.dumps`` with any option makes a new encoder for every frame.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ASCII_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class MalformedMessage(ValueError):
    """A device frame is not a usable message; the text says why."""


class MessageTooLarge(MalformedMessage):
    """A device frame is longer than the configured limit."""


def utf8_length(text: str) -> int:
    """Return the length of ``text`` in UTF-8 bytes (lone surrogates count as three bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def parse_json(text: str) -> Any:
    """Parse device JSON as every frame is parsed (raw control characters allowed in strings).

    Raises:
        ValueError: ``text`` is not one JSON value.
        RecursionError: it nests too deeply.
    """
    return _DECODER.decode(text)


def too_large(text: str, max_bytes: int) -> bool:
    """Whether ``text`` is longer than ``max_bytes`` in UTF-8 bytes."""
    # The character count decides without encoding, but between its bounds: every character
    # takes 1 to 4 bytes, and an ASCII string (isascii costs nothing) has one a character. A
    # frame comes here just decoded (or goes on to be encoded to be sent): encoding it once
    # more only to measure it doubled the UTF-8 work of every message that was not ASCII.
    chars = len(text)
    if chars > max_bytes:
        return True
    if chars * 4 <= max_bytes or text.isascii():
        return False
    return utf8_length(text) > max_bytes


def decode(text: str, max_bytes: int) -> JsonObject:
    """Parse one device frame into its message object.

    Args:
        text: the text frame as received.
        max_bytes: the largest accepted frame, in UTF-8 bytes.

    Returns:
        The message object; its ``type`` is a string.

    Raises:
        MessageTooLarge: the frame is longer than ``max_bytes``.
        MalformedMessage: the frame is not JSON, not an object, or has no string ``type``.
    """
    if too_large(text, max_bytes):
        raise MessageTooLarge(f"frame longer than {max_bytes} bytes")
    try:
        message = parse_json(text)
    except (ValueError, RecursionError) as exc:
        raise MalformedMessage("invalid JSON") from exc
    if not isinstance(message, dict):
        raise MalformedMessage("not a JSON object")
    if not isinstance(message.get("type"), str):
        raise MalformedMessage("missing or non-string type")
    return message


def result_text(text: str, session_id: object, request_id: object) -> str | None:
    """The raw text of the ``result`` of an ``mcp`` reply framed exactly as stock firmware does.

    Stock firmware (and ours) frames a reply as
    ``{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":N,"result":R}}``. When
    ``text`` is that frame for this session id and request id, what follows the fixed head
    decides the parsed ``result`` alone, so ``R`` may stand for it: two frames with equal ``R``
    carry equal results, whatever their session and id. Any other framing gives None.

    Args:
        text: the frame as received (it parsed as JSON).
        session_id: the ``session_id`` the frame carried.
        request_id: the ``id`` of the reply in its ``payload``.
    """
    if not isinstance(session_id, str) or not (
        session_id == "" or _SESSION_ID.fullmatch(session_id)  # nothing to escape in it
    ):
        return None
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        return None
    head = (
        f'{{"session_id":"{session_id}","type":"mcp",'
        f'"payload":{{"jsonrpc":"2.0","id":{request_id},"result":'
    )
    if not (text.startswith(head) and text.endswith("}}")):
        return None
    return text[len(head) : -2]


def stock_reply_id(text: str) -> int | None:
    """The request id of a reply framed as stock firmware frames it, read from the frame's head
    without parsing it; None for any other frame (which only a parse can tell).

    The id is the first one the frame names: a frame that names its id again later (a repeated
    key, which a parse takes instead) gets a different one from a parse. Whoever routes by this
    id must keep such a lie to the device that tells it (its own calls).
    """
    head = _STOCK_REPLY_HEAD.match(text)
    return None if head is None else int(head[1])


def salvage_error_reply(text: str) -> JsonObject | None:
    """Rebuild a stock MCP error reply whose message was not JSON-escaped.

    Args:
        text: a frame that ``decode`` rejected as invalid JSON.

    Returns:
        The equivalent well-formed ``mcp`` message, or None if ``text`` is not such a reply.
    """
    match = _UNESCAPED_ERROR_REPLY.fullmatch(text)
    if match is None:
        return None
    payload = {
        "jsonrpc": "2.0",
        "id": int(match["id"]),
        "error": {"message": match["message"]},
    }
    return {"session_id": match["session"] or "", "type": "mcp", "payload": payload}


def encode(message: object) -> str:
    """Serialise a message object (or any JSON value) into one compact text frame.

    Args:
        message: the message object.

    Returns:
        The frame text, without insignificant whitespace and with non-ASCII kept as is; it is
        always encodable as UTF-8.

    Raises:
        TypeError: ``message`` holds something that is not JSON.
        ValueError: ``message`` holds NaN or infinity, or refers to itself.
    """
    text = _ENCODER.encode(message)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (e.g. echoed from a device's "\ud800") is only valid escaped.
            text = _ASCII_ENCODER.encode(message)
    return text


def check_session_id(session_id: str) -> str:
    """Return ``session_id`` if it is safe to give a stock device.

    Raises:
        LocalProtocolError: it is empty or has characters outside ``[A-Za-z0-9-]``.
    """
    if not isinstance(session_id, str) or _SESSION_ID.fullmatch(session_id) is None:
        raise LocalProtocolError(f"session id must match [A-Za-z0-9-]+: {session_id!r}")
    return session_id


def mcp_head(session_id: str) -> str:
    """The text every MCP frame of ``session_id`` starts with, up to its payload: the frame is
    this, the payload's JSON and ``}`` (what ``encode(mcp_envelope(session_id, payload))``
    gives, without encoding the envelope for every message).

    Raises:
        LocalProtocolError: ``session_id`` cannot be sent to a device (``check_session_id``):
            once checked, nothing in it needs escaping.
    """
    return f'{{"session_id":"{check_session_id(session_id)}","type":"mcp","payload":'


def mcp_envelope(session_id: str, payload: JsonObject) -> JsonObject:
    """Wrap a JSON-RPC message for the device.

    Args:
        session_id: our session id.
        payload: the JSON-RPC request, notification or response.

    Returns:
        ``{"session_id": session_id, "type": "mcp", "payload": payload}``.

    Raises:
        LocalProtocolError: the session id is unsafe (see ``check_session_id``).
    """
    return {"session_id": check_session_id(session_id), "type": "mcp", "payload": payload}


def server_hello(
    session_id: str, transport: str, udp: Mapping[str, object] | None = None
) -> JsonObject:
    """Build the server's answer to a device ``hello``.

    Args:
        session_id: our session id.
        transport: ``"websocket"`` or ``"udp"``, echoing the device's transport.
        udp: over MQTT, the audio channel offered to the device (see ``check_udp_block``).

    Returns:
        The hello message, announcing 24 kHz / 60 ms Opus downlink audio.

    Raises:
        LocalProtocolError: the session id is unsafe, ``transport`` is not a non-empty string,
            or ``udp`` is not a block a stock device accepts.
    """
    # docs/protocol.md §1 "Server hello": a missing or non-string transport crashes the device.
    if not isinstance(transport, str) or not transport:
        raise LocalProtocolError(f"hello transport must be a non-empty string: {transport!r}")
    hello: JsonObject = {
        "type": "hello",
        "transport": transport,
        "session_id": check_session_id(session_id),
        "audio_params": _AUDIO_PARAMS.copy(),
    }
    if udp is not None:
        hello["udp"] = check_udp_block(udp)
    return hello


def check_udp_block(udp: Mapping[str, object]) -> JsonObject:
    """Return a copy of the ``udp`` block of an MQTT hello reply if a stock device accepts it.

    docs/protocol.md §2: a reply whose ``udp.server`` is not a string, ``udp.port`` not a
    number in 1..65535, or ``udp.key``/``udp.nonce`` not 16 bytes of hex is silently ignored, and
    the device gives up on the conversation after 10 s.

    Raises:
        LocalProtocolError: one of the four fields is missing or wrong.
    """
    server, port = udp.get("server"), udp.get("port")
    if not isinstance(server, str) or not server:
        raise LocalProtocolError(f"udp.server must be a non-empty string: {server!r}")
    if type(port) is not int or not 1 <= port <= 65535:
        raise LocalProtocolError(f"udp.port must be an int in 1..65535: {port!r}")
    block: JsonObject = {"server": server, "port": port}
    for name in ("key", "nonce"):
        value = udp.get(name)
        if not isinstance(value, str) or _HEX_16_BYTES.fullmatch(value) is None:
            raise LocalProtocolError(f"udp.{name} must be 32 hex digits: {value!r}")
        block[name] = value
    return block


def new_session_id() -> str:
    """Return a fresh session id made of ``[0-9a-f]`` only (32 characters)."""
    return secrets.token_hex(16)  # as random as uuid4's 122 bits, a third of its cost a join
