"""End to end over streamable HTTP and SSE: real uvicorn, real WebSocket devices, SDK clients."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged

from gateway.devices.naming import NAME_PATTERN
from gateway.simulator import SimTool, SimulatedDevice
from tests.conftest import bound, gateway
from tests.e2e.helpers import Inbox, listed_device

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def pages_of(dev: SimulatedDevice) -> int:
    """How many tools/list pages the device needs for its whole catalogue."""
    pages, cursor = 1, dev.mcp.page("", with_user_tools=True).get("nextCursor")
    while cursor:
        pages += 1
        cursor = dev.mcp.page(cursor, with_user_tools=True).get("nextCursor")
    return pages


async def test_device_tools_are_listed_with_valid_names(tmp_path: Path) -> None:
    """Every tool of a device whose list spans 3+ pages shows up, each name valid for Claude."""
    async with gateway(tmp_path) as run, listed_device(run) as dev:
        async with Client(run.mcp_url, mode="legacy") as client:
            tools = (await client.list_tools()).tools
    names = [t.name for t in tools]
    assert all(NAME_PATTERN.match(n) for n in names), names
    assert len(set(names)) == len(names)
    assert names[:4] == ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
    visible = [t for t in dev.mcp.tools if not t.user_only]
    assert pages_of(dev) >= 3
    assert len(names) == 4 + len(visible)
    assert "sim-esp32_0001_lamp_turn_on" in names
    assert not any("reboot" in n for n in names)  # user-only: hidden from the model


async def test_call_reaches_the_device_and_the_result_comes_back(tmp_path: Path) -> None:
    """A value set by one call is read back by another, through the gateway."""
    async with gateway(tmp_path) as run, listed_device(run) as dev:
        async with Client(run.mcp_url, mode="legacy") as client:
            on = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
            state = await client.call_tool("sim-esp32_0001_lamp_get_state", {})
    assert not on.is_error and on.content[0].text == "true"
    assert json.loads(state.content[0].text)["power"] is True
    assert [name for name, _ in dev.calls] == ["self.lamp.turn_on", "self.lamp.get_state"]


async def test_a_call_that_streams_nothing_is_answered_as_json_on_a_kept_connection(
    tmp_path: Path,
) -> None:
    """A tool call POSTed with both content types accepted comes back as one JSON answer, read
    to its end, so the host's next call goes over the same connection."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "sim-esp32_0001_lamp_get_state", "arguments": {}}}  # fmt: skip
    async with gateway(tmp_path) as run, listed_device(run), httpx2.AsyncClient() as http:
        reply = await http.post(run.mcp_url, json=init, headers=headers)
        headers |= {"mcp-session-id": reply.headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18"}  # fmt: skip
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await http.post(run.mcp_url, json=initialized, headers=headers)).status_code == 202
        ports = []
        for number in (2, 3):
            answer = await http.post(run.mcp_url, json={**call, "id": number}, headers=headers)
            assert answer.headers["content-type"] == "application/json"
            assert answer.json()["id"] == number and "power" in answer.text
            ports.append(answer.extensions["network_stream"].get_extra_info("client_addr")[1])
    assert ports[0] == ports[1]


async def test_list_changed_reaches_every_http_session(tmp_path: Path) -> None:
    """Several HTTP sessions are each told when a device connects and when its tools change."""
    async with gateway(tmp_path) as run, AsyncExitStack() as stack:
        inboxes = [Inbox() for _ in range(3)]
        for inbox in inboxes:
            await stack.enter_async_context(
                Client(run.mcp_url, mode="legacy", message_handler=inbox)
            )
        with anyio.fail_after(bound(5)):
            await run.gateway.frontend.notifier.wait_for_sessions(3)
        async with listed_device(run) as dev:
            for inbox in inboxes:
                await inbox.next_change()
            await dev.add_tool(SimTool("self.fan.spin", "Spin the fan.", {}, _ok))
            for inbox in inboxes:
                await inbox.next_change()


async def test_modern_client_gets_list_changed_on_its_listen_stream(tmp_path: Path) -> None:
    """A 2026-era client (subscriptions/listen) is told of a new device too."""
    async with gateway(tmp_path) as run, Client(run.mcp_url) as client:
        assert client.protocol_version == "2026-07-28"
        async with client.listen(tools_list_changed=True) as events, listed_device(run):
            with anyio.fail_after(bound(5)):
                event = await events.__anext__()
            assert isinstance(event, ToolsListChanged)
            names = [t.name for t in (await client.list_tools()).tools]
            assert "sim-esp32_0001_lamp_turn_on" in names


async def test_sse_session_lists_calls_and_gets_list_changed(tmp_path: Path) -> None:
    """Legacy SSE clients see tools, call them, and get list_changed."""
    async with gateway(tmp_path) as run:
        url = f"http://127.0.0.1:{run.host_port}/sse"
        inbox = Inbox()
        async with (
            sse_client(url) as (read, write),
            ClientSession(read, write, message_handler=inbox) as session,
        ):
            init = await session.initialize()
            assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
            with anyio.fail_after(bound(5)):
                await run.gateway.frontend.notifier.wait_for_sessions(1)
            async with listed_device(run):
                await inbox.next_change()
                result = await session.call_tool(
                    "sim-esp32_0001_audio_speaker_set_volume", {"volume": 30}
                )
                assert not result.is_error


async def test_disconnect_mid_call_fails_at_once(tmp_path: Path) -> None:
    """A device that vanishes during a call fails the call now, not at the 30 s timeout."""
    async with gateway(tmp_path, call_timeout=30.0) as run, listed_device(run) as dev:
        async with Client(run.mcp_url, mode="legacy") as client, anyio.create_task_group() as tg:
            results = []
            done = anyio.Event()

            async def slow_call() -> None:
                results.append(await client.call_tool("sim-esp32_0001_slow_wait", {"seconds": 20}))
                done.set()

            tg.start_soon(slow_call)
            await dev.wait_for_call("self.slow.wait", bound(5))
            with anyio.fail_after(bound(2)):  # far below the 30 s call timeout
                await dev.drop()
                await done.wait()
    assert results[0].is_error
    assert "disconnected" in results[0].content[0].text


async def test_call_to_offline_device_gets_the_offline_message(tmp_path: Path) -> None:
    """Tools of a device that went away stay listed; calling one says it is offline."""
    async with gateway(tmp_path) as run:
        async with listed_device(run) as dev:
            pass
        assert not dev.connected
        async with Client(run.mcp_url, mode="legacy") as client:
            names = [t.name for t in (await client.list_tools()).tools]
            assert "sim-esp32_0001_lamp_turn_on" in names  # offline_tools = "keep"
            result = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
    assert result.is_error
    assert "sim-esp32_0001 is offline (last seen" in result.content[0].text


async def test_bad_arguments_are_refused_before_reaching_the_device(tmp_path: Path) -> None:
    """Arguments that break the tool's schema get a clear error; the device never sees them."""
    async with gateway(tmp_path) as run, listed_device(run) as dev:
        async with Client(run.mcp_url, mode="legacy") as client:
            result = await client.call_tool(
                "sim-esp32_0001_audio_speaker_set_volume", {"volume": 150}
            )
    assert result.is_error
    assert "150 is greater than the maximum of 100" in result.content[0].text
    assert dev.calls == []


async def test_device_error_without_code_becomes_an_error_result(tmp_path: Path) -> None:
    """A stock-style JSON-RPC error (no code) reaches the host as isError with its message."""
    async with gateway(tmp_path) as run, listed_device(run):
        async with Client(run.mcp_url, mode="legacy") as client:
            result = await client.call_tool(
                "call_device_tool",
                {"device": "sim-esp32_0001", "tool": "self.screen.set_theme",
                 "arguments": {"theme": "purple"}},
            )  # fmt: skip
    assert result.is_error or result.content[0].text == "false"


async def test_meta_tools_list_and_call_devices(tmp_path: Path) -> None:
    """list_devices shows the device; call_device_tool calls by device and tool name."""
    async with gateway(tmp_path) as run, listed_device(run):
        async with Client(run.mcp_url, mode="legacy") as client:
            listing = await client.call_tool("list_devices", {})
            devices = json.loads(listing.content[0].text)["devices"]
            result = await client.call_tool(
                "call_device_tool",
                {"device": "02:00:00:00:00:01", "tool": "lamp.turn_on", "arguments": {}},
            )
            refused = await client.call_tool(
                "call_device_tool", {"device": "sim-esp32_0001", "tool": "self.reboot"}
            )
            unknown = await client.call_tool("call_device_tool", {"device": "x", "tool": "y"})
    assert devices[0]["device"] == "sim-esp32_0001" and devices[0]["online"] is True
    assert devices[0]["firmware"] == "2.4.2"  # the simulated stock firmware's serverInfo
    assert not any(t["tool"] == "self.reboot" for t in devices[0]["tools"])
    assert not result.is_error and result.content[0].text == "true"
    assert refused.is_error and "user-only" in refused.content[0].text
    assert unknown.is_error and "unknown device 'x'" in unknown.content[0].text


async def test_meta_mode_lists_only_the_meta_tools(tmp_path: Path) -> None:
    """tools.mode = "meta" keeps the list to list_devices and call_device_tool."""
    async with gateway(tmp_path, tools_mode="meta") as run, listed_device(run):
        async with Client(run.mcp_url, mode="legacy") as client:
            names = [t.name for t in (await client.list_tools()).tools]
    assert names == ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]


async def test_host_token_and_host_origin_checks(tmp_path: Path) -> None:
    """A host token is enforced on MCP routes; foreign Host/Origin headers are refused."""
    async with gateway(tmp_path, host_token="host-secret") as run:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
        headers = {"Accept": "application/json, text/event-stream"}
        auth = {**headers, "Authorization": "Bearer host-secret"}
        async with httpx2.AsyncClient() as http:
            no_token = await http.post(run.mcp_url, json=init, headers=headers)
            wrong = await http.post(
                run.mcp_url, json=init, headers={**headers, "Authorization": "Bearer nope"}
            )
            evil_host = await http.post(
                run.mcp_url, json=init, headers={**auth, "Host": "evil.test"}
            )
            evil_origin = await http.post(
                run.mcp_url, json=init, headers={**auth, "Origin": "http://evil.test"}
            )
            api = await http.get(f"http://127.0.0.1:{run.host_port}/api/devices")
            health = await http.get(f"http://127.0.0.1:{run.host_port}/healthz")
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer host-secret"}) as http:
            async with Client(streamable_http_client(run.mcp_url, http_client=http)) as client:
                assert [t.name for t in (await client.list_tools()).tools][:1] == ["list_devices"]
    assert no_token.status_code == 401 and "Bearer" in no_token.headers["www-authenticate"]
    assert wrong.status_code == 401
    assert evil_host.status_code == 421
    assert evil_origin.status_code == 403
    assert api.status_code == 401
    assert health.status_code == 200


async def test_tool_names_are_stable_across_restarts(tmp_path: Path) -> None:
    """After a restart the registry still knows the device, its tools and their names."""
    async with gateway(tmp_path) as run, listed_device(run):
        async with Client(run.mcp_url, mode="legacy") as client:
            before = [t.name for t in (await client.list_tools()).tools]
    async with gateway(tmp_path) as run:
        async with Client(run.mcp_url, mode="legacy") as client:
            after = [t.name for t in (await client.list_tools()).tools]
            devices = json.loads((await client.call_tool("list_devices", {})).content[0].text)
    assert after == before
    assert devices["devices"][0]["online"] is False


async def _ok(args: object) -> bool:
    return True


async def test_device_that_never_answers_times_out(tmp_path: Path) -> None:
    """A call the device never answers ends at the configured timeout with a clear error."""
    from gateway.config import DeviceOptions

    devices = {"02:00:00:00:00:01": DeviceOptions(tool_timeouts={"self.slow.wait": 0.3})}
    async with gateway(tmp_path, devices=devices) as run, listed_device(run):
        async with Client(run.mcp_url, mode="legacy") as client:
            result = await client.call_tool("sim-esp32_0001_slow_wait", {"seconds": 30})
    assert result.is_error
    assert "did not answer self.slow.wait within 0.3 s" in result.content[0].text


async def test_second_device_joins_with_its_own_names(tmp_path: Path) -> None:
    """Two devices with the same board get distinct aliases and both are callable."""
    async with (
        gateway(tmp_path) as run,
        listed_device(run),
        listed_device(run, device_id="02:00:00:00:00:02"),
    ):
        async with Client(run.mcp_url, mode="legacy") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            second = await client.call_tool("sim-esp32_0002_lamp_turn_on", {})
    assert {"sim-esp32_0001_lamp_turn_on", "sim-esp32_0002_lamp_turn_on"} <= names
    assert not second.is_error


async def test_refused_device_token(tmp_path: Path) -> None:
    """A device with a wrong token is refused before the WebSocket upgrade."""
    from gateway.simulator import HandshakeRefused

    async with gateway(tmp_path) as run:
        with pytest.raises(HandshakeRefused, match="403"):
            async with SimulatedDevice(run.device_url, "wrong", device_id="02:00:00:00:00:09"):
                pass
        assert run.gateway.registry.find("02:00:00:00:00:09") is None
