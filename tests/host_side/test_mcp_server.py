"""The MCP surface, in memory: the SDK's own Client against the gateway's Server."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client, MCPError
from opentelemetry import trace

from gateway.errors import DeviceToolError
from gateway.host_side.call_results import call_result
from gateway.host_side.mcp_server import McpFrontend
from tests.conftest import bound, make_config
from tests.fakes import ScriptedSession, Stack, tool

pytestmark = pytest.mark.anyio

PNG_1PX = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

META = ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]  # page one


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(make_config(tmp_path / "data"))
    yield s
    s.close()


def online(stack: Stack, device_id: str, tools: list[dict[str, object]],
           session: ScriptedSession | None = None) -> ScriptedSession:  # fmt: skip
    session = session or ScriptedSession()
    stack.registry.connect(device_id, session, transport="websocket")
    stack.registry.set_catalogue(device_id, tuple(tools), {"name": "board"})
    return session


async def test_device_tools_follow_the_meta_tools_in_device_order(stack: Stack) -> None:
    """Meta-tools first, then each device's tools in the order the device listed them."""
    online(stack, "aa:00", [tool("self.b"), tool("self.a")])
    async with Client(stack.frontend.server, mode="legacy") as client:
        result = await client.list_tools()
        assert client.server_capabilities.tools.list_changed is True
    assert [t.name for t in result.tools] == [*META, "board_aa00_b", "board_aa00_a"]
    device_tool = result.tools[len(META)]
    assert device_tool.description == "[board_aa00] does self.b"


async def list_all(client: Client) -> list[types.Tool]:
    """Every tool, following nextCursor to the end."""
    result = await client.list_tools()
    tools = list(result.tools)
    while result.next_cursor:
        result = await client.list_tools(cursor=result.next_cursor)
        tools += result.tools
    return tools


async def test_auto_mode_groups_above_the_budget_and_never_drops_to_meta_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the budget the device's tools are grouped, still listed, and a log line says why."""
    caplog.set_level(logging.INFO, logger="gateway.host_side.tool_listing")
    stack = Stack(make_config(tmp_path, tools_budget=3))
    session = online(stack, "aa:01", [tool(f"self.t{i}") for i in range(4)])
    async with Client(stack.frontend.server, mode="legacy") as client:
        names = [t.name for t in await list_all(client)]
        grouped = await client.call_tool("t3", {"device": "board_aa01"})
        by_own_name = await client.call_tool("board_aa01_t2", {})
    stack.close()
    assert names == [
        "list_devices",
        "call_device_tool",
        "wait_for_event",
        "notify_device",
        "t0",
        "t1",
        "t2",
        "t3",
    ]
    assert not grouped.is_error and not by_own_name.is_error
    assert session.calls == [("self.t3", {}), ("self.t2", {})]
    assert "exceed the tools budget of 3" in caplog.text


async def test_meta_mode_lists_only_the_meta_tools(tmp_path: Path) -> None:
    """mode = "meta": only list_devices and call_device_tool, which reach every device."""
    stack = Stack(make_config(tmp_path, tools_mode="meta"))
    online(stack, "aa:01", [tool("self.t0")])
    async with Client(stack.frontend.server, mode="legacy") as client:
        names = [t.name for t in await list_all(client)]
        called = await client.call_tool(
            "call_device_tool", {"device": "board_aa01", "tool": "t0", "arguments": {}}
        )
    stack.close()
    assert names == ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
    assert called.content[0].text == "ok"


async def test_grouped_tools_route_by_the_device_argument(tmp_path: Path) -> None:
    """Twenty identical devices: each shared tool listed once; a call reaches the named device."""
    stack = Stack(make_config(tmp_path, tools_mode="grouped"))
    volume = tool("self.audio_speaker.set_volume", volume={"type": "integer"})
    sessions = [online(stack, f"aa:{n:02x}", [volume, tool("self.lamp.on")]) for n in range(20)]
    async with Client(stack.frontend.server, mode="legacy") as client:
        tools = {t.name: t for t in await list_all(client)}
        called = await client.call_tool(
            "audio_speaker_set_volume", {"device": "board_aa07", "volume": 30}
        )
        unknown = await client.call_tool("lamp_on", {"device": "kitchen"})
        missing = await client.call_tool("lamp_on", {})
    stack.close()
    assert list(tools) == ["list_devices", "call_device_tool", "wait_for_event", "notify_device",
                           "audio_speaker_set_volume", "lamp_on"]  # fmt: skip
    schema = tools["audio_speaker_set_volume"].input_schema
    assert schema["required"][0] == "device" and "volume" in schema["properties"]
    assert schema["properties"]["device"]["enum"] == [f"board_aa{n:02x}" for n in range(20)]
    assert not called.is_error
    assert [s.calls for s in sessions].count([]) == 19
    assert sessions[7].calls == [("self.audio_speaker.set_volume", {"volume": 30})]
    assert unknown.is_error and "no device 'kitchen' offers lamp_on" in unknown.content[0].text
    assert missing.is_error and "needs `device`" in missing.content[0].text


async def test_same_tool_with_other_schemas_gets_distinct_group_names(tmp_path: Path) -> None:
    """Two firmware versions whose set_volume schemas differ: two groups, neither name taken."""
    stack = Stack(make_config(tmp_path, tools_mode="grouped"))
    online(stack, "aa:01", [tool("self.set_volume", volume={"type": "integer"})])
    online(stack, "aa:02", [tool("self.set_volume", level={"type": "integer"})])
    online(stack, "aa:03", [tool("self.list_devices")])
    async with Client(stack.frontend.server, mode="legacy") as client:
        names = [t.name for t in await list_all(client)]
    stack.close()
    assert len(names) == len(set(names)) == len(META) + 3
    assert all(n.startswith(("set_volume_", "list_devices_")) for n in names[len(META) :]), names


async def test_offline_devices_past_the_age_are_not_listed_but_callable(tmp_path: Path) -> None:
    """A device gone longer than offline_age leaves the list; call_device_tool still finds it."""
    now = [1_000_000.0]
    stack = Stack(make_config(tmp_path, tools_offline_age=60), lambda: now[0])
    session = online(stack, "aa:01", [tool("self.t0")])
    stack.registry.disconnect("aa:01", session)
    now[0] -= 3600  # the registry's clock says it left an hour before the lister's "now"
    stack.registry.connect("aa:02", ScriptedSession())
    stack.registry.set_catalogue("aa:02", (tool("self.t0"),), {"name": "board"})
    async with Client(stack.frontend.server, mode="legacy") as client:
        names = [t.name for t in await list_all(client)]
        called = await client.call_tool(
            "call_device_tool", {"device": "board_aa01", "tool": "t0", "arguments": {}}
        )
    stack.close()
    assert "board_aa01_t0" not in names and "board_aa02_t0" in names
    assert called.is_error and "offline" in called.content[0].text


async def test_unknown_tool_is_a_protocol_error(stack: Stack) -> None:
    """Calling a name the gateway never listed is JSON-RPC -32602, as the spec says."""
    async with Client(stack.frontend.server, mode="legacy") as client:
        with pytest.raises(MCPError) as excinfo:
            await client.call_tool("nope", {})
    assert excinfo.value.error.code == types.INVALID_PARAMS


async def test_device_error_becomes_an_error_result_and_is_audited(stack: Stack) -> None:
    """A device's JSON-RPC error reaches the model as isError text; the audit log has it."""

    def fail(name: str, args: dict[str, object]) -> dict[str, object]:
        raise DeviceToolError("aa:02", "Value exceeds maximum allowed: 100")

    online(stack, "aa:02", [tool("self.set", level={"type": "integer"})], ScriptedSession(fail))
    async with Client(stack.frontend.server, mode="legacy") as client:
        result = await client.call_tool("board_aa02_set", {"level": 7})
    assert result.is_error and result.content[0].text == "Value exceeds maximum allowed: 100"
    stack.audit.flush()  # records of a moment are written together, a little later
    record = json.loads((stack.config.data_dir / "audit.log").read_text().splitlines()[-1])
    assert record["tool"] == "self.set" and record["arguments"] == {"level": 7}
    assert record["outcome"] == "DeviceToolError" and record["device"] == "board_aa02"


async def test_user_only_tools_hidden_unless_configured(tmp_path: Path) -> None:
    """A user-only tool is not listed, unless the device's user_tools names it."""
    from gateway.config import DeviceOptions

    reboot = {**tool("self.reboot"), "annotations": {"audience": ["user"]}}
    hidden = Stack(make_config(tmp_path / "a"))
    online(hidden, "aa:03", [tool("self.x"), reboot])
    shown = Stack(
        make_config(tmp_path / "b", devices={"aa:03": DeviceOptions(user_tools=("reboot",))})
    )
    online(shown, "aa:03", [tool("self.x"), reboot])
    hidden_names = [t.name for t in hidden.registry.exposed_tools()]
    shown_tools = {t["name"]: t for t in shown.frontend.tools()[0]}
    hidden.close(), shown.close()
    assert hidden_names == ["board_aa03_x"]
    assert shown_tools["board_aa03_reboot"]["annotations"]["destructiveHint"] is True


async def test_py_xiaozhi_s_launch_and_kill_are_user_only_by_default(tmp_path: Path) -> None:
    """py-xiaozhi's application.launch/kill act on its computer: the model gets neither.

    They are not listed, call_device_tool refuses them saying why, the person at the dashboard
    may still call them, and the device's user_tools hands them to the model.
    """
    from gateway.config import DeviceOptions

    app = {"type": "string"}
    acting = [
        tool("self.application.launch", app=app),
        tool("self.application.kill", app=app),
        tool("self.music.play"),
    ]
    default = Stack(make_config(tmp_path / "a"))
    online(default, "aa:04", acting, ScriptedSession())
    opted_in = Stack(
        make_config(tmp_path / "b", devices={"aa:04": DeviceOptions(user_tools=("application.*",))})
    )
    online(opted_in, "aa:04", acting)
    async with Client(default.frontend.server, mode="legacy") as client:
        listed = [t.name for t in (await client.list_tools()).tools]
        arguments = {"app": "bash"}
        call = {"device": "board_aa04", "tool": "self.application.launch", "arguments": arguments}
        refused = await client.call_tool("call_device_tool", call)
    device = default.registry.find("board_aa04")
    assert device is not None
    launch = device.tools["self.application.launch"]
    opted_names = [t.name for t in opted_in.registry.exposed_tools()]
    default.close(), opted_in.close()
    assert "board_aa04_music_play" in listed
    assert not any("application" in name for name in listed)
    said = refused.content[0]
    assert isinstance(said, types.TextContent) and refused.is_error
    assert "acts on the computer the device software runs on" in said.text
    assert launch.refused(user=True) is None  # the dashboard's user may
    assert {"board_aa04_application_launch", "board_aa04_application_kill"} <= set(opted_names)


def test_stock_image_content_becomes_a_standard_image() -> None:
    """The stock firmware's image item (a JSON string under "image") becomes ImageContent."""
    stock = {"type": "image", "image": json.dumps({"type": "image", "mimeType": "image/png",
                                                   "data": PNG_1PX})}  # fmt: skip
    wire = call_result({"content": [stock, {"type": "text", "text": "hi"}, {"type": "odd"}]})
    result = types.CallToolResult.model_validate(wire)  # as the SDK checks it
    image, text, odd = result.content
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    assert isinstance(text, types.TextContent) and text.text == "hi"
    assert isinstance(odd, types.TextContent) and json.loads(odd.text) == {"type": "odd"}
    assert not result.is_error


class InstalledProvider(trace.TracerProvider):
    """A tracer provider someone installed (``opentelemetry-instrument``, an embedding program)."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return trace.NoOpTracer()


def test_the_sdk_makes_spans_only_when_a_tracer_provider_is_installed(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No provider (the gateway installs none): no span per message, which would go nowhere;
    with one, the SDK's span middleware wraps every message as it does in any SDK server."""
    assert stack.frontend.server.middleware == []
    monkeypatch.setattr(trace, "get_tracer_provider", InstalledProvider)
    traced = McpFrontend(stack.config, stack.registry, stack.router)
    assert [type(m).__name__ for m in traced.server.middleware] == ["OpenTelemetryMiddleware"]


def test_device_is_error_result_passes_through() -> None:
    """A device result with isError true stays an error for the host."""
    assert call_result({"content": [], "isError": True})["isError"] is True


async def test_a_storm_of_joins_sends_a_bounded_number_of_notifications(stack: Stack) -> None:
    """Two hundred joins, each a change, reach hosts as a handful of tools/list_changed."""
    sent: list[int] = []
    notified = asyncio.Event()

    async def count() -> None:
        sent.append(len(stack.registry.exposed_tools()))
        notified.set()

    stack.frontend.notifier.tools_changed = count  # type: ignore[method-assign]
    forwarder = asyncio.create_task(stack.frontend.forward_changes())
    await asyncio.sleep(0)  # let it subscribe
    for n in range(200):
        online(stack, f"aa:{n:04x}", [tool("self.a")])
        await asyncio.sleep(0)  # each join is its own step of the loop, as from a socket
    async with asyncio.timeout(bound(5)):
        while not sent or sent[-1] < 200:  # until a notification reflects the whole storm
            await notified.wait()
            notified.clear()
    forwarder.cancel()
    await asyncio.gather(forwarder, return_exceptions=True)
    assert len(sent) <= 3, sent
