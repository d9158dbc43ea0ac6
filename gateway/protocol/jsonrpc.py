"""JSON-RPC 2.0 as the devices speak it: strict when we send, lenient when we receive.

Stock firmware reads request ids with cJSON ``valueint`` and ignores string ids, leaves ``code`` out
of its errors and may send no message at all (docs/protocol.md §4, §7.4). So the builders only
accept what a stock device understands, and ``classify`` accepts what devices actually send.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import LocalProtocolError
from gateway.protocol.envelope import MalformedMessage

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_REQUEST_ID",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "PROBE_ID",
    "ErrorResponse",
    "IdAllocator",
    "Message",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "as_integer",
    "classify",
    "make_error",
    "make_notification",
    "make_probe",
    "make_request",
    "make_result",
]

JsonObject = dict[str, Any]
RequestId = int | str

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# The device truncates ids to a C int (cJSON valueint), so ours stay within a positive int32.
MAX_REQUEST_ID = 2**31 - 1

# IdAllocator never hands out 0, so the reply to a probe can never settle a pending request.
PROBE_ID = 0

DEFAULT_ERROR_MESSAGE = "device error"


@dataclass(frozen=True, slots=True)
class Request:
    """A call that expects a reply with the same ``id``."""

    id: RequestId
    method: str
    params: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Notification:
    """A one-way message (no ``id``)."""

    method: str
    params: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    """A successful reply; ``result`` is any JSON value as sent."""

    id: RequestId
    result: object


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """An error reply; ``id`` is None when the sender could not tell which request failed."""

    id: RequestId | None
    message: str
    code: int | None = None
    data: object = None


Message = Request | Notification | Response | ErrorResponse


def _check_request_id(request_id: int) -> int:
    if type(request_id) is not int or not 1 <= request_id <= MAX_REQUEST_ID:
        raise LocalProtocolError(f"request id must be an int in 1..{MAX_REQUEST_ID}")
    return request_id


def _check_method(method: str) -> str:
    if not isinstance(method, str) or not method:
        raise LocalProtocolError("method must be a non-empty string")
    return method


def make_probe() -> JsonObject:
    """Build a ``ping`` with id ``PROBE_ID``: any answer proves the device is there.

    Stock firmware answers it with an error ("Method not implemented: ping"), our firmware with
    ``{}``; either reply reaches a session as a reply to an unknown request and is dropped, so a
    probe can be sent to a device whatever state its session is in.
    """
    return {"jsonrpc": "2.0", "id": PROBE_ID, "method": "ping"}


def make_request(request_id: int, method: str, params: JsonObject | None = None) -> JsonObject:
    """Build a request.

    Args:
        request_id: an int in ``1..MAX_REQUEST_ID`` (stock devices ignore other ids).
        method: the method name.
        params: the params object, left out when None.

    Returns:
        The JSON-RPC request object.

    Raises:
        LocalProtocolError: the id or method is not acceptable to a device.
    """
    message: JsonObject = {
        "jsonrpc": "2.0",
        "id": _check_request_id(request_id),
        "method": _check_method(method),
    }
    if params is not None:
        message["params"] = params
    return message


def make_notification(method: str, params: JsonObject | None = None) -> JsonObject:
    """Build a notification (a request without ``id``).

    Raises:
        LocalProtocolError: the method is not a non-empty string.
    """
    message: JsonObject = {"jsonrpc": "2.0", "method": _check_method(method)}
    if params is not None:
        message["params"] = params
    return message


def make_result(request_id: RequestId, result: JsonObject) -> JsonObject:
    """Build a successful reply to the request with ``request_id`` (echoed as received)."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def make_error(request_id: RequestId | None, code: int, message: str) -> JsonObject:
    """Build an error reply; ``request_id`` is None when the request's id is unknown."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def as_integer(value: object) -> int | None:
    """``value`` as an integer id or code (``3.0`` counts, as the device reads it), else None."""
    # bool is an int subclass; float ids come from senders that store every number as a double.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _parse_id(value: object) -> RequestId:
    if isinstance(value, str):
        return value
    number = as_integer(value)
    if number is None:
        raise MalformedMessage(f"invalid id: {value!r}")
    return number


def _parse_params(payload: JsonObject) -> JsonObject:
    params = payload.get("params")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise MalformedMessage("params is not an object")
    return params


def _parse_error(payload: JsonObject) -> ErrorResponse:
    raw_id = payload.get("id")
    request_id = None if raw_id is None else _parse_id(raw_id)
    error = payload["error"]
    if isinstance(error, str):
        error = {"message": error}
    elif not isinstance(error, dict):
        error = {}
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = DEFAULT_ERROR_MESSAGE
    return ErrorResponse(request_id, message, as_integer(error.get("code")), error.get("data"))


def classify(payload: object) -> Message:
    """Tell what kind of JSON-RPC message ``payload`` is.

    Lenient: ``jsonrpc`` may be missing or wrong, an error may lack ``code`` or ``message``
    (the message then reads "device error"), and an integral float id such as ``3.0`` becomes 3.

    Args:
        payload: the decoded ``payload`` of an ``mcp`` message.

    Returns:
        A ``Request``, ``Notification``, ``Response`` or ``ErrorResponse``.

    Raises:
        MalformedMessage: ``payload`` is none of these.
    """
    if not isinstance(payload, dict):
        raise MalformedMessage("JSON-RPC message is not an object")
    if "method" in payload:
        method = payload["method"]
        if not isinstance(method, str) or not method:
            raise MalformedMessage("method is not a non-empty string")
        if "id" in payload:
            return Request(_parse_id(payload["id"]), method, _parse_params(payload))
        return Notification(method, _parse_params(payload))
    # An error wins over a result: never report success for a reply that also carries an error.
    if payload.get("error") is not None:
        return _parse_error(payload)
    if "result" in payload:
        return Response(_parse_id(payload.get("id")), payload["result"])
    raise MalformedMessage("neither a request, a notification nor a response")


class IdAllocator:
    """Hands out request ids 1, 2, ... ``MAX_REQUEST_ID``, then wraps to 1, skipping ids in use;
    or the ids of a range of its own."""

    def __init__(self, first: int | None = None, *, ids: range | None = None) -> None:
        """Hand out the ids of ``ids`` (1 ... ``MAX_REQUEST_ID`` by default) from ``first``.

        Raises:
            LocalProtocolError: ``ids`` is empty or leaves ``1..MAX_REQUEST_ID``, or ``first``
                is outside ``ids``.
        """
        ids = range(1, MAX_REQUEST_ID + 1) if ids is None else ids
        if not ids or ids.step != 1:
            raise LocalProtocolError(f"not a range of request ids: {ids}")
        self._first, self._last = _check_request_id(ids[0]), _check_request_id(ids[-1])
        self._next = _check_request_id(ids[0] if first is None else first)
        if self._next not in ids:
            raise LocalProtocolError(f"the first id {first} is outside {ids}")

    def allocate(self, in_use: Collection[int] = ()) -> int:
        """Return the next id that is not in ``in_use``.

        Raises:
            LocalProtocolError: ``in_use`` claims to hold every candidate tried.
        """
        # At most len(in_use) candidates can be taken, so this many tries always find a free one.
        for _ in range(len(in_use) + 1):
            candidate = self._next
            self._next = self._first if candidate == self._last else candidate + 1
            if candidate not in in_use:
                return candidate
        raise LocalProtocolError("no free request id")
