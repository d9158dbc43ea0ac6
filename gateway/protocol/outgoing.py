"""What the gateway, an MCP client, says to a device: its requests, and its answers.

The MCP side of each message, before ``envelope.mcp_envelope`` wraps it: the discovery requests
(``initialize``, then ``tools/list`` page by page), ``tools/call``, the cancellation of a call,
and the answers to the few requests a device may send us (docs/protocol.md §4). Which to send
and when is ``DeviceProtocol``'s business.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from gateway import __version__
from gateway.errors import LocalProtocolError
from gateway.protocol import envelope
from gateway.protocol.jsonrpc import (
    METHOD_NOT_FOUND,
    Request,
    make_error,
    make_notification,
    make_request,
    make_result,
)

__all__ = [
    "PROTOCOL_VERSION",
    "answer",
    "call_request",
    "cancellation",
    "initialize_frame",
    "initialize_params",
    "list_frame",
]

JsonObject = dict[str, Any]

PROTOCOL_VERSION = "2024-11-05"
CANCELLED = "notifications/cancelled"


# Every device gets the same initialize params but for its vision block: encoded once, here.
_PARAMS_HEAD = f'{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":'
_HEX = re.compile(r"[0-9a-f]+")
_GATEWAY_INFO = envelope.encode({"name": "esp-mcp-gateway", "version": __version__})


def initialize_params(client_info: JsonObject | None, vision: dict[str, str] | None) -> str:
    """The ``initialize`` params as JSON text, checked now that they can be sent.

    Only what differs from device to device is encoded per session: the vision block (its token
    is the session's own) and a ``client_info`` other than the gateway's.

    Raises:
        LocalProtocolError: ``client_info`` or ``vision`` is not JSON.
    """
    try:
        # docs/protocol.md §4: vision is the only way to tell a camera where to upload photos.
        capabilities = "{}" if vision is None else f'{{"vision":{_vision_block(vision)}}}'
        info = _GATEWAY_INFO if not client_info else envelope.encode(dict(client_info))
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError(f"client_info or vision is not JSON: {exc}") from exc
    return f'{_PARAMS_HEAD}{capabilities},"clientInfo":{info}}}'


def _vision_block(vision: Mapping[str, str]) -> str:
    """``vision`` as JSON. The usual block (the listener's upload URL, the same for every device,
    and a session's hex token) is put together from the URL encoded once."""
    url, token = vision.get("url"), vision.get("token")
    if len(vision) == 2 and type(url) is str and type(token) is str and _HEX.fullmatch(token):
        return f'{{"url":{_json_string(url)},"token":"{token}"}}'
    return envelope.encode(dict(vision))


@functools.lru_cache(maxsize=16)
def _json_string(text: str) -> str:
    return envelope.encode(text)


# The discovery requests, sent to every device that joins, are written as frame text straight
# away: ``head`` is the session's ``envelope.mcp_head``, and the text is what encoding
# ``mcp_envelope(session_id, make_request(...))`` gives, without encoding a dict every time.


def initialize_frame(head: str, request_id: int, params: str) -> str:
    """The frame of the ``initialize`` request with ``params`` (``initialize_params``' text)."""
    return (
        f'{head}{{"jsonrpc":"2.0","id":{int(request_id)},"method":"initialize",'
        f'"params":{params}}}}}'
    )


def list_frame(head: str, request_id: int, cursor: str | None) -> str:
    """The frame of the ``tools/list`` request for the page at ``cursor`` (None: the first)."""
    # docs/protocol.md §4: user-only tools are listed only with withUserTools: true.
    at = "" if cursor is None else f',"cursor":{envelope.encode(cursor)}'
    return (
        f'{head}{{"jsonrpc":"2.0","id":{int(request_id)},"method":"tools/list",'
        f'"params":{{"withUserTools":true{at}}}}}}}'
    )


def call_request(call_id: int, name: str, arguments: JsonObject) -> JsonObject:
    """The ``tools/call`` request for tool ``name`` with ``arguments``."""
    return make_request(call_id, "tools/call", {"name": name, "arguments": arguments})


def cancellation(call_id: int, reason: str) -> JsonObject:
    """The notification that tells the device to stop call ``call_id`` and not answer it."""
    return make_notification(CANCELLED, {"requestId": call_id, "reason": reason})


def answer(request: Request) -> JsonObject:
    """Our reply to a request from the device: ``ping`` is answered, anything else unknown."""
    if request.method == "ping":
        return make_result(request.id, {})
    return make_error(request.id, METHOD_NOT_FOUND, f"Method not found: {request.method}")
