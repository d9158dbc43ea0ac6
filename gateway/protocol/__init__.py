"""The device protocol core: xiaozhi envelopes, JSON-RPC and the MCP-client state machine.

Nothing in this package does I/O: text frames go in, events and text frames come out
(see ``DeviceProtocol``).
"""

from __future__ import annotations

from gateway.protocol.catalog import ToolCatalog
from gateway.protocol.device import DeviceProtocol, State
from gateway.protocol.envelope import (
    MalformedMessage,
    MessageTooLarge,
    check_session_id,
    check_udp_block,
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
    DiscoveryTimedOut,
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
    PROBE_ID,
    ErrorResponse,
    IdAllocator,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    as_integer,
    classify,
    make_error,
    make_notification,
    make_probe,
    make_request,
    make_result,
)
from gateway.protocol.outgoing import PROTOCOL_VERSION

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_REQUEST_ID",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "PROBE_ID",
    "PROTOCOL_VERSION",
    "CallFailed",
    "CallSucceeded",
    "DeviceGoodbye",
    "DeviceProtocol",
    "DiscoveryTimedOut",
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
    "as_integer",
    "check_session_id",
    "check_udp_block",
    "classify",
    "decode",
    "encode",
    "make_error",
    "make_notification",
    "make_probe",
    "make_request",
    "make_result",
    "mcp_envelope",
    "new_session_id",
    "salvage_error_reply",
    "server_hello",
    "utf8_length",
]
