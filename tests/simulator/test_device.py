"""SimulatedDevice against a real websockets server acting as a minimal gateway."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import anyio
import pytest

from device_fw import fw_device, fw_link_ws
from device_fw.fw_envelope import HELLO
from gateway.simulator import (
    Args,
    HandshakeRefused,
    HelloFailed,
    SimTool,
    SimulatedDevice,
    backoff_delay,
)
from tests.simulator.helpers import PATH, SERVER_HELLO, bound, mini_gateway

pytestmark = pytest.mark.anyio


def call(request_id: int, name: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def test_handshake_sends_the_stock_headers_and_hello() -> None:
    """Bearer token, Protocol-Version 1, lowercase Device-Id, UUID Client-Id, then the hello."""
    async with mini_gateway() as gw:
        dev = SimulatedDevice(gw.url, "secret", device_id="02:00:00:00:00:AB")
        async with dev:
            assert await gw.recv() == HELLO
            assert dev.session_id == "sess-1" and dev.connected
    request = gw.requests[0]
    assert request.path == PATH
    headers = request.headers
    assert headers["Authorization"] == "Bearer secret"
    assert headers["Protocol-Version"] == "1"
    assert headers["Device-Id"] == "02:00:00:00:00:ab"
    assert uuid.UUID(headers["Client-Id"]).version == 4
    assert headers["Client-Id"] == headers["Client-Id"].lower() == dev.client_id
    # esp-ml307 sends none of these, and orders its own headers alphabetically.
    assert "User-Agent" not in headers and "Sec-WebSocket-Extensions" not in headers
    names = [name for name, _ in headers.raw_items()]
    ours = ["Authorization", "Client-Id", "Device-Id", "Protocol-Version"]
    assert [n for n in names if n in ours] == ours


async def test_no_token_sends_no_authorization_and_a_spaced_token_goes_verbatim() -> None:
    """token=None omits Authorization; a token with a space is sent as is (stock)."""
    async with mini_gateway() as gw:
        async with SimulatedDevice(gw.url, None):
            pass
        async with SimulatedDevice(gw.url, "Basic abc"):
            pass
    assert "Authorization" not in gw.requests[0].headers
    assert gw.requests[1].headers["Authorization"] == "Basic abc"


async def test_replies_carry_the_server_session_id_first(caplog: pytest.LogCaptureFixture) -> None:
    """Every envelope the device sends starts with the session_id from the server hello."""
    caplog.set_level(logging.DEBUG, logger="device_fw")
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t"):
        await gw.recv()  # the device hello
        await gw.send_mcp({"jsonrpc": "2.0", "id": 1, "method": "initialize"})
        frame = await _raw_text(gw)
    assert frame.startswith('{"session_id":"sess-1","type":"mcp","payload":{"jsonrpc":"2.0","id":1')
    assert f"02:00:00:00:00:01 > {frame}" in caplog.text  # frames are logged, marked >


async def test_a_slow_call_does_not_hold_back_a_fast_one() -> None:
    """Each tools/call runs in its own task, so replies come out of request order."""
    gate = asyncio.Event()

    async def slow(args: Args) -> str:
        await gate.wait()
        return "slow"

    async def fast(args: Args) -> str:
        return "fast"

    tools = [SimTool("self.slow", "", {}, slow), SimTool("self.fast", "", {}, fast)]
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t", tools=tools) as dev:
        await gw.recv()
        await gw.send_mcp(call(1, "self.slow"))
        await gw.send_mcp(call(2, "self.fast", x=1))
        assert (await gw.recv_mcp())["id"] == 2
        assert await dev.wait_for_call("self.slow", bound()) == {}
        gate.set()
        reply = await gw.recv_mcp()
    assert reply["id"] == 1 and reply["result"]["content"][0]["text"] == "slow"
    assert dev.calls == [("self.slow", {}), ("self.fast", {"x": 1})]


async def test_wait_for_call_counts_past_calls_and_times_out() -> None:
    """A call already received satisfies the wait; ``start`` skips earlier ones."""
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t") as dev:
        await gw.recv()
        await gw.send_mcp(call(1, "self.lamp.turn_on"))
        await gw.recv_mcp()
        assert await dev.wait_for_call("self.lamp.turn_on", bound()) == {}
        with pytest.raises(TimeoutError):
            await dev.wait_for_call("self.lamp.turn_on", 0.01, start=1)


async def test_add_and_remove_tool_send_list_changed() -> None:
    """With list_changed (default) every catalogue change is announced."""
    tool = SimTool("self.fan.spin", "Spin the fan.", {}, _true)
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t") as dev:
        await gw.recv()
        await dev.add_tool(tool)
        notification = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        assert await gw.recv_mcp() == notification
        await dev.remove_tool("self.fan.spin")
        assert await gw.recv_mcp() == notification


async def test_list_changed_false_stays_silent_like_stock() -> None:
    """Without list_changed the next thing the gateway gets is the reply to its request."""
    tool = SimTool("self.fan.spin", "Spin the fan.", {}, _true)
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t", list_changed=False) as dev:
        await gw.recv()
        await dev.add_tool(tool)
        reply = await gw.request(7, "tools/call", name="self.fan.spin")
    assert reply["id"] == 7


async def test_drop_closes_without_a_close_frame() -> None:
    """drop() vanishes like a device losing power: the gateway sees no close frame."""
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t") as dev:
        await gw.recv()
        await dev.drop()
        assert not dev.connected
        ended = await gw.wait_ended()
    assert ended is not None and ended.rcvd is None


async def test_leaving_the_block_closes_cleanly() -> None:
    """Exiting ``async with`` sends a close frame (code 1000)."""
    async with mini_gateway() as gw:
        async with SimulatedDevice(gw.url, "t"):
            await gw.recv()
        assert await gw.wait_ended() is None
        assert gw.ws is not None and gw.ws.close_code == 1000


async def test_server_close_ends_serving_and_cancels_calls_in_flight() -> None:
    """When the gateway closes, the device stops serving at once, tools still running or not."""
    never = asyncio.Event()

    async def stuck(args: Args) -> bool:
        await never.wait()
        return True

    tools = [SimTool("self.stuck", "", {}, stuck)]
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t", tools=tools) as dev:
        await gw.recv()
        await gw.send_mcp(call(1, "self.stuck"))
        await dev.wait_for_call("self.stuck", bound())
        assert gw.ws is not None
        await gw.ws.close()
        with anyio.fail_after(bound()):
            await dev.wait_closed()
        assert not dev.connected
        await dev.add_tool(SimTool("self.late", "", {}, stuck))  # offline: nothing to announce


async def test_reboot_drops_the_connection_and_never_answers() -> None:
    """self.reboot reboots before replying: no reply, no close frame, RAM state lost."""
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t") as dev:
        await gw.recv()
        await gw.request(1, "tools/call", name="self.lamp.turn_on")
        await gw.send_mcp(call(2, "self.reboot"))
        ended = await gw.wait_ended()
        assert gw.raw.empty()
        assert ended is not None and ended.rcvd is None
    assert dev.board.lamp_on is False
    assert [name for name, _ in dev.calls] == ["self.lamp.turn_on", "self.reboot"]


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_handshake_raises_a_clear_error(status: int) -> None:
    """HTTP 401/403 on the upgrade raises HandshakeRefused naming the status."""
    async with mini_gateway(refuse=status) as gw:
        with pytest.raises(HandshakeRefused, match=str(status)) as caught:
            async with SimulatedDevice(gw.url, "wrong"):
                pass
    assert caught.value.status == status


@pytest.mark.parametrize(
    "hello", [{"type": "hello", "session_id": "x"}, {**SERVER_HELLO, "transport": "udp"}]
)
async def test_a_hello_without_the_websocket_transport_is_ignored_until_the_timeout(
    monkeypatch: pytest.MonkeyPatch, hello: dict[str, Any]
) -> None:
    """A hello whose transport is missing or not "websocket" is ignored; the device gives up.

    (Stock firmware crashes on a missing transport; the firmware just waits for a good one.)
    """
    monkeypatch.setattr(fw_link_ws, "HELLO_TIMEOUT", 0.2)
    async with mini_gateway(hello=hello) as gw:
        with pytest.raises(HelloFailed, match="no server hello within"):
            async with SimulatedDevice(gw.url, "t"):
                pass
        assert await gw.wait_ended() is not None


async def test_a_hello_without_session_id_keeps_the_old_one() -> None:
    """A hello without session_id is accepted and the session id stays "" (stock)."""
    hello = {"type": "hello", "transport": "websocket"}
    async with mini_gateway(hello=hello) as gw, SimulatedDevice(gw.url, "t") as dev:
        await gw.recv()
        await gw.send_mcp({"jsonrpc": "2.0", "id": 1, "method": "initialize"})
        assert (await gw.recv())["session_id"] == ""
        await gw.send({**SERVER_HELLO, "session_id": "later"})
        await gw.send_mcp({"jsonrpc": "2.0", "id": 2, "method": "initialize"})
        assert (await gw.recv())["session_id"] == "later" == dev.session_id


async def test_mcp_before_the_server_hello_is_answered_once_the_hello_came() -> None:
    """MCP that arrives before the server hello waits for it, then carries its session id.

    (Stock answers at once with session_id ""; the gateway always says hello first.)
    """
    async with mini_gateway(hello=None) as gw:
        entering = asyncio.create_task(SimulatedDevice(gw.url, "t").__aenter__())
        assert await gw.recv() == HELLO
        await gw.send_mcp({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        await gw.send(SERVER_HELLO)
        with anyio.fail_after(bound()):
            dev = await entering
        reply = await gw.recv()
        assert reply["session_id"] == "sess-1" and "tools" in reply["payload"]["result"]
        await dev.__aexit__(None, None, None)


async def test_binary_frames_garbage_and_other_types_are_ignored() -> None:
    """Audio, non-JSON text, non-mcp types and bad payloads get no reply."""
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t"):
        await gw.recv()
        await gw.send(b"\x00opus")
        await gw.send("not json")
        await gw.send('{"type":"mcp","payload":{"jsonrpc":"2.0","id":NaN,"method":"x"}}')
        await gw.send({"type": "tts", "state": "start"})
        await gw.send({"type": "mcp", "payload": "not an object"})
        await gw.send_mcp({"jsonrpc": "2.0", "method": "notifications/initialized"})
        reply = await gw.request(9, "tools/list")
    assert reply["id"] == 9


async def test_a_reply_over_64_kib_becomes_an_error_reply() -> None:
    """A device cannot send a frame over 65535 bytes: the firmware answers with an error
    saying so (stock firmware loses its channel instead)."""

    async def huge(args: Args) -> str:
        return "x" * 70_000

    tools = [SimTool("self.huge", "", {}, huge)]
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t", tools=tools) as dev:
        await gw.recv()
        reply = await gw.request(1, "tools/call", name="self.huge")
        assert dev.connected
    assert reply["id"] == 1
    assert reply["error"]["message"].startswith("Reply too large: 70")


async def test_error_codes_option_reaches_the_wire() -> None:
    """SimulatedDevice(error_codes=True) sends JSON-RPC codes (our firmware)."""
    async with mini_gateway() as gw, SimulatedDevice(gw.url, "t", error_codes=True):
        await gw.recv()
        reply = await gw.request(1, "resources/list")
    assert reply["error"] == {"code": -32601, "message": "Method not implemented: resources/list"}


async def test_run_forever_reconnects_after_a_drop_and_a_refusal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """run_forever logs a refusal, retries, and comes back after the gateway closes."""
    monkeypatch.setattr(fw_device, "backoff", lambda attempt, low, high: 0.0)
    caplog.set_level(logging.INFO, logger="device_fw")
    async with mini_gateway(refuse=401, refusals=1) as gw:
        dev = SimulatedDevice(gw.url, "t")
        task = asyncio.create_task(dev.run_forever(), name="test.run_forever")
        first = await gw.next_connection()
        await gw.recv()
        # Frames are handled in order: once this is answered, the server hello was accepted.
        await gw.request(1, "initialize")
        await first.close()
        second = await gw.next_connection()
        assert second is not first
        task.cancel()
        with anyio.fail_after(bound()):
            await asyncio.wait({task})
    assert len(gw.requests) == 3
    assert "WebSocket upgrade refused: HTTP/1.1 401" in caplog.text
    assert "02:00:00:00:00:01: disconnected" in caplog.text
    assert gw.requests[1].headers["Client-Id"] == gw.requests[2].headers["Client-Id"]


def test_backoff_grows_from_one_to_thirty_seconds_with_jitter() -> None:
    """Delays stay within [1, 30] s, and the ceiling doubles per attempt (the firmware's rule)."""
    for attempt in range(12):
        ceiling = min(30.0, 2.0**attempt)
        for _ in range(20):
            assert max(1.0, ceiling / 2) <= backoff_delay(attempt) <= ceiling
    assert backoff_delay(0) == 1.0


async def _raw_text(gw: Any) -> str:
    async with asyncio.timeout(bound()):
        frame = await gw.raw.get()
    assert isinstance(frame, str)
    return frame


async def _true(args: Args) -> bool:
    return True
