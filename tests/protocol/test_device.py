"""Tests for gateway.protocol.device: DeviceProtocol, strings in, events and strings out."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import __version__
from gateway.errors import DeviceBusy, InvalidState, LocalProtocolError
from gateway.protocol import envelope
from gateway.protocol.device import RELIST_INTERVAL, DeviceProtocol, State
from gateway.protocol.events import (
    CallFailed,
    CallSucceeded,
    DeviceGoodbye,
    DiscoveryTimedOut,
    HelloReceived,
    MessageDropped,
    ToolsListed,
)
from gateway.protocol.jsonrpc import IdAllocator

SID = "test-session"
CLIENT = {"name": "test-gateway", "version": "1.2.3"}
HELLO = {
    "type": "hello",
    "version": 1,
    "features": {"mcp": True},
    "transport": "websocket",
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}
SERVER_INFO = {"name": "bread-compact-wifi", "version": "2.4.2"}
INIT_RESULT = {
    "protocolVersion": "2024-11-05",
    "capabilities": {"tools": {}},
    "serverInfo": SERVER_INFO,
}
TOOL_A = {"name": "a", "description": "A", "inputSchema": {"type": "object", "properties": {}}}
TOOL_B = {"name": "b", "description": "B", "inputSchema": {"type": "object", "properties": {}}}
RESULT = {"content": [{"type": "text", "text": "true"}], "isError": False}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


# Helpers: build a protocol, speak as the device, read what the gateway sent.


class Clock:
    """The time the protocol reads: the test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(**kwargs: Any) -> DeviceProtocol:
    kwargs.setdefault("client_info", CLIENT)
    return DeviceProtocol("dev-1", session_id=SID, **kwargs)


def mcp(payload: Any, session_id: str = SID) -> str:
    return json.dumps({"session_id": session_id, "type": "mcp", "payload": payload})


def reply(protocol: DeviceProtocol, request_id: Any, result: Any) -> None:
    protocol.receive_text(mcp({"jsonrpc": "2.0", "id": request_id, "result": result}))


def fail(protocol: DeviceProtocol, request_id: Any, error: Any) -> None:
    protocol.receive_text(mcp({"jsonrpc": "2.0", "id": request_id, "error": error}))


def notify(protocol: DeviceProtocol, method: str = "notifications/tools/list_changed") -> None:
    protocol.receive_text(mcp({"jsonrpc": "2.0", "method": method}))


def sent(protocol: DeviceProtocol) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in protocol.data_to_send()]


def payloads(protocol: DeviceProtocol) -> list[dict[str, Any]]:
    frames = sent(protocol)
    assert all(f.keys() == {"session_id", "type", "payload"} for f in frames), frames
    assert all(f["session_id"] == SID and f["type"] == "mcp" for f in frames), frames
    return [frame["payload"] for frame in frames]


def list_request(request_id: int, cursor: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"withUserTools": True}
    if cursor is not None:
        params["cursor"] = cursor
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params}


def listing(**kwargs: Any) -> DeviceProtocol:
    """A protocol that said hello, got its initialize reply and waits for page 1 (id 2)."""
    protocol = make(**kwargs)
    protocol.receive_text(json.dumps(HELLO))
    reply(protocol, 1, INIT_RESULT)
    protocol.data_to_send()
    protocol.events_received()
    assert protocol.state is State.LISTING
    return protocol


def ready(**kwargs: Any) -> DeviceProtocol:
    """A protocol that finished discovery with TOOL_A and TOOL_B; its next request id is 3."""
    protocol = listing(**kwargs)
    reply(protocol, 2, {"tools": [TOOL_A, TOOL_B]})
    protocol.events_received()
    assert protocol.state is State.READY
    return protocol


def dropped(protocol: DeviceProtocol) -> list[str]:
    events = protocol.events_received()
    assert all(isinstance(event, MessageDropped) for event in events), events
    return [event.reason for event in events]  # type: ignore[union-attr]


# Hello and discovery.


def test_hello_is_answered_at_once_then_initialize_is_sent() -> None:
    """A device hello gets the server hello first, then initialize; HelloReceived is emitted."""
    protocol = make()
    protocol.receive_text(json.dumps(HELLO))
    frames = sent(protocol)
    assert frames[0] == {
        "type": "hello",
        "transport": "websocket",
        "session_id": SID,
        "audio_params": {
            "format": "opus",
            "sample_rate": 24000,
            "channels": 1,
            "frame_duration": 60,
        },
    }
    assert frames[1] == {
        "session_id": SID,
        "type": "mcp",
        "payload": {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": CLIENT},
        },
    }
    assert len(frames) == 2
    assert protocol.events_received() == [HelloReceived(HELLO)]
    assert protocol.state is State.INITIALIZING


def test_beside_a_voice_server_hello_is_not_answered_and_ids_keep_to_their_range() -> None:
    """A proxied device's voice server answers its hello; the gateway's ids are its own."""
    protocol = make(answer_hello=False, request_ids=range(0x4000_0000, 0x6000_0000))
    protocol.receive_text(json.dumps(HELLO))
    frames = sent(protocol)
    assert [f["payload"]["method"] for f in frames] == ["initialize"]
    assert frames[0]["payload"]["id"] == 0x4000_0000
    assert protocol.events_received() == [HelloReceived(HELLO)]
    reply = {"jsonrpc": "2.0", "id": 0x4000_0000, "result": {}}
    protocol.receive_text(json.dumps({"type": "mcp", "payload": reply}))
    assert sent(protocol)[0]["payload"]["id"] == 0x4000_0001  # tools/list


def test_hello_reply_carries_the_configured_transport_as_a_string() -> None:
    """Over MQTT the hello answers with transport "udp" (a string, or a stock device crashes)."""
    protocol = make(transport="udp")
    protocol.receive_text('{"type":"hello","version":3,"transport":"udp"}')
    assert sent(protocol)[0]["transport"] == "udp"


def test_construction_rejects_what_a_device_cannot_take() -> None:
    """Unsafe session ids, non-string transports and non-JSON client info are refused early."""
    with pytest.raises(LocalProtocolError):
        DeviceProtocol("d", session_id='a"b')
    with pytest.raises(LocalProtocolError):
        DeviceProtocol("d", transport=None)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        DeviceProtocol("d", client_info={"name": object()})


def test_default_session_id_is_fresh_and_plain() -> None:
    """Without a session id, each protocol gets a fresh one made of [A-Za-z0-9-]."""
    first, second = DeviceProtocol("d"), DeviceProtocol("d")
    assert first.session_id != second.session_id
    assert re.fullmatch(r"[A-Za-z0-9-]+", first.session_id)
    assert make().session_id == SID


def test_initialize_carries_default_client_info_and_vision() -> None:
    """clientInfo names the gateway by default; vision goes into capabilities."""
    vision = {"url": "http://gw.local/vision", "token": "t"}
    protocol = DeviceProtocol("d", session_id=SID, vision=vision)
    protocol.start_discovery()
    params = payloads(protocol)[0]["params"]
    assert params["clientInfo"] == {"name": "esp-mcp-gateway", "version": __version__}
    assert params["capabilities"] == {"vision": vision}


def test_discovery_lists_tools_and_becomes_ready() -> None:
    """initialize, then tools/list with withUserTools, then READY with ToolsListed."""
    protocol = make()
    protocol.receive_text(json.dumps(HELLO))
    protocol.data_to_send()
    protocol.events_received()
    reply(protocol, 1, INIT_RESULT)
    assert payloads(protocol) == [list_request(2)]
    assert protocol.state is State.LISTING
    reply(protocol, 2, {"tools": [TOOL_A, TOOL_B]})
    assert protocol.events_received() == [ToolsListed((TOOL_A, TOOL_B), SERVER_INFO, True)]
    assert protocol.state is State.READY
    assert protocol.data_to_send() == []


def test_second_hello_is_answered_without_restarting_discovery() -> None:
    """Stock devices say hello per conversation: each is answered, discovery runs once."""
    protocol = ready()
    protocol.receive_text(json.dumps(HELLO))
    frames = sent(protocol)
    assert [frame["type"] for frame in frames] == ["hello"]
    assert protocol.events_received() == [HelloReceived(HELLO)]
    assert protocol.state is State.READY


def test_hello_during_discovery_does_not_restart_it() -> None:
    """A hello while listing is answered and the listing carries on."""
    protocol = listing()
    protocol.receive_text(json.dumps(HELLO))
    assert [frame["type"] for frame in sent(protocol)] == ["hello"]
    assert protocol.state is State.LISTING


def test_start_discovery_without_hello() -> None:
    """start_discovery() (MQTT, hello timeout) sends initialize; it is a no-op afterwards."""
    protocol = make()
    protocol.start_discovery()
    assert payloads(protocol)[0]["method"] == "initialize"
    assert protocol.state is State.INITIALIZING
    protocol.start_discovery()
    assert protocol.data_to_send() == []


def test_initialize_error_still_lists_tools() -> None:
    """initialize is optional on stock devices: an error reply goes on to tools/list."""
    protocol = make()
    protocol.start_discovery()
    protocol.data_to_send()
    fail(protocol, 1, {"message": "Method not implemented: initialize"})
    assert payloads(protocol) == [list_request(2)]
    reply(protocol, 2, {"tools": [TOOL_A]})
    assert protocol.events_received() == [ToolsListed((TOOL_A,), None, True)]


@pytest.mark.parametrize("result", [None, [], {}, {"serverInfo": "board"}])
def test_initialize_result_without_server_info(result: Any) -> None:
    """A result without an object serverInfo gives ToolsListed without server_info."""
    protocol = make()
    protocol.start_discovery()
    reply(protocol, 1, result)
    reply(protocol, 2, {"tools": []})
    assert protocol.events_received() == [ToolsListed((), None, True)]


def test_listing_follows_cursor_over_three_pages() -> None:
    """nextCursor is followed page after page; the tools arrive in device order."""
    protocol = listing()
    reply(protocol, 2, {"tools": [TOOL_A], "nextCursor": "b"})
    assert payloads(protocol) == [list_request(3, "b")]
    reply(protocol, 3, {"tools": [TOOL_B], "nextCursor": "self.c"})
    assert payloads(protocol) == [list_request(4, "self.c")]
    assert protocol.events_received() == []
    tool_c = {**TOOL_A, "name": "self.c"}
    reply(protocol, 4, {"tools": [tool_c]})
    assert protocol.events_received() == [ToolsListed((TOOL_A, TOOL_B, tool_c), SERVER_INFO, True)]
    assert protocol.data_to_send() == []


def test_cursor_loop_stops_listing_incomplete() -> None:
    """A cursor seen before stops the listing with what was gathered, complete=False."""
    protocol = listing()
    reply(protocol, 2, {"tools": [TOOL_A], "nextCursor": "x"})
    reply(protocol, 3, {"tools": [TOOL_B], "nextCursor": "x"})
    assert payloads(protocol) == [list_request(3, "x")]
    assert protocol.events_received() == [
        MessageDropped("tools/list cursor loop", {"pages": 2}),
        ToolsListed((TOOL_A, TOOL_B), SERVER_INFO, False),
    ]
    assert protocol.state is State.READY


def test_page_cap_stops_listing_incomplete() -> None:
    """No more than max_pages pages are requested, however many cursors come."""
    protocol = listing(max_pages=3)
    for request_id in (2, 3, 4):
        tool = {"name": f"t{request_id}"}
        reply(protocol, request_id, {"tools": [tool], "nextCursor": f"c{request_id}"})
    assert [p["id"] for p in payloads(protocol)] == [3, 4]
    events = protocol.events_received()
    assert events[0] == MessageDropped("tools/list stopped after 3 pages", {"pages": 3})
    assert isinstance(events[1], ToolsListed)
    assert [tool["name"] for tool in events[1].tools] == ["t2", "t3", "t4"]
    assert not events[1].complete


def test_page_error_stops_listing_incomplete() -> None:
    """An error reply to a later page keeps the earlier pages, complete=False."""
    protocol = listing()
    reply(protocol, 2, {"tools": [TOOL_A], "nextCursor": "zzz"})
    fail(protocol, 3, {"message": "Failed to add tool  because of payload size limit"})
    assert protocol.events_received() == [
        MessageDropped(
            "tools/list failed: Failed to add tool  because of payload size limit",
            {"pages": 2, "code": None},
        ),
        ToolsListed((TOOL_A,), SERVER_INFO, False),
    ]


def test_malformed_page_stops_listing_incomplete() -> None:
    """A page without a tools array ends the listing."""
    protocol = listing()
    reply(protocol, 2, {"nextCursor": "x"})
    assert protocol.events_received() == [
        MessageDropped("malformed tools/list result", {"pages": 1}),
        ToolsListed((), SERVER_INFO, False),
    ]


def test_tool_entries_are_handed_over_unjudged() -> None:
    """Bad entries reach ToolsListed as sent: the device layer rejects them one by one."""
    protocol = listing()
    tools = [{"name": "x", "inputSchema": {"type": "string"}}, "junk", {"description": "no name"}]
    reply(protocol, 2, {"tools": tools})
    assert protocol.events_received() == [ToolsListed(tuple(tools), SERVER_INFO, True)]


def test_list_changed_when_ready_lists_again_from_first_page() -> None:
    """A list_changed notification in READY starts a new listing without cursor."""
    clock = Clock()
    protocol = ready(clock=clock)
    clock.now += RELIST_INTERVAL
    notify(protocol)
    assert protocol.state is State.LISTING
    assert payloads(protocol) == [list_request(3)]
    reply(protocol, 3, {"tools": [TOOL_B]})
    assert protocol.events_received() == [ToolsListed((TOOL_B,), SERVER_INFO, True)]
    assert protocol.state is State.READY


def test_list_changed_during_listing_is_coalesced_into_one_more_listing() -> None:
    """Notifications during a listing cause exactly one listing after it finishes."""
    clock = Clock()
    protocol = listing(clock=clock)
    notify(protocol)
    notify(protocol)
    assert protocol.data_to_send() == []
    clock.now += RELIST_INTERVAL  # the listing took that long: the next one starts at its end
    reply(protocol, 2, {"tools": [TOOL_A]})
    assert protocol.events_received() == [ToolsListed((TOOL_A,), SERVER_INFO, True)]
    assert protocol.state is State.LISTING
    assert payloads(protocol) == [list_request(3)]
    reply(protocol, 3, {"tools": [TOOL_A, TOOL_B]})
    assert protocol.events_received() == [ToolsListed((TOOL_A, TOOL_B), SERVER_INFO, True)]
    assert protocol.data_to_send() == []
    assert protocol.state is State.READY


def test_a_change_sooner_than_the_relist_interval_is_listed_at_its_end() -> None:
    """A change within relist_interval of the last listing's start waits for the deadline;
    every change until then is listed by that one listing."""
    clock = Clock()
    protocol = ready(clock=clock)  # listed at 100.0
    clock.now = 100.1
    notify(protocol)
    notify(protocol)
    assert protocol.state is State.READY and protocol.data_to_send() == []
    assert protocol.timer == 100.0 + RELIST_INTERVAL
    protocol.handle_timer()  # fired early: nothing yet
    assert protocol.data_to_send() == []
    clock.now = 100.0 + RELIST_INTERVAL
    notify(protocol)  # at the deadline: listed now, and the timer's call finds nothing due
    assert payloads(protocol) == [list_request(3)] and protocol.state is State.LISTING
    protocol.handle_timer()
    assert protocol.data_to_send() == [] and protocol.state is State.LISTING


def test_a_change_during_a_short_listing_is_listed_once_the_interval_has_passed() -> None:
    """A listing shorter than relist_interval that saw a change ends READY, with the deadline
    for the next listing; handle_timer() then lists."""
    clock = Clock()
    protocol = listing(clock=clock)
    notify(protocol)
    reply(protocol, 2, {"tools": [TOOL_A]})
    assert protocol.events_received() == [ToolsListed((TOOL_A,), SERVER_INFO, True)]
    assert protocol.state is State.READY and protocol.data_to_send() == []
    assert protocol.timer == 100.0 + RELIST_INTERVAL
    clock.now = protocol.timer
    protocol.handle_timer()
    assert payloads(protocol) == [list_request(3)] and protocol.state is State.LISTING
    assert protocol.timer == clock.now + 15.0  # the listing's own deadline (discovery_timeout)


def test_a_device_flooding_list_changed_is_listed_a_few_times_a_second_and_last_as_it_is() -> None:
    """list_changed every 5 ms for 8 s, each listing answered at once with the catalogue of
    that moment: at most 40 listings (one per relist_interval), and the last one lists the last
    catalogue. The I/O layer's part is played here: handle_timer() when the timer is due."""
    clock = Clock()
    protocol = ready(clock=clock)
    requests = 0
    version = 0

    def answer() -> None:
        nonlocal requests
        for payload in payloads(protocol):
            requests += 1
            tools = [{**TOOL_A, "description": f"version {version}"}]
            reply(protocol, payload["id"], {"tools": tools})

    started = clock.now
    while clock.now < started + 8.0:
        clock.now = round(clock.now + 0.005, 3)
        if protocol.timer is not None and clock.now >= protocol.timer:
            protocol.handle_timer()
        version += 1
        notify(protocol)
        answer()
    assert protocol.timer is not None  # the last change waits for its listing
    clock.now = protocol.timer
    protocol.handle_timer()
    answer()
    listed = [e for e in protocol.events_received() if isinstance(e, ToolsListed)]
    assert requests <= 40 and len(listed) == requests
    assert requests >= 8.0 / RELIST_INTERVAL  # and still listed every interval, not starved
    assert listed[-1].tools[0]["description"] == f"version {version}"
    assert protocol.state is State.READY and protocol.timer is None


def test_list_changed_during_initialize_is_covered_by_the_first_listing() -> None:
    """A notification before the first listing starts needs no second listing."""
    protocol = make()
    protocol.start_discovery()
    notify(protocol)
    reply(protocol, 1, INIT_RESULT)
    reply(protocol, 2, {"tools": [TOOL_A]})
    assert [p["id"] for p in payloads(protocol)] == [1, 2]
    assert protocol.state is State.READY


def test_list_changed_before_discovery_is_ignored() -> None:
    """Before discovery the notification does nothing: discovery will list anyway."""
    protocol = make()
    notify(protocol)
    assert protocol.events_received() == []
    assert protocol.data_to_send() == []
    assert protocol.state is State.CONNECTED


def test_other_notifications_are_dropped() -> None:
    """Notifications other than tools/list_changed become MessageDropped."""
    protocol = ready()
    notify(protocol, "notifications/state_changed")
    assert protocol.events_received() == [
        MessageDropped("unsupported notification", {"method": "notifications/state_changed"})
    ]
    assert protocol.data_to_send() == []


# Requests from the device.


def test_ping_from_device_gets_empty_result() -> None:
    """A device ping is answered with an empty result, wrapped in the envelope."""
    protocol = make()
    protocol.receive_text(mcp({"jsonrpc": "2.0", "id": 9, "method": "ping"}))
    assert payloads(protocol) == [{"jsonrpc": "2.0", "id": 9, "result": {}}]
    assert protocol.events_received() == []


def test_unknown_request_from_device_gets_method_not_found() -> None:
    """Any other device request gets METHOD_NOT_FOUND, echoing a string id as is."""
    protocol = make()
    protocol.receive_text(mcp({"jsonrpc": "2.0", "id": "r1", "method": "sampling/createMessage"}))
    assert payloads(protocol) == [
        {
            "jsonrpc": "2.0",
            "id": "r1",
            "error": {"code": -32601, "message": "Method not found: sampling/createMessage"},
        }
    ]


# Tool calls.


def test_call_tool_sends_tools_call_and_returns_its_id() -> None:
    """call_tool queues a tools/call with a fresh int id and tracks it as pending."""
    protocol = ready()
    call_id = protocol.call_tool("a", {"x": "é"})
    assert call_id == 3
    assert payloads(protocol) == [
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "a", "arguments": {"x": "é"}},
        }
    ]
    assert protocol.pending_calls == frozenset({3})


def test_call_tool_works_before_discovery() -> None:
    """Stock devices need no initialize, so calls are allowed in any open state."""
    protocol = make()
    assert protocol.call_tool("a", {}) == 1
    reply(protocol, 1, RESULT)
    assert protocol.events_received() == [CallSucceeded(1, RESULT)]


def test_pending_calls_leave_out_discovery_requests() -> None:
    """Only tools/call ids are pending calls; discovery ids are not."""
    protocol = make()
    protocol.start_discovery()
    call_id = protocol.call_tool("a", {})
    assert call_id == 2
    assert protocol.pending_calls == frozenset({2})


def test_out_of_order_replies_are_matched_by_id() -> None:
    """Replies in any order resolve the right calls."""
    protocol = ready()
    first, second, third = (protocol.call_tool("a", {"n": n}) for n in range(3))
    reply(protocol, third, {"content": [], "n": 3})
    fail(protocol, first, {"message": "boom"})
    reply(protocol, second, RESULT)
    assert protocol.events_received() == [
        CallSucceeded(third, {"content": [], "n": 3}),
        CallFailed(first, "boom", None),
        CallSucceeded(second, RESULT),
    ]
    assert protocol.pending_calls == frozenset()


def test_call_error_without_code_has_code_none() -> None:
    """A stock error reply (message, no code) fails the call with code None."""
    protocol = ready()
    call_id = protocol.call_tool("a", {})
    fail(protocol, call_id, {"message": "Missing valid argument: volume"})
    assert protocol.events_received() == [
        CallFailed(call_id, "Missing valid argument: volume", None)
    ]


def test_call_error_keeps_code_and_defaults_message() -> None:
    """A code is kept; a missing message reads "device error"."""
    protocol = ready()
    first, second = protocol.call_tool("a", {}), protocol.call_tool("b", {})
    fail(protocol, first, {"code": -32602, "message": "bad"})
    fail(protocol, second, {"code": 7})
    assert protocol.events_received() == [
        CallFailed(first, "bad", -32602),
        CallFailed(second, "device error", 7),
    ]


@pytest.mark.parametrize("result", [None, "true", [1], 5])
def test_call_result_that_is_not_an_object_fails_the_call(result: Any) -> None:
    """A result that is not an object fails the call as "malformed result"."""
    protocol = ready()
    call_id = protocol.call_tool("a", {})
    reply(protocol, call_id, result)
    assert protocol.events_received() == [CallFailed(call_id, "malformed result", None)]


def test_unescaped_error_message_is_salvaged() -> None:
    """Stock firmware's invalid-JSON error reply still fails the right call with its message."""
    protocol = ready()
    call_id = protocol.call_tool("a", {})
    protocol.receive_text(
        '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":'
        + str(call_id)
        + ',"error":{"message":"Missing valid argument: "x""}}}'
    )
    assert protocol.events_received() == [CallFailed(call_id, 'Missing valid argument: "x"', None)]


def test_float_id_reply_resolves_the_call() -> None:
    """A reply id of 3.0 matches the call with id 3."""
    protocol = ready()
    call_id = protocol.call_tool("a", {})
    protocol.receive_text(mcp({"jsonrpc": "2.0", "id": float(call_id), "result": RESULT}))
    assert protocol.events_received() == [CallSucceeded(call_id, RESULT)]


@pytest.mark.parametrize("request_id", [99, "3", None])
def test_reply_to_unknown_id_is_dropped(request_id: Any) -> None:
    """Replies that match no pending request become MessageDropped."""
    protocol = ready()
    protocol.call_tool("a", {})
    fail(protocol, request_id, {"message": "x"})
    assert protocol.events_received() == [
        MessageDropped("reply to an unknown or forgotten request", {"id": request_id})
    ]
    assert protocol.pending_calls == frozenset({3})


def test_late_reply_after_forget_is_dropped() -> None:
    """A reply to a forgotten call is MessageDropped, not CallSucceeded."""
    protocol = ready()
    call_id = protocol.call_tool("a", {})
    protocol.forget(call_id)
    assert protocol.pending_calls == frozenset()
    reply(protocol, call_id, RESULT)
    assert dropped(protocol) == ["reply to an unknown or forgotten request"]


def test_forget_ignores_unknown_and_discovery_ids() -> None:
    """forget() only drops tools/call ids; discovery replies still count."""
    protocol = make()
    protocol.start_discovery()
    protocol.forget(1)
    protocol.forget(42)
    reply(protocol, 1, INIT_RESULT)
    assert protocol.state is State.LISTING


def test_call_ids_skip_pending_requests_and_go_up() -> None:
    """Every request gets its own id, discovery and calls alike."""
    protocol = listing()
    assert [protocol.call_tool("a", {}) for _ in range(2)] == [3, 4]


def test_call_tool_rejects_oversize_frame() -> None:
    """A call whose frame exceeds max_message_bytes raises and sends nothing."""
    protocol = ready(max_message_bytes=400)
    with pytest.raises(LocalProtocolError, match="over 400"):
        protocol.call_tool("a", {"text": "x" * 400})
    assert protocol.data_to_send() == []
    assert protocol.pending_calls == frozenset()
    protocol.call_tool("a", {"text": "x"})
    assert len(protocol.data_to_send()) == 1


def test_a_call_and_its_answer_are_not_encoded_again_to_be_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Non-ASCII both ways, neither the call's frame (its link encodes it to send it) nor the
    answer (its link just decoded it) is encoded once more only to check its size."""
    protocol = ready(max_message_bytes=65536)
    protocol.data_to_send()
    encoded: list[str] = []
    monkeypatch.setattr(envelope, "utf8_length", lambda text: encoded.append(text) or 0)
    call_id = protocol.call_tool("a", {"text": "打开客厅的灯"})
    assert "打开客厅的灯" in protocol.data_to_send()[0]
    answer = {"jsonrpc": "2.0", "id": call_id, "result": {"content": [{"text": "灯已打开"}]}}
    envelope_ = {"session_id": SID, "type": "mcp", "payload": answer}
    protocol.receive_text(json.dumps(envelope_, ensure_ascii=False))
    [event] = protocol.events_received()
    assert isinstance(event, CallSucceeded) and event.result == answer["result"]
    assert encoded == []


@pytest.mark.parametrize(
    ("name", "arguments"),
    [("", {}), (None, {}), ("a", None), ("a", [1]), ("a", {"v": float("nan")}), ("a", {"v": {1}})],
)
def test_call_tool_rejects_what_cannot_be_sent(name: Any, arguments: Any) -> None:
    """Empty names, non-object arguments and non-JSON values raise LocalProtocolError."""
    protocol = ready()
    with pytest.raises(LocalProtocolError):
        protocol.call_tool(name, arguments)
    assert protocol.data_to_send() == []


# Calls under pressure: a bound on calls in flight, a queue, and cancellation.


def call_request(call_id: int, name: str = "a") -> dict[str, Any]:
    params = {"name": name, "arguments": {}}
    return {"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": params}


def cancellation(call_id: int, reason: str) -> dict[str, Any]:
    params = {"requestId": call_id, "reason": reason}
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


def test_calls_beyond_the_bound_wait_and_go_out_as_answers_free_slots() -> None:
    """With 2 slots the third call waits unsent; each answer sends the oldest waiting call."""
    protocol = ready(max_calls_in_flight=2, max_calls_queued=2)
    ids = [protocol.call_tool(name, {}) for name in ("a", "b", "a", "b")]
    assert ids == [3, 4, 5, 6]
    assert payloads(protocol) == [call_request(3, "a"), call_request(4, "b")]
    assert protocol.pending_calls == frozenset({3, 4}) and protocol.waiting_calls == (5, 6)
    fail(protocol, 4, {"message": "no"})
    assert payloads(protocol) == [call_request(5, "a")]
    reply(protocol, 3, RESULT)
    assert payloads(protocol) == [call_request(6, "b")]
    assert protocol.events_received() == [CallFailed(4, "no"), CallSucceeded(3, RESULT)]
    assert protocol.pending_calls == frozenset({5, 6}) and protocol.waiting_calls == ()


@pytest.mark.parametrize(
    ("in_flight", "queued", "message"),
    [(4, 32, "4 calls running and 32 waiting"), (1, 0, "1 call running and 0 waiting")],
)
def test_call_beyond_the_queue_raises_device_busy_and_sends_nothing(
    in_flight: int, queued: int, message: str
) -> None:
    """The call after max_calls_in_flight + max_calls_queued fails at once, saying why."""
    protocol = ready(max_calls_in_flight=in_flight, max_calls_queued=queued)
    for _ in range(in_flight + queued):
        protocol.call_tool("a", {})
    protocol.data_to_send()
    with pytest.raises(DeviceBusy, match=f"^{message}$") as busy:
        protocol.call_tool("a", {})
    assert busy.value.device_id == "dev-1"
    assert protocol.data_to_send() == [] and protocol.events_received() == []
    assert len(protocol.pending_calls) == in_flight and len(protocol.waiting_calls) == queued


def test_forget_of_a_sent_call_tells_the_device_and_frees_its_slot() -> None:
    """notifications/cancelled with the id and reason, then the oldest waiting call is sent."""
    protocol = ready(max_calls_in_flight=1)
    first, second = protocol.call_tool("a", {}), protocol.call_tool("b", {})
    protocol.data_to_send()
    assert protocol.forget(first, "timed out") is True
    assert payloads(protocol) == [cancellation(first, "timed out"), call_request(second, "b")]
    reply(protocol, first, RESULT)  # the device answered before it read the cancellation
    assert dropped(protocol) == ["reply to an unknown or forgotten request"]
    assert protocol.forget(first) is False and protocol.data_to_send() == []


def test_forget_of_a_waiting_call_drops_it_unsent_and_keeps_the_order() -> None:
    """A call that never left the queue is not mentioned to the device; the rest keep order."""
    protocol = ready(max_calls_in_flight=1)
    ids = [protocol.call_tool("a", {}) for _ in range(3)]
    protocol.data_to_send()
    assert protocol.forget(ids[1]) is False
    assert protocol.data_to_send() == [] and protocol.waiting_calls == (ids[2],)
    reply(protocol, ids[0], RESULT)
    assert payloads(protocol) == [call_request(ids[2])]


def test_forget_after_close_tells_nothing() -> None:
    """A closed session sends no cancellation: the device is gone."""
    protocol = ready()
    call_id = protocol.call_tool("a", {})
    protocol.close()
    protocol.data_to_send()
    assert protocol.forget(call_id, "timed out") is False
    assert protocol.data_to_send() == []


def test_request_ids_skip_waiting_calls() -> None:
    """A re-listing while calls wait takes an id none of them holds."""
    clock = Clock()
    protocol = ready(max_calls_in_flight=1, max_calls_queued=2, clock=clock)
    ids = [protocol.call_tool("a", {}) for _ in range(3)]
    protocol.forget(ids[0])
    protocol.call_tool("a", {})  # id 6; ids 4 (sent by forget) and 5 are still in use
    protocol._pending._ids = IdAllocator(4)  # wrap around onto them
    clock.now += RELIST_INTERVAL
    notify(protocol)
    listed = payloads(protocol)[-1]
    assert listed["method"] == "tools/list" and listed["id"] == 7


# Closing.


def test_close_fails_pending_calls_and_ignores_later_input() -> None:
    """close() fails each pending call with closed=True, sent then waiting; afterwards input
    yields nothing."""
    protocol = listing(max_calls_in_flight=3)
    ids = [protocol.call_tool("a", {}) for _ in range(5)]
    protocol.forget(ids[1])
    protocol.close()
    gone, unsent = (
        "device disconnected during the call",
        "device disconnected before the call was sent",
    )
    assert protocol.events_received() == [
        CallFailed(ids[0], gone, closed=True),
        CallFailed(ids[2], gone, closed=True),
        CallFailed(ids[3], gone, closed=True),
        CallFailed(ids[4], unsent, closed=True),
    ]
    assert protocol.state is State.CLOSED
    assert protocol.pending_calls == frozenset() and protocol.waiting_calls == ()
    assert protocol.timer is None
    protocol.data_to_send()
    reply(protocol, ids[0], RESULT)
    protocol.receive_text(json.dumps(HELLO))
    protocol.close()
    assert protocol.events_received() == []
    assert protocol.data_to_send() == []


# Deadlines: the core owns them; the I/O layer only arms a timer for `timer`.


def test_no_hello_by_the_hello_deadline_starts_discovery() -> None:
    """At hello_timeout without a hello, handle_timer() sends initialize; not a moment before."""
    clock = Clock()
    protocol = make(hello_timeout=3, discovery_timeout=10, clock=clock)
    assert protocol.timer == 103
    clock.now = 102.9
    protocol.handle_timer()
    assert protocol.data_to_send() == [] and protocol.state is State.CONNECTED
    clock.now = 103
    protocol.handle_timer()
    assert [p["method"] for p in payloads(protocol)] == ["initialize"]
    assert protocol.state is State.INITIALIZING and protocol.timer == 113


def test_discovery_deadline_counts_from_the_hello() -> None:
    """A device that says hello and never lists is closed discovery_timeout after the hello."""
    clock = Clock()
    protocol = make(hello_timeout=3, discovery_timeout=0.3, clock=clock)
    clock.now = 101
    protocol.receive_text(json.dumps(HELLO))
    protocol.events_received()
    assert protocol.timer == pytest.approx(101.3)
    call_id = protocol.call_tool("a", {})
    clock.now = 101.3
    protocol.handle_timer()
    assert protocol.state is State.CLOSED and protocol.timer is None
    assert protocol.events_received() == [
        DiscoveryTimedOut(0.3),
        CallFailed(call_id, "device disconnected during the call", closed=True),
    ]


def test_ready_session_has_no_deadline_and_a_relisting_gets_its_own() -> None:
    """Listing ends the deadline; tools/list_changed starts a fresh one."""
    clock = Clock()
    protocol = ready(discovery_timeout=5, clock=clock)
    assert protocol.timer is None
    protocol.handle_timer()
    assert protocol.state is State.READY
    clock.now = 200
    protocol.receive_text(mcp({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}))
    assert protocol.state is State.LISTING and protocol.timer == 205


def test_call_tool_after_close_raises_invalid_state() -> None:
    """No call can be made on a closed session."""
    protocol = make()
    protocol.close()
    with pytest.raises(InvalidState):
        protocol.call_tool("a", {})


def test_start_discovery_after_close_does_nothing() -> None:
    """A closed session does not start discovery."""
    protocol = make()
    protocol.close()
    protocol.start_discovery()
    assert protocol.data_to_send() == []


def test_goodbye_emits_device_goodbye() -> None:
    """An MQTT goodbye becomes DeviceGoodbye; the I/O layer decides to close."""
    protocol = ready()
    protocol.receive_text(f'{{"session_id":"{SID}","type":"goodbye"}}')
    assert protocol.events_received() == [DeviceGoodbye()]
    assert protocol.state is State.READY


# Garbage in.


def test_oversize_input_is_dropped() -> None:
    """A frame over max_message_bytes is dropped unparsed."""
    protocol = make(max_message_bytes=100)
    text = mcp({"jsonrpc": "2.0", "id": 1, "method": "ping", "x": "y" * 100})
    protocol.receive_text(text)
    assert protocol.events_received() == [
        MessageDropped("frame longer than 100 bytes", {"chars": len(text)})
    ]
    assert protocol.data_to_send() == []


def test_oversize_unescaped_error_is_not_salvaged() -> None:
    """The size limit applies before salvaging."""
    protocol = make(max_message_bytes=80)
    text = (
        '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,'
        '"error":{"message":"%s"x""}}}' % ("y" * 50)
    )
    protocol.receive_text(text)
    assert dropped(protocol) == ["frame longer than 80 bytes"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("\x00\x01\xff\ufffd garbage", "invalid JSON"),
        ("OggS\x00\x02" + "\x00" * 20, "invalid JSON"),
        ("", "invalid JSON"),
        ("[1]", "not a JSON object"),
        ('{"session_id":"x"}', "missing or non-string type"),
    ],
)
def test_undecodable_input_is_dropped(text: str, reason: str) -> None:
    """Binary-ish garbage, non-objects and type-less objects are dropped, never raised."""
    protocol = ready()
    protocol.receive_text(text)
    assert dropped(protocol) == [reason]
    assert protocol.data_to_send() == []


@pytest.mark.parametrize("payload", [None, "x", [1], 5])
def test_non_object_mcp_payload_is_dropped(payload: Any) -> None:
    """An mcp message whose payload is not an object is dropped."""
    protocol = ready()
    protocol.receive_text(mcp(payload))
    assert dropped(protocol) == ["invalid JSON-RPC: JSON-RPC message is not an object"]


def test_invalid_json_rpc_is_dropped() -> None:
    """An object that is no JSON-RPC message is dropped with the reason."""
    protocol = ready()
    protocol.receive_text(mcp({"jsonrpc": "2.0", "id": 1}))
    assert dropped(protocol) == [
        "invalid JSON-RPC: neither a request, a notification nor a response"
    ]


@pytest.mark.parametrize("kind", ["listen", "abort", "stt", "tts", "iot", "custom"])
def test_voice_message_types_are_dropped(kind: str) -> None:
    """Message types other than hello, mcp and goodbye are dropped."""
    protocol = ready()
    protocol.receive_text(json.dumps({"session_id": SID, "type": kind, "state": "start"}))
    assert protocol.events_received() == [
        MessageDropped("unsupported message type", {"type": kind})
    ]


@settings(max_examples=300)
@given(st.text())
def test_any_text_never_raises(text: str) -> None:
    """Whatever text arrives, receive_text never raises and the session stays READY."""
    protocol = ready()
    protocol.receive_text(text)
    assert protocol.state is State.READY


@settings(max_examples=300)
@given(JSON, st.sampled_from(["hello", "mcp", "goodbye", "listen"]))
def test_any_json_message_never_raises(payload: Any, kind: str) -> None:
    """Any JSON in any message type's payload is digested without raising."""
    protocol = listing()
    protocol.call_tool("a", {})
    protocol.receive_text(json.dumps({"type": kind, "payload": payload}))
    for frame in protocol.data_to_send():
        json.loads(frame)
        frame.encode("utf-8")


@settings(max_examples=100)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"id": st.integers(0, 6)}, optional={"result": JSON, "error": JSON, "method": st.text()}
        ),
        max_size=8,
    )
)
def test_any_reply_sequence_never_raises(messages: list[dict[str, Any]]) -> None:
    """Random replies, in any order, never raise and leave a consistent state."""
    protocol = listing()
    protocol.call_tool("a", {})
    for message in messages:
        protocol.receive_text(mcp(message))
    assert protocol.state in {State.LISTING, State.READY}


# State machine and logging.


def test_illegal_state_transition_raises_invalid_state() -> None:
    """The state setter refuses transitions the table does not allow."""
    protocol = make()
    with pytest.raises(InvalidState):
        protocol.state = State.READY
    protocol.close()
    with pytest.raises(InvalidState):
        protocol.state = State.CONNECTED


def test_frames_and_transitions_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """Incoming frames are marked "<", outgoing ">", transitions and drops are logged."""
    caplog.set_level(logging.DEBUG, logger="gateway.protocol.device")
    protocol = make()
    protocol.receive_text(json.dumps(HELLO))
    protocol.receive_text("junk")
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith('< {"type": "hello"')
    assert messages[1].startswith('> {"type":"hello"')
    assert "= CONNECTED -> INITIALIZING" in messages
    assert any(m.startswith("> ") and '"initialize"' in m for m in messages)
    assert any(m.startswith("dropped: invalid JSON") for m in messages)


def test_uses_the_given_logger_adapter(caplog: pytest.LogCaptureFixture) -> None:
    """A LoggerAdapter carrying the device id can be passed in."""
    logger = logging.getLogger("test.device")
    caplog.set_level(logging.INFO, logger="test.device")
    adapter = logging.LoggerAdapter(logger, {"device_id": "dev-1"})
    protocol = make(logger=adapter)
    protocol.start_discovery()
    fail(protocol, 1, {"message": "nope"})
    assert [record.getMessage() for record in caplog.records] == [
        "initialize failed (nope); listing tools anyway"
    ]
    assert caplog.records[0].device_id == "dev-1"  # type: ignore[attr-defined]


def test_events_and_frames_are_drained() -> None:
    """events_received() and data_to_send() return each item once."""
    protocol = make()
    protocol.receive_text(json.dumps(HELLO))
    assert len(protocol.events_received()) == 1
    assert protocol.events_received() == []
    assert len(protocol.data_to_send()) == 2
    assert protocol.data_to_send() == []


def stock_reply(protocol: DeviceProtocol, session_id: str, request_id: int, result: str) -> None:
    """A reply framed as stock firmware frames it: compact, session id first."""
    head = f'{{"session_id":"{session_id}","type":"mcp","payload":{{"jsonrpc":"2.0","id":'
    protocol.receive_text(f'{head}{request_id},"result":{result}}}}}')


def test_stock_framed_pages_name_their_catalogue_whatever_the_session() -> None:
    """Two sessions listing the same stock-framed pages get one digest (the device layer then
    hashes nothing); a reply framed otherwise leaves the digest to the device layer."""
    page = json.dumps({"tools": [TOOL_A, TOOL_B]}, separators=(",", ":"))
    digests = []
    for session_id in ("one", "two"):
        protocol = DeviceProtocol("dev-1", session_id=session_id)
        protocol.receive_text(json.dumps(HELLO))
        stock_reply(protocol, session_id, 1, json.dumps(INIT_RESULT))
        protocol.events_received()
        stock_reply(protocol, session_id, 2, page)
        [listed] = protocol.events_received()
        assert isinstance(listed, ToolsListed) and listed.tools == (TOOL_A, TOOL_B)
        digests.append(listed.digest)
    assert digests[0] == digests[1] is not None
    protocol = make()
    protocol.receive_text(json.dumps(HELLO))
    reply(protocol, 1, INIT_RESULT)
    protocol.events_received()
    reply(protocol, 2, {"tools": [TOOL_A, TOOL_B]})  # json.dumps's spacing, not stock's
    [listed] = protocol.events_received()
    assert isinstance(listed, ToolsListed) and listed.digest is None


def test_a_replica_slice_tags_every_request_and_ignores_other_replicas_replies() -> None:
    """In a cluster, ids carry the replica (replica_no << 24 | n): a reply to another
    replica's request, which every replica hears over MQTT, settles nothing here."""
    base = 5 << 24
    protocol = make(request_ids=range(base + 1, (6 << 24)))
    protocol.receive_text(json.dumps(HELLO))
    init = sent(protocol)[-1]["payload"]
    assert init["method"] == "initialize" and init["id"] == base + 1
    reply(protocol, (7 << 24) + 1, INIT_RESULT)  # another replica's initialize
    assert protocol.state is State.INITIALIZING
    reply(protocol, base + 1, INIT_RESULT)
    assert payloads(protocol)[-1]["id"] == base + 2
