"""The device protocol core: xiaozhi envelopes, JSON-RPC and the MCP-client state machine.

Nothing in this package does I/O: text frames go in, events and text frames come out
(see ``DeviceProtocol``).
"""

from __future__ import annotations

from gateway.protocol.catalog import ToolCatalog, normalize_tool
from gateway.protocol.device import PROTOCOL_VERSION, DeviceProtocol, State
from gateway.protocol.envelope import (
    MalformedMessage,
    MessageTooLarge,
    check_session_id,
    decode,
    encode,
    mcp_envelope,
    new_session_id,
    salvage_error_reply,
    server_hello,
    utf8_length,
)
from gateway.protocol.events import (
    CallFailed,
    CallSucceeded,
    DeviceGoodbye,
    Event,
    HelloReceived,
    MessageDropped,
    ToolsListed,
)
from gateway.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_REQUEST_ID,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorResponse,
    IdAllocator,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    classify,
    make_error,
    make_notification,
    make_request,
    make_result,
)

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_REQUEST_ID",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "PROTOCOL_VERSION",
    "CallFailed",
    "CallSucceeded",
    "DeviceGoodbye",
    "DeviceProtocol",
    "ErrorResponse",
    "Event",
    "HelloReceived",
    "IdAllocator",
    "MalformedMessage",
    "Message",
    "MessageDropped",
    "MessageTooLarge",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "State",
    "ToolCatalog",
    "ToolsListed",
    "check_session_id",
    "classify",
    "decode",
    "encode",
    "make_error",
    "make_notification",
    "make_request",
    "make_result",
    "mcp_envelope",
    "new_session_id",
    "normalize_tool",
    "salvage_error_reply",
    "server_hello",
    "utf8_length",
]
