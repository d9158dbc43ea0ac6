"""The MQTT side of the core: the hello reply with its ``udp`` block, and the presence probe."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import LocalProtocolError
from gateway.protocol import (
    PROBE_ID,
    DeviceProtocol,
    IdAllocator,
    MessageDropped,
    State,
    check_udp_block,
    encode,
    make_probe,
    mcp_envelope,
    server_hello,
)

UDP = {"server": "192.0.2.10", "port": 8765, "key": "0a" * 16, "nonce": "01" + "00" * 15}
MQTT_HELLO = {
    "type": "hello",
    "version": 3,
    "transport": "udp",
    "features": {"mcp": True},
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}


def accepted_by_stock_firmware(reply: dict[str, Any]) -> bool:
    """The checks of mqtt_protocol.cc:377-467 (docs/protocol.md §2), one by one."""
    udp = reply.get("udp")
    if reply.get("transport") != "udp" or not isinstance(udp, dict):
        return False
    port = udp.get("port")
    return (
        isinstance(udp.get("server"), str)
        and isinstance(port, int)
        and 1 <= port <= 65535
        and all(len(bytes.fromhex(udp.get(k, "x"))) == 16 for k in ("key", "nonce"))
    )


def test_mqtt_hello_reply_carries_a_udp_block_stock_firmware_accepts() -> None:
    """A hello over MQTT is answered with transport "udp" and a valid udp block."""
    protocol = DeviceProtocol("aa:bb:cc:dd:ee:ff", transport="udp", udp=UDP, session_id="s1")
    protocol.receive_text(json.dumps(MQTT_HELLO))
    reply = json.loads(protocol.data_to_send()[0])
    assert reply["session_id"] == "s1" and reply["udp"] == UDP
    assert accepted_by_stock_firmware(reply)
    assert protocol.state is State.INITIALIZING


def test_each_conversation_hello_gets_the_same_reply() -> None:
    """A second hello (the next conversation) is answered again, without a new discovery."""
    protocol = DeviceProtocol("d", transport="udp", udp=UDP)
    protocol.receive_text(json.dumps(MQTT_HELLO))
    first = protocol.data_to_send()[0]
    protocol.receive_text(json.dumps(MQTT_HELLO))
    assert protocol.data_to_send() == [first]


def test_server_hello_without_udp_has_no_udp_block() -> None:
    """The WebSocket hello is unchanged: no udp key at all."""
    assert "udp" not in server_hello("s", "websocket")


@pytest.mark.parametrize(
    "change",
    [
        {"server": ""},
        {"server": 3},
        {"port": 0},
        {"port": 65536},
        {"port": True},
        {"port": "8765"},
        {"key": "0a" * 15},
        {"key": "zz" * 16},
        {"nonce": None},
    ],
)
def test_udp_block_a_stock_device_would_ignore_is_refused(change: dict[str, Any]) -> None:
    """Every field a device checks is checked before anything is sent."""
    with pytest.raises(LocalProtocolError):
        check_udp_block({**UDP, **change})
    with pytest.raises(LocalProtocolError):
        DeviceProtocol("d", transport="udp", udp={**UDP, **change})


def test_udp_block_is_copied_with_only_the_four_fields() -> None:
    """Extra keys are left out of the block the device gets."""
    assert check_udp_block({**UDP, "encryption": "aes-128-ctr"}) == UDP


def test_probe_is_a_ping_with_an_id_the_allocator_never_gives() -> None:
    """The probe's id is never allocated, so its reply settles nothing."""
    probe = make_probe()
    assert probe == {"jsonrpc": "2.0", "id": PROBE_ID, "method": "ping"}
    allocator = IdAllocator()
    assert PROBE_ID not in {allocator.allocate() for _ in range(1000)}


def test_probe_reply_is_dropped_by_a_live_session() -> None:
    """A stock device's answer to a probe is dropped, and a pending call is not disturbed."""
    protocol = DeviceProtocol("d", session_id="s")
    call_id = protocol.call_tool("self.x", {})
    reply = {"jsonrpc": "2.0", "id": PROBE_ID, "error": {"message": "Method not implemented"}}
    protocol.receive_text(encode(mcp_envelope("s", reply)))
    events = protocol.events_received()
    assert len(events) == 1 and isinstance(events[0], MessageDropped)
    assert protocol.pending_calls == {call_id}
