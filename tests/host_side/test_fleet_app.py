"""The fleet as an MCP App, with the SDK's own Client: negotiated, it gets the panel; not, nothing
changes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mcp.types as types
import pytest
from mcp import Client, MCPError
from mcp.client.extension import advertise

from gateway.devices.photos import PhotoStore
from gateway.host_side.fleet_app import APP_MIME_TYPE, EXTENSION_ID, PANEL_URI, FleetApp
from gateway.host_side.mcp_server import McpFrontend
from tests.conftest import make_config
from tests.fakes import Stack, tool

pytestmark = pytest.mark.anyio

APPS = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})
ERAS = ["legacy", "auto"]  # auto: server/discover, so 2026-07-28
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(make_config(tmp_path / "data"))
    s.photos = PhotoStore(tmp_path / "data" / "photos")  # type: ignore[attr-defined]
    s.frontend = McpFrontend(s.config, s.registry.known, s.router, s.photos)  # type: ignore[attr-defined]
    s.registry.connect("aa:00", _Session(), transport="websocket")
    s.registry.set_catalogue("aa:00", (tool("self.lamp.turn_on"),), {"name": "board"})
    yield s
    s.close()


class _Session:
    async def call(self, *args: object, **kwargs: object) -> dict[str, object]:
        return {"content": [{"type": "text", "text": "true"}]}

    async def aclose(self) -> None:
        pass


def ui_of(tools: list[types.Tool]) -> object:
    listing = next(t for t in tools if t.name == "list_devices")
    return (listing.meta or {}).get("ui")


@pytest.mark.parametrize("mode", ERAS)
async def test_a_host_with_mcp_apps_gets_the_panel(stack: Stack, mode: str) -> None:
    """The extension is advertised; list_devices points at a ui:// panel the host can read,
    listed as a resource, with a CSP that allows no outside origin; the call carries the
    devices as structuredContent beside the unchanged text."""
    await stack.photos.keep("aa:00", PNG, "image/png", "what is on the desk")  # type: ignore[attr-defined]
    async with Client(stack.frontend.server, mode=mode, extensions=[APPS]) as client:  # type: ignore[arg-type]
        # The SDK sieves results by the era's schema: 2025-11-25 has no capabilities.extensions,
        # so only 2026-era hosts see the advertisement; both are recognised by their own.
        modern = client.protocol_version == "2026-07-28"
        expected = {EXTENSION_ID: {"mimeTypes": [APP_MIME_TYPE]}} if modern else None
        assert client.server_capabilities.extensions == expected
        tools = (await client.list_tools()).tools
        listed = [r.uri for r in (await client.list_resources()).resources]
        panel = (await client.read_resource(PANEL_URI)).contents[0]
        result = await client.call_tool("list_devices", {})
    assert ui_of(tools) == {"resourceUri": PANEL_URI}
    assert listed == [PANEL_URI, "device://board_aa00/photo/latest"]
    assert isinstance(panel, types.TextResourceContents)
    assert panel.mime_type == "text/html;profile=mcp-app"
    assert panel.meta is not None and panel.meta["ui"]["csp"]["connectDomains"] == []
    assert "ui/initialize" in panel.text and "Forms.build" in panel.text
    assert "http://" not in panel.text and "https://" not in panel.text  # nothing outside
    text = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert result.structured_content is not None
    device = result.structured_content["devices"][0]
    assert device["photo"]["uri"] == "device://board_aa00/photo/latest"
    assert {k: v for k, v in device.items() if k != "photo"} == text["devices"][0]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_host_without_mcp_apps_gets_what_it_always_got(stack: Stack, mode: str) -> None:
    """No _meta.ui, no panel in the resources, no structuredContent: text only, as before."""
    async with Client(stack.frontend.server, mode=mode) as client:  # type: ignore[arg-type]
        tools = (await client.list_tools()).tools
        listed = [r.uri for r in (await client.list_resources()).resources]
        result = await client.call_tool("list_devices", {})
    assert ui_of(tools) is None
    assert PANEL_URI not in listed
    assert result.structured_content is None
    assert json.loads(result.content[0].text)["devices"][0]["device"] == "board_aa00"  # type: ignore[union-attr]


async def test_a_host_that_lists_other_mime_types_only_gets_no_panel(stack: Stack) -> None:
    """Advertising the extension without the panel's MIME type is not enough to get it."""
    other = advertise(EXTENSION_ID, {"mimeTypes": ["text/uri-list"]})
    async with Client(stack.frontend.server, mode="legacy", extensions=[other]) as client:
        assert ui_of((await client.list_tools()).tools) is None


async def test_unknown_resources_are_a_clear_error_without_photos(tmp_path: Path) -> None:
    """With no photo store the panel is still served (and the event templates: every device
    has events); any other URI is 'not found'."""
    s = Stack(make_config(tmp_path / "data"))
    try:
        async with Client(s.frontend.server, mode="legacy", extensions=[APPS]) as client:
            listed = [r.uri for r in (await client.list_resources()).resources]
            templates = (await client.list_resource_templates()).resource_templates
            with pytest.raises(MCPError, match="Resource not found"):
                await client.read_resource("device://x/photo/latest")
    finally:
        s.close()
    assert listed == [PANEL_URI]
    assert [t.uri_template for t in templates] == [
        "device://{device}/events",
        "device://{device}/state",
    ]


def test_structured_listing_without_a_photo_store_is_the_listing() -> None:
    answer = {"devices": [{"id": "aa", "device": "a"}], "next_cursor": "x"}
    assert FleetApp(None).structured(answer) == answer
