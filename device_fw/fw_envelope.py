"""xiaozhi envelopes and JSON-RPC messages (docs/protocol.md 1.1, 4).

Every message on the link is a JSON object: {"session_id","type","payload"} for MCP, and the
hello that opens a WebSocket session. This module builds and reads them; it does no I/O and
needs only json, so it can be copied to a board alone together with fw_mcp.py.
"""

import json

# JSON-RPC 2.0 error codes (stock firmware sends none; ours does unless told to act stock).
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TOOL_FAILED = -32000

# The device hello, sent right after the WebSocket upgrade (docs/protocol.md 1).
HELLO = {
    "type": "hello",
    "version": 1,
    "features": {"mcp": True},
    "transport": "websocket",
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}


class ToolError(Exception):
    """A failure the caller reads: a JSON-RPC error carrying ``message``."""

    def __init__(self, message, code=TOOL_FAILED):
        super().__init__(message)
        self.message = message
        self.code = code


try:
    # CPython escapes non-ASCII by default; a board (and cJSON) sends UTF-8 as is. Keeping
    # UTF-8 on both runtimes makes tools/list pages split at the same place everywhere.
    json.dumps("", ensure_ascii=False)
    _UTF8 = {"ensure_ascii": False}
except TypeError:
    _UTF8 = {}


def dumps(value):
    """Serialise compactly, as cJSON_PrintUnformatted does."""
    return json.dumps(value, separators=(",", ":"), **_UTF8)


def decode(text):
    """Return the JSON object in ``text``, or None for anything else (garbage, arrays)."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def mcp(session_id, payload):
    """Return the text of an MCP envelope carrying ``payload``."""
    return dumps({"session_id": session_id, "type": "mcp", "payload": payload})


def result(request_id, value):
    """Return a JSON-RPC result."""
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id, message, code=None):
    """Return a JSON-RPC error; ``code`` None leaves it out, as stock firmware does."""
    body = {"message": message}
    if code is not None:
        body["code"] = code
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def notification(method):
    """Return a JSON-RPC notification without params."""
    return {"jsonrpc": "2.0", "method": method}


def server_session(hello, current):
    """Return the session id a server hello leaves us with, or None to ignore the hello.

    A hello for another transport is ignored; one without a string session_id keeps
    ``current`` (docs/protocol.md 1, "Server hello").
    """
    if hello.get("transport") != "websocket":
        return None
    session_id = hello.get("session_id")
    return session_id if isinstance(session_id, str) else current
