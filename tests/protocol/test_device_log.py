"""A device's logging notifications become its events: strings in, events out."""

from __future__ import annotations

import json
from typing import Any

from gateway.protocol.device import DeviceProtocol, State
from gateway.protocol.device_log import CUT_MARK, MAX_DATA_CHARS, MAX_DEPTH, device_logged
from gateway.protocol.events import DeviceLogged, MessageDropped

SID = "sid-1"


def ready(protocol: DeviceProtocol) -> DeviceProtocol:
    """Discovery done with no tools: the session is READY."""
    protocol.start_discovery()
    for request_id, result in ((1, {}), (2, {"tools": []})):
        reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
        protocol.receive_text(json.dumps({"session_id": SID, "type": "mcp", "payload": reply}))
    protocol.events_received()
    assert protocol.state is State.READY
    return protocol


def logged(params: Any, *, state: str = "ready") -> list[object]:
    protocol = DeviceProtocol("dev-1", session_id=SID)
    if state == "ready":
        ready(protocol)
    protocol.data_to_send()
    message = {"jsonrpc": "2.0", "method": "notifications/message", "params": params}
    protocol.receive_text(json.dumps({"session_id": SID, "type": "mcp", "payload": message}))
    assert protocol.data_to_send() == []  # a notification is never answered
    return list(protocol.events_received())


def test_logging_notification_becomes_an_event() -> None:
    """``notifications/message`` in the envelope yields DeviceLogged with its fields."""
    params = {"level": "info", "logger": "button", "data": {"pressed": True}}
    assert logged(params) == [DeviceLogged("info", "button", {"pressed": True})]


def test_event_before_discovery_is_an_event_too() -> None:
    """A device may speak up before its tools are listed (MQTT at boot)."""
    assert logged({"level": "notice", "data": 21.5}, state="connected") == [
        DeviceLogged("notice", "", 21.5)
    ]


def test_bad_logging_notifications_are_dropped_with_a_reason() -> None:
    """No params, an unknown level or a bad logger: dropped, the session goes on."""
    assert device_logged([1]) == MessageDropped("logging notification without params")
    assert logged(None) == [
        MessageDropped("logging notification with an unknown level", {"level": "None"})
    ]
    assert logged({"level": "loud", "data": 1}) == [
        MessageDropped("logging notification with an unknown level", {"level": "loud"})
    ]
    for bad in (7, "x" * 65):
        assert logged({"level": "info", "logger": bad}) == [
            MessageDropped("logging notification with a logger that is not a short string")
        ]


def test_deep_data_is_cut_at_the_bound_with_a_marker() -> None:
    """Arrays and objects nested past MAX_DEPTH are replaced by the cut marker."""
    deep: object = "bottom"
    for _ in range(MAX_DEPTH + 3):
        deep = {"in": [deep]}
    event = device_logged({"level": "info", "logger": "x", "data": deep})
    assert isinstance(event, DeviceLogged) and event.cut
    text = json.dumps(event.data)
    assert CUT_MARK in text and "bottom" not in text
    bare = text.replace(CUT_MARK, "")
    assert bare.count("[") + bare.count("{") == MAX_DEPTH


def test_huge_data_is_cut_to_an_excerpt_that_says_so() -> None:
    """Data longer than MAX_DATA_CHARS as JSON becomes an excerpt with the cut marker."""
    event = device_logged({"level": "warning", "data": ["y" * 10_000]})
    assert isinstance(event, DeviceLogged) and event.cut
    assert isinstance(event.data, str) and event.data.startswith('["yyy')
    assert CUT_MARK in event.data and "10004 characters" in event.data
    assert len(event.data) < MAX_DATA_CHARS + 100


def test_small_data_is_kept_whole() -> None:
    """Data within the bounds is kept as sent, not marked."""
    data = {"t": [1, 2, {"c": "d"}], "ok": None}
    assert device_logged({"level": "debug", "data": data}) == DeviceLogged("debug", "", data)
