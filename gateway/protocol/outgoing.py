"""What the gateway, an MCP client, says to a device: its requests, and its answers.

The MCP side of each message, before ``envelope.mcp_envelope`` wraps it: the discovery requests
(``initialize``, then ``tools/list`` page by page), ``tools/call``, the cancellation of a call,
and the answers to the few requests a device may send us (docs/protocol.md §4). Which to send
and when is ``DeviceProtocol``'s business.
"""

from __future__ import annotations

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
    "initialize_params",
    "list_request",
]

JsonObject = dict[str, Any]

PROTOCOL_VERSION = "2024-11-05"
CANCELLED = "notifications/cancelled"


def initialize_params(client_info: JsonObject | None, vision: dict[str, str] | None) -> JsonObject:
    """Build the ``initialize`` params, checking now that they can be sent.

    Raises:
        LocalProtocolError: ``client_info`` or ``vision`` is not JSON.
    """
    capabilities: JsonObject = {}
    if vision is not None:
        # docs/protocol.md §4: the only way to tell a camera device where to upload photos.
        capabilities["vision"] = dict(vision)
    params: JsonObject = {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": capabilities,
        "clientInfo": dict(client_info or {"name": "esp-mcp-gateway", "version": __version__}),
    }
    try:
        envelope.encode(params)
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError(f"client_info or vision is not JSON: {exc}") from exc
    return params


def list_request(request_id: int, cursor: str | None) -> JsonObject:
    """The ``tools/list`` request for the page at ``cursor`` (the first page when None)."""
    # docs/protocol.md §4: user-only tools are listed only with withUserTools: true.
    params: JsonObject = {"withUserTools": True}
    if cursor is not None:
        params["cursor"] = cursor
    return make_request(request_id, "tools/list", params)


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
