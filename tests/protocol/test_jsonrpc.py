"""Tests for gateway.protocol.jsonrpc: strict builders, lenient classification, request ids."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import LocalProtocolError
from gateway.protocol.envelope import MalformedMessage
from gateway.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_REQUEST_ID,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorResponse,
    IdAllocator,
    Notification,
    Request,
    Response,
    classify,
    make_error,
    make_notification,
    make_request,
    make_result,
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


def test_error_codes_are_the_standard_ones() -> None:
    """The constants carry the JSON-RPC 2.0 reserved codes."""
    assert (PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR) == (
        -32700,
        -32600,
        -32601,
        -32602,
        -32603,
    )


def test_make_request_builds_request() -> None:
    """A request has jsonrpc 2.0, the id, the method and the params."""
    assert make_request(1, "tools/list", {"cursor": "c"}) == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/list",
        "params": {"cursor": "c"},
    }


def test_make_request_leaves_out_missing_params() -> None:
    """Without params there is no params key."""
    assert make_request(MAX_REQUEST_ID, "ping") == {
        "jsonrpc": "2.0",
        "id": MAX_REQUEST_ID,
        "method": "ping",
    }


@pytest.mark.parametrize("request_id", [0, -1, MAX_REQUEST_ID + 1, "1", 1.0, True, None])
def test_make_request_rejects_ids_a_stock_device_ignores(request_id: Any) -> None:
    """Only ints in 1..2**31-1 are sent: the device reads ids as a C int and drops strings."""
    with pytest.raises(LocalProtocolError):
        make_request(request_id, "ping")


@pytest.mark.parametrize("method", ["", None, 5])
def test_builders_reject_non_string_method(method: Any) -> None:
    """The method must be a non-empty string."""
    with pytest.raises(LocalProtocolError):
        make_request(1, method)
    with pytest.raises(LocalProtocolError):
        make_notification(method)


def test_make_notification_has_no_id() -> None:
    """Notifications carry no id, with or without params."""
    assert make_notification("notifications/initialized") == {
        "jsonrpc": "2.0",
        "method": "notifications/initialized",
    }
    assert make_notification("n", {"a": 1}) == {"jsonrpc": "2.0", "method": "n", "params": {"a": 1}}


def test_make_result_and_make_error_echo_the_id() -> None:
    """Replies echo the request's id as received and always carry an error code."""
    assert make_result("abc", {}) == {"jsonrpc": "2.0", "id": "abc", "result": {}}
    assert make_error(3, METHOD_NOT_FOUND, "nope") == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {"code": -32601, "message": "nope"},
    }
    assert make_error(None, PARSE_ERROR, "bad")["id"] is None


def test_classify_request() -> None:
    """A method with an id is a request; params default to an empty object."""
    assert classify({"jsonrpc": "2.0", "id": 4, "method": "ping"}) == Request(4, "ping", {})
    assert classify({"id": "x", "method": "m", "params": {"a": 1}}) == Request("x", "m", {"a": 1})


def test_classify_notification() -> None:
    """A method without an id is a notification."""
    message = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": None}
    assert classify(message) == Notification("notifications/tools/list_changed", {})


def test_classify_response_tolerates_missing_jsonrpc() -> None:
    """A result without a jsonrpc member is still a response, whatever the result holds."""
    assert classify({"id": 2, "result": {"tools": []}}) == Response(2, {"tools": []})
    assert classify({"jsonrpc": "1.0", "id": 2, "result": None}) == Response(2, None)


def test_classify_turns_integral_float_id_into_int() -> None:
    """An id of 3.0 is the id 3."""
    message = classify({"jsonrpc": "2.0", "id": 3.0, "result": {}})
    assert message == Response(3, {})
    assert type(message.id) is int  # type: ignore[union-attr]


def test_classify_stock_error_without_code() -> None:
    """Stock firmware sends no error code; code is then None."""
    message = {"jsonrpc": "2.0", "id": 5, "error": {"message": "Missing valid argument: x"}}
    assert classify(message) == ErrorResponse(5, "Missing valid argument: x", None)


def test_classify_error_with_code_and_data() -> None:
    """Code (even as an integral float) and data are kept."""
    message = {"id": 1, "error": {"code": -32601.0, "message": "no", "data": [1]}}
    assert classify(message) == ErrorResponse(1, "no", -32601, [1])


@pytest.mark.parametrize(
    "error",
    [{}, {"message": ""}, {"message": 5}, {"code": True}, {"code": 1.5}, [], 7, False],
)
def test_classify_error_defaults_message_and_code(error: object) -> None:
    """A missing or empty message reads "device error"; an unusable code becomes None."""
    reply = classify({"jsonrpc": "2.0", "id": 1, "error": error})
    assert reply == ErrorResponse(1, "device error", None)


def test_classify_error_given_as_string() -> None:
    """An error that is a bare string is used as the message."""
    assert classify({"id": 1, "error": "boom"}) == ErrorResponse(1, "boom", None)


def test_classify_error_without_id() -> None:
    """An error with a null or missing id (e.g. a parse error) has id None."""
    assert classify({"id": None, "error": {"message": "x"}}) == ErrorResponse(None, "x")
    assert classify({"error": {"message": "x"}}) == ErrorResponse(None, "x")


def test_classify_error_wins_over_result() -> None:
    """A reply with both an error and a result is an error."""
    reply = classify({"id": 1, "result": {}, "error": {"message": "x"}})
    assert isinstance(reply, ErrorResponse)


def test_classify_null_error_with_result_is_a_response() -> None:
    """A null error next to a result (JSON-RPC 1.0 style) is a success."""
    assert classify({"id": 1, "result": {}, "error": None}) == Response(1, {})


@pytest.mark.parametrize(
    "payload",
    [
        [],
        "x",
        None,
        {},
        {"jsonrpc": "2.0"},
        {"method": 5},
        {"method": ""},
        {"method": "m", "id": None},
        {"method": "m", "id": True},
        {"method": "m", "id": 1.5},
        {"method": "m", "id": [1]},
        {"method": "m", "params": [1, 2]},
        {"id": 1, "method": "m", "params": "x"},
        {"result": {}},
        {"id": {}, "result": {}},
        {"id": 1.5, "error": {"message": "x"}},
    ],
)
def test_classify_rejects_what_is_no_json_rpc_message(payload: object) -> None:
    """Anything that is no request, notification or response raises MalformedMessage."""
    with pytest.raises(MalformedMessage):
        classify(payload)


@given(JSON)
def test_classify_only_ever_raises_malformed_message(payload: object) -> None:
    """Any JSON value either classifies or raises MalformedMessage."""
    try:
        classify(payload)
    except MalformedMessage:
        pass


def test_id_allocator_counts_from_one() -> None:
    """Ids start at 1 and go up by one."""
    ids = IdAllocator()
    assert [ids.allocate() for _ in range(3)] == [1, 2, 3]


def test_id_allocator_wraps_after_int32_max() -> None:
    """After 2**31-1 the next id is 1 again (stock firmware reads ids as a C int)."""
    ids = IdAllocator(MAX_REQUEST_ID - 1)
    assert [ids.allocate() for _ in range(3)] == [MAX_REQUEST_ID - 1, MAX_REQUEST_ID, 1]


def test_id_allocator_skips_ids_in_use() -> None:
    """Ids still waiting for a reply are not handed out again after a wrap."""
    ids = IdAllocator(MAX_REQUEST_ID)
    assert ids.allocate({1, 2}) == MAX_REQUEST_ID
    assert ids.allocate({1, 2}) == 3


def test_id_allocator_keeps_to_its_range() -> None:
    """A range of its own (a session beside a voice server) wraps inside the range."""
    ids = IdAllocator(ids=range(0x4000_0000, 0x4000_0003))
    got = [ids.allocate({0x4000_0001}) for _ in range(3)]
    assert got == [0x4000_0000, 0x4000_0002, 0x4000_0000]
    for bad in (range(5, 5), range(1, 9, 2), range(1, MAX_REQUEST_ID + 2), range(0, 3)):
        with pytest.raises(LocalProtocolError):
            IdAllocator(ids=bad)
    with pytest.raises(LocalProtocolError, match="outside"):
        IdAllocator(9, ids=range(1, 5))


@pytest.mark.parametrize("first", [0, MAX_REQUEST_ID + 1])
def test_id_allocator_rejects_bad_start(first: int) -> None:
    """The first id must itself be valid."""
    with pytest.raises(LocalProtocolError):
        IdAllocator(first)


class _Everything:
    """A collection that claims to hold every id while reporting one element."""

    def __len__(self) -> int:
        return 1

    def __contains__(self, item: object) -> bool:
        return True

    def __iter__(self) -> Any:
        return iter([1])


def test_id_allocator_gives_up_when_every_tried_id_is_in_use() -> None:
    """An in_use collection that holds every candidate raises instead of looping forever."""
    with pytest.raises(LocalProtocolError):
        IdAllocator().allocate(_Everything())
