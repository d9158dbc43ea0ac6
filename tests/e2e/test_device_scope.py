"""Which devices each caller may use, end to end: a named host token, and an OAuth app the owner
limited on the consent page (headless Chromium), each limited to one device, on a real gateway
with two simulated boards, through the MCP Python SDK's own client. Its tools/list,
list_devices (and so the devices panel's data), photo resources and every way of calling see
the one device only; a call to the other is answered as one to a device that does not exist, and
audited with the token's name. The host token still sees both."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, MCPError
from mcp.client.extension import advertise
from mcp.client.streamable_http import streamable_http_client
from playwright.async_api import Page

from gateway.app import Running
from gateway.config import HostTokenOptions
from gateway.devices.name_rules import META_TOOL_NAMES
from gateway.host_side import confirm_asks as asks
from gateway.host_side.fleet_app import APP_MIME_TYPE, EXTENSION_ID
from tests.conftest import bound, gateway
from tests.e2e.helpers import Inbox, listed_device
from tests.e2e.test_fleet_app import PNG
from tests.e2e.test_oauth import signed_in_dashboard
from tests.oauth_helpers import (
    ConsentBrowser,
    MemoryStorage,
    callback_server,
    consent_browser,
    oauth_gateway,
    sdk_auth,
    sdk_client,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

HOST_TOKEN = "the-owners-host-token-0123"
TABLET = HostTokenOptions("tablet", "tablet-token-0123456789", ("sim-esp32_0002",))
MINE, OTHER = "02:00:00:00:00:02", "02:00:00:00:00:01"  # sim-esp32_0002, sim-esp32_0001
PANEL = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})  # the fleet panel's data too

META = len(META_TOOL_NAMES)  # the meta-tools every listing starts with


@asynccontextmanager
async def client_with(run: Running, token: str) -> AsyncIterator[Client]:
    """An SDK client of /mcp with ``token`` as its bearer, negotiating the devices panel."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=bound(30)) as http:
        transport = streamable_http_client(run.mcp_url, http_client=http)
        async with Client(transport, extensions=[PANEL]) as client:
            yield client


def devices_in(result: types.CallToolResult) -> list[str]:
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return [device["device"] for device in json.loads(block.text)["devices"]]


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def unknown_tool(client: Client, name: str) -> str:
    with pytest.raises(MCPError) as refused:
        await client.call_tool(name, {"volume": 10})
    return str(refused.value)


async def unknown_photo(client: Client, uri: str) -> str:
    with pytest.raises(MCPError) as refused:
        await client.read_resource(uri)
    return str(refused.value)


async def test_a_named_token_limited_to_one_device_sees_and_calls_nothing_else(
    tmp_path: Path,
) -> None:
    """tools/list, list_devices, its panel copy, resources, calls by name and by reference: the
    other device is nowhere, and calling it gets the words a device that never existed gets;
    each refusal is audited as out of scope, naming the token; the other board saw no call."""
    async with (
        gateway(tmp_path, host_token=HOST_TOKEN, host_tokens=(TABLET,)) as run,
        listed_device(run, OTHER) as other,
        listed_device(run, MINE) as mine,
    ):
        for device_id in (MINE, OTHER):
            await run.gateway.photos.keep(device_id, PNG, "image/png", "what is there?")
        async with client_with(run, TABLET.token) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            device_tools = [n for n in names if n not in META_TOOL_NAMES | {asks.PANEL_TOOL}]
            assert META_TOOL_NAMES <= set(names)
            assert device_tools and all(n.startswith("sim-esp32_0002_") for n in device_tools)
            listing = await client.call_tool("list_devices", {})
            assert devices_in(listing) == ["sim-esp32_0002"]
            panel = listing.structured_content or {}
            assert [d["device"] for d in panel["devices"]] == ["sim-esp32_0002"]
            assert devices_in(await client.call_tool("list_devices", {"name": "*0001"})) == []
            resources = [str(r.uri) for r in (await client.list_resources()).resources]
            assert [u for u in resources if u.startswith("device://")] == [
                "device://sim-esp32_0002/photo/latest"
            ]
            assert (await client.read_resource("device://sim-esp32_0002/photo/latest")).contents
            assert (await unknown_photo(client, "device://sim-esp32_0001/photo/latest")) == (
                await unknown_photo(client, "device://no-such/photo/latest")
            ).replace("no-such", "sim-esp32_0001")
            # Calls: by the other's tool name, by reference, and one that goes through.
            other_tool = "sim-esp32_0001_audio_speaker_set_volume"
            assert (await unknown_tool(client, other_tool)) == (
                await unknown_tool(client, "sim-esp32_0009_audio_speaker_set_volume")
            ).replace("0009", "0001")
            by_ref = {"tool": "self.audio_speaker.set_volume", "arguments": {"volume": 10}}
            refused = await client.call_tool(
                "call_device_tool", {"device": "sim-esp32_0001", **by_ref}
            )
            never = await client.call_tool("call_device_tool", {"device": "nope", **by_ref})
            assert refused.is_error and never.is_error
            assert text_of(refused) == text_of(never).replace("'nope'", "'sim-esp32_0001'")
            assert "sim-esp32_0001" not in text_of(never)  # the known devices: its own only
            message = {"message": "dinner is ready"}
            not_told = await client.call_tool(
                "notify_device", {"device": "sim-esp32_0001", **message}
            )
            assert not_told.is_error and "unknown device 'sim-esp32_0001'" in text_of(not_told)
            done = await client.call_tool("sim-esp32_0002_audio_speaker_set_volume", {"volume": 7})
            assert not done.is_error, done
        assert ("self.audio_speaker.set_volume", {"volume": 7}) in mine.calls
        assert other.calls == []
        async with client_with(run, HOST_TOKEN) as owner:  # the host token: every device
            assert devices_in(await owner.call_tool("list_devices", {})) == [
                "sim-esp32_0001",
                "sim-esp32_0002",
            ]
        run.gateway.audit.flush()
        records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
        out = [r for r in records if r.get("outcome") == "out_of_scope"]
        assert len(out) == 3 and all(r["device_id"] == OTHER for r in out)
        assert all("token 'tablet'" in r["caller"] for r in out)
        assert all("outside the devices this caller may use" in r["message"] for r in out)
        assert TABLET.token not in (tmp_path / "audit.log").read_text()


async def test_a_named_token_opens_the_mcp_paths_only(tmp_path: Path) -> None:
    """The dashboard's JSON API sees every device: a named token is refused there."""
    async with (
        gateway(tmp_path, host_token=HOST_TOKEN, host_tokens=(TABLET,)) as run,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{run.host_port}", timeout=bound(10)) as http,
    ):
        named = await http.get("/api/devices", headers={"Authorization": f"Bearer {TABLET.token}"})
        owner = await http.get("/api/devices", headers={"Authorization": f"Bearer {HOST_TOKEN}"})
    assert named.status_code == 401 and owner.status_code == 200


@dataclass
class ChoosingOwner(ConsentBrowser):
    """The owner who, on the consent page, chooses "only these" and ticks ``devices``."""

    devices: tuple[str, ...] = ()

    async def answer(self, page: Page) -> None:
        await page.wait_for_selector("#allow")
        await page.check("#devices-some")
        for device_id in self.devices:
            await page.check(f'#device-list input[value="{device_id}"]')
        await super().answer(page)


async def test_an_app_limited_on_the_consent_page_and_changed_in_connected_apps(
    tmp_path: Path,
) -> None:
    """The owner ticks one of two devices on the consent page (headless Chromium): the app's
    tools/list and list_devices hold that one only, and its call to the other is refused as
    unknown; the owner then changes the app to the other device by name glob in Connected apps:
    the app's session is told its list changed, and its next tools/list, over the same
    session, holds that device only."""
    async with (
        oauth_gateway(tmp_path) as run,
        listed_device(run, OTHER),
        listed_device(run, MINE),
        callback_server() as callback,
        consent_browser() as browser,
    ):
        owner = ChoosingOwner(browser.browser, devices=(MINE,))
        storage = MemoryStorage()
        auth = sdk_auth(run, owner, callback, name="Kitchen helper", storage=storage)
        inbox = Inbox()
        async with sdk_client(run, auth, mode="legacy", message_handler=inbox) as client:
            with anyio.fail_after(bound(10)):  # its standalone stream, where the push comes
                await run.gateway.frontend.notifier.wait_for_sessions(1)
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert len(names) > META and all(n.startswith("sim-esp32_0002_") for n in names[META:])
            assert devices_in(await client.call_tool("list_devices", {})) == ["sim-esp32_0002"]
            other_tool = "sim-esp32_0001_audio_speaker_set_volume"
            assert "Unknown tool" in await unknown_tool(client, other_tool)
            assert storage.client is not None
            client_id = storage.client.client_id
            page = await signed_in_dashboard(owner, run, "#apps")
            row = page.locator(f'#apps tr[data-client="{client_id}"]')
            assert await row.locator(".sees").inner_text() == "only 02:00:00:00:00:02"
            await row.locator("button.change-devices").click()
            await row.locator("input.devices-input").fill("*0001")
            told = inbox.count  # pushes so far (the boards' joins may still be coming)
            await row.locator("button.save-devices").click()
            await page.wait_for_selector(
                f'#apps tr[data-client="{client_id}"] .sees:text("devices named like *0001")'
            )
            while inbox.count == told:  # the app is told to list again (its cache ends)
                await inbox.next_change()
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert len(names) > META and all(n.startswith("sim-esp32_0001_") for n in names[META:])
            assert devices_in(await client.call_tool("list_devices", {})) == ["sim-esp32_0001"]
        records = run.gateway.audit.page(kind="oauth")["records"]
        assert any("may now use only devices named like *0001" in r["message"] for r in records)
