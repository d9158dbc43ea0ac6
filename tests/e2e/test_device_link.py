"""The device WebSocket as a raw client sees it: handshake, hello, bad input that loses nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.e2e.helpers import STOCK_HELLO, listed_device, receive_json, stock_headers

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def test_server_hello_answers_the_stock_hello(tmp_path: Path) -> None:
    """The hello reply has a string transport and a plain session id; then discovery starts."""
    async with (
        gateway(tmp_path) as run,
        connect(run.device_url, additional_headers=stock_headers()) as ws,
    ):
        await ws.send(json.dumps(STOCK_HELLO))
        hello = await receive_json(ws)
        initialize = await receive_json(ws)
    assert hello["type"] == "hello" and hello["transport"] == "websocket"
    session_id = hello["session_id"]
    assert isinstance(session_id, str) and session_id.replace("-", "").isalnum()
    assert initialize["type"] == "mcp" and initialize["session_id"] == session_id
    payload = initialize["payload"]
    assert isinstance(payload, dict) and payload["method"] == "initialize"
    assert isinstance(payload["id"], int)


async def test_query_parameters_authenticate_too(tmp_path: Path) -> None:
    """Clients that send token and ids as query parameters are accepted."""
    async with gateway(tmp_path) as run:
        url = f"{run.device_url}?token={DEVICE_TOKEN}&device-id=AA:BB:CC:DD:EE:02&client-id=c2"
        async with connect(url) as ws:
            await ws.send(json.dumps(STOCK_HELLO))
            assert (await receive_json(ws))["type"] == "hello"
            device = run.gateway.registry.find("aa:bb:cc:dd:ee:02")
            assert device is not None and device.online and device.record.client_id == "c2"


@pytest.mark.parametrize(
    "headers",
    [
        {"Device-Id": "aa:bb:cc:dd:ee:03"},
        {"Device-Id": "aa:bb:cc:dd:ee:03", "Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {DEVICE_TOKEN}"},
    ],
    ids=["no token", "wrong token", "no device id"],
)
async def test_devices_without_valid_credentials_are_refused(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    """No token, a wrong token or no Device-Id: HTTP 403 before the upgrade."""
    async with gateway(tmp_path) as run:
        with pytest.raises(InvalidStatus) as excinfo:
            async with connect(run.device_url, additional_headers=headers):
                pass
    assert excinfo.value.response.status_code == 403


async def test_garbage_binary_and_other_types_are_ignored(tmp_path: Path) -> None:
    """Audio frames, malformed JSON and non-MCP messages neither close the link nor stop it."""
    async with (
        gateway(tmp_path) as run,
        connect(run.device_url, additional_headers=stock_headers()) as ws,
    ):
        await ws.send(json.dumps(STOCK_HELLO))
        await receive_json(ws)  # hello
        initialize = await receive_json(ws)
        await ws.send(b"\x00\x01opus-frame")
        await ws.send("{not json")
        await ws.send(json.dumps({"session_id": "", "type": "listen", "state": "start"}))
        await ws.send(json.dumps({"type": "mcp", "payload": "not an object"}))
        payload = initialize["payload"]
        assert isinstance(payload, dict)
        reply = {"jsonrpc": "2.0", "id": payload["id"], "result": {"serverInfo": {"name": "raw"}}}
        await ws.send(json.dumps({"session_id": "", "type": "mcp", "payload": reply}))
        listing = await receive_json(ws)
    assert isinstance(listing["payload"], dict)
    assert listing["payload"]["method"] == "tools/list"
    assert listing["payload"]["params"] == {"withUserTools": True}


async def test_oversize_frame_closes_only_that_device(tmp_path: Path) -> None:
    """A frame over max_message_bytes closes that link (1009); others carry on."""
    async with gateway(tmp_path, max_message_bytes=16384) as run, listed_device(run) as dev:
        async with connect(run.device_url, additional_headers=stock_headers(), max_size=None) as ws:
            await ws.send(json.dumps(STOCK_HELLO))
            await receive_json(ws)
            await ws.send("x" * 20_000)
            with anyio.fail_after(bound(5)), pytest.raises(ConnectionClosed) as excinfo:
                while True:
                    await ws.recv()
        assert excinfo.value.rcvd is not None and excinfo.value.rcvd.code == 1009
        assert dev.connected
        async with Client(run.mcp_url, mode="legacy") as client:
            result = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
        assert not result.is_error


async def test_device_that_never_says_hello_is_still_discovered(tmp_path: Path) -> None:
    """Without a hello, discovery starts after hello_timeout."""
    async with (
        gateway(tmp_path, hello_timeout=0.2) as run,
        connect(run.device_url, additional_headers=stock_headers()) as ws,
    ):
        initialize = await receive_json(ws)
    assert isinstance(initialize["payload"], dict)
    assert initialize["payload"]["method"] == "initialize"


async def seconds_until_closed(ws: ClientConnection, started: float) -> float:
    """Wait for the gateway to close ``ws``; return the seconds since ``started``."""
    with anyio.fail_after(bound(10)):
        await ws.wait_closed()
    return time.monotonic() - started


async def test_device_that_never_lists_its_tools_is_disconnected(tmp_path: Path) -> None:
    """A device that says hello but never answers initialize is closed discovery_timeout later."""
    async with (
        gateway(tmp_path, discovery_timeout=0.3, hello_timeout=5) as run,
        connect(run.device_url, additional_headers=stock_headers()) as ws,
    ):
        started = time.monotonic()
        await ws.send(json.dumps(STOCK_HELLO))
        elapsed = await seconds_until_closed(ws, started)
    # The deadline runs from the hello, not from hello_timeout after the connection.
    assert 0.3 <= elapsed < 0.3 + bound(0.7), f"closed {elapsed:.2f} s after the hello"


async def test_silent_device_is_disconnected_discovery_timeout_after_hello_timeout(
    tmp_path: Path,
) -> None:
    """Without a hello, discovery starts at hello_timeout and ends discovery_timeout later."""
    async with gateway(tmp_path, hello_timeout=0.2, discovery_timeout=0.3) as run:
        started = time.monotonic()  # before connecting: the gateway's clocks start later
        async with connect(run.device_url, additional_headers=stock_headers()) as ws:
            initialize = await receive_json(ws)
            discovering = time.monotonic() - started
            elapsed = await seconds_until_closed(ws, started)
    assert isinstance(initialize["payload"], dict)
    assert initialize["payload"]["method"] == "initialize"
    assert discovering >= 0.2, f"initialize came {discovering:.2f} s after connecting"
    assert 0.5 <= elapsed < 0.5 + bound(0.7), f"closed {elapsed:.2f} s after connecting"


async def test_host_cancellation_forgets_the_call(tmp_path: Path) -> None:
    """A host that gives up on a call leaves the gateway and device fine for the next call."""
    from mcp import MCPError

    async with gateway(tmp_path) as run, listed_device(run) as dev:
        async with Client(run.mcp_url, mode="legacy") as client:
            with pytest.raises(MCPError):
                await client.call_tool(
                    "sim-esp32_0001_slow_wait", {"seconds": 1}, read_timeout_seconds=0.2
                )
            result = await client.call_tool("sim-esp32_0001_lamp_get_state", {})
        assert not result.is_error
        assert [name for name, _ in dev.calls] == ["self.slow.wait", "self.lamp.get_state"]
    audit = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [entry["outcome"] for entry in audit] == ["cancelled", "ok"]
