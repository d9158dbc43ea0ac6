"""The MCP surface, in memory: the SDK's own Client against the gateway's Server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import mcp.types as types
import pytest
from mcp import Client, MCPError

from gateway.errors import DeviceToolError
from gateway.mcp_server import to_call_result
from tests.conftest import bound, make_config
from tests.fakes import ScriptedSession, Stack, tool

pytestmark = pytest.mark.anyio

PNG_1PX = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


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
    assert [t.name for t in result.tools] == ["list_devices", "call_device_tool",
                                              "board_aa00_b", "board_aa00_a"]  # fmt: skip
    device_tool = result.tools[2]
    assert device_tool.description == "[board_aa00] does self.b"


async def test_auto_mode_switches_to_meta_tools_above_the_threshold(tmp_path: Path) -> None:
    """A fleet with more tools than tools.meta_threshold is served through the meta-tools."""
    stack = Stack(make_config(tmp_path, meta_threshold=3))
    online(stack, "aa:01", [tool(f"self.t{i}") for i in range(4)])
    async with Client(stack.frontend.server, mode="legacy") as client:
        names = [t.name for t in (await client.list_tools()).tools]
        called = await client.call_tool(
            "call_device_tool", {"device": "board_aa01", "tool": "t3", "arguments": {}}
        )
    stack.close()
    assert names == ["list_devices", "call_device_tool"]
    assert called.content[0].text == "ok"


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
    shown_tools = {t.name: t for t in shown.frontend.tools()}
    hidden.close(), shown.close()
    assert hidden_names == ["board_aa03_x"]
    assert shown_tools["board_aa03_reboot"].annotations.destructive_hint is True


def test_stock_image_content_becomes_a_standard_image() -> None:
    """The stock firmware's image item (a JSON string under "image") becomes ImageContent."""
    stock = {"type": "image", "image": json.dumps({"type": "image", "mimeType": "image/png",
                                                   "data": PNG_1PX})}  # fmt: skip
    result = to_call_result({"content": [stock, {"type": "text", "text": "hi"}, {"type": "odd"}]})
    image, text, odd = result.content
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    assert isinstance(text, types.TextContent) and text.text == "hi"
    assert isinstance(odd, types.TextContent) and json.loads(odd.text) == {"type": "odd"}
    assert not result.is_error


def test_device_is_error_result_passes_through() -> None:
    """A device result with isError true stays an error for the host."""
    assert to_call_result({"content": [], "isError": True}).is_error


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
