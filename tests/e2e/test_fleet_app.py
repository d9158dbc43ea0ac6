"""The devices panel (MCP Apps) in real headless Chromium, inside a minimal MCP host.

The host is what a chat app does, cut to the bone: an SDK ``Client`` that negotiated the
extension, and a page that renders the ``ui://`` resource in a sandboxed iframe under the CSP the
resource declares, and answers the panel's postMessage JSON-RPC (``ui/initialize``, then
``tools/call`` and ``resources/read``, forwarded through the client's own MCP session).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.extension import advertise

from gateway.host_side.fleet_app import APP_MIME_TYPE, EXTENSION_ID, PANEL_URI
from gateway.protocol import DeviceLogged
from tests.conftest import bound, gateway
from tests.e2e.helpers import listed_device
from tests.e2e.test_confirmations import CONFIRMED, VOLUME, until_waiting
from tests.e2e.test_dashboard import chromium, ms, screenshot

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "02:00:00:00:00:01"
HOST = types.Implementation(name="panel-test-host", version="1.0")
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201a5f6e1e6"
    "0000000049454e44ae426082"
)

# The host side of the bridge: enough of it to initialize the panel, hand it the tool's input
# and result, size the frame, and forward its requests to the MCP session (window.forward).
HOST_PAGE = """<!doctype html><html><body>
<iframe id="app" sandbox="allow-scripts" style="width:900px;border:0"></iframe>
<script>
const {html, args, result} = JSON.parse(document.getElementById("data").textContent);
const frame = document.getElementById("app");
const send = (message) => frame.contentWindow.postMessage({jsonrpc: "2.0", ...message}, "*");
window.seen = [];
window.addEventListener("message", async (event) => {
  if (event.source !== frame.contentWindow) return;
  const m = event.data;
  window.seen.push(m.method || "answer");
  if (m.method === "ui/initialize") {
    send({id: m.id, result: {protocolVersion: m.params.protocolVersion,
      hostInfo: {name: "panel-test-host", version: "1.0"},
      hostCapabilities: {serverTools: {}, serverResources: {}},
      hostContext: {theme: "light", displayMode: "inline"}}});
  } else if (m.method === "ui/notifications/initialized") {
    send({method: "ui/notifications/tool-input", params: {arguments: args}});
    send({method: "ui/notifications/tool-result", params: result});
  } else if (m.method === "ui/notifications/size-changed") {
    frame.style.height = m.params.height + "px";
  } else if (m.method === "tools/call" || m.method === "resources/read") {
    try {
      const answer = await window.forward(m.method, JSON.stringify(m.params));
      send({id: m.id, result: JSON.parse(answer)});
    } catch (error) {
      send({id: m.id, error: {code: -32603, message: String(error)}});
    }
  }
});
frame.srcdoc = html;
</script></body></html>"""


def csp_of(ui: dict[str, Any]) -> str:
    """The policy a host derives from the resource's ``_meta.ui.csp`` (ext-apps' default plus
    the domains it declares, here none)."""
    csp = ui["csp"]
    connect = " ".join(csp["connectDomains"]) or "'none'"
    resources = " ".join(csp["resourceDomains"])
    return (
        f"default-src 'none'; script-src 'unsafe-inline' {resources}; "
        f"style-src 'unsafe-inline' {resources}; img-src data: {resources}; "
        f"connect-src {connect}; frame-src 'none'; base-uri 'none'"
    )


def host_page(panel: types.TextResourceContents, args: dict[str, Any], result: str) -> str:
    assert panel.meta is not None
    policy = f'<meta http-equiv="Content-Security-Policy" content="{csp_of(panel.meta["ui"])}">'
    html = panel.text.replace("<head>", "<head>" + policy, 1)
    data = json.dumps({"html": html, "args": args, "result": json.loads(result)})
    data = data.replace("</", "<\\/")
    return HOST_PAGE.replace(
        "<script>", f'<script type="application/json" id="data">{data}</script><script>', 1
    )


async def test_panel_in_a_sandboxed_frame_shows_devices_and_calls_through_the_host(
    tmp_path: Any,
) -> None:
    """The panel shows the device online with its last photo and events; its set_volume
    form's call goes through the host's MCP session to the device, and the audit log names
    that host. The panel itself never touches the network."""
    apps = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})
    async with (
        chromium() as browser,  # first: without it the skip must say so, not a task group's
        gateway(tmp_path) as run,
        listed_device(run, SIM) as dev,
        Client(run.mcp_url, mode="legacy", extensions=[apps], client_info=HOST) as client,
    ):
        await run.gateway.photos.keep(SIM, PNG, "image/png", "what is on the desk?")
        # What the device reported on its own (tests/e2e/test_device_events.py has devices
        # sending it): the panel shows it beside the tools.
        run.gateway.events.add(SIM, DeviceLogged("info", "button", {"pressed": 1}))
        tools = (await client.list_tools()).tools
        uri = next(t for t in tools if t.name == "list_devices").meta["ui"]["resourceUri"]  # type: ignore[index]
        panel = (await client.read_resource(uri)).contents[0]
        assert isinstance(panel, types.TextResourceContents)
        listing = await client.call_tool("list_devices", {})

        async def forward(method: str, params: str) -> str:
            arguments = json.loads(params)
            answer: types.Result
            if method == "tools/call":
                answer = await client.call_tool(arguments["name"], arguments["arguments"])
            else:
                answer = await client.read_resource(arguments["uri"])
            return answer.model_dump_json(by_alias=True, exclude_none=True)

        page = await browser.new_page()
        page.set_default_timeout(ms(10))
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        await page.expose_function("forward", forward)
        await page.set_content(
            host_page(panel, {}, listing.model_dump_json(by_alias=True, exclude_none=True))
        )
        app = page.frame_locator("#app")
        card = app.locator(f'article.device[data-device="{SIM}"][data-status="online"]')
        await card.wait_for()
        image = card.locator("figure.photo img[src^='data:image/png;base64,']")
        await image.wait_for()
        reported = card.locator('section.recent-events li[data-logger="button"]')
        assert '{"pressed":1}' in await reported.inner_text()
        tool = card.locator('details[data-tool="self.audio_speaker.set_volume"]')
        await tool.locator("summary").click()
        await tool.locator('input[name="volume"]').fill("37")
        await tool.locator("button[type=submit]").click()
        await tool.locator(".result pre").wait_for()
        await screenshot(page, tmp_path, "panel")
        seen = await page.evaluate("window.seen")

    assert ("self.audio_speaker.set_volume", {"volume": 37}) in dev.calls
    records = run.gateway.audit.page(device=SIM)["records"]
    assert records[0]["tool"] == "self.audio_speaker.set_volume"
    assert records[0]["caller"].endswith("panel-test-host")
    assert seen[:2] == ["ui/initialize", "ui/notifications/initialized"]
    assert "tools/call" in seen and "resources/read" in seen
    assert all(url.startswith(("about:", "data:")) for url in requests), requests


async def test_the_panel_allows_its_host_s_waiting_call(tmp_path: Any) -> None:
    """A call of this host that waits for a yes shows in the panel; Allow (sent through the
    host as the app-only waiting_calls) lets it reach the board, audited as the panel's."""
    apps = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})
    async with (
        chromium() as browser,
        gateway(tmp_path, devices=CONFIRMED) as run,
        listed_device(run, SIM) as dev,
        Client(run.mcp_url, mode="legacy", extensions=[apps], client_info=HOST) as client,
    ):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["waiting_calls"].meta == {
            "ui": {"resourceUri": PANEL_URI, "visibility": ["app"]}
        }
        panel = (await client.read_resource(PANEL_URI)).contents[0]
        assert isinstance(panel, types.TextResourceContents)
        listing = await client.call_tool("list_devices", {})

        async def forward(method: str, params: str) -> str:
            arguments = json.loads(params)
            answer = await client.call_tool(arguments["name"], arguments["arguments"])
            return answer.model_dump_json(by_alias=True, exclude_none=True)

        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await client.call_tool(VOLUME, {"volume": 61}))

        page = await browser.new_page()
        page.set_default_timeout(ms(10))
        await page.expose_function("forward", forward)
        with anyio.fail_after(bound(20)):
            async with anyio.create_task_group() as tg:  # ends when the allowed call does
                tg.start_soon(call)
                await until_waiting(run.gateway.router.confirmations)
                await page.set_content(
                    host_page(panel, {}, listing.model_dump_json(by_alias=True, exclude_none=True))
                )
                line = page.frame_locator("#app").locator("#waiting p.waiting[data-call]")
                await line.wait_for()
                assert "self.audio_speaker.set_volume" in await line.inner_text()
                await line.locator('button[data-action="allow"]').click()
        await page.close()
    assert not results[0].is_error
    assert dev.calls == [("self.audio_speaker.set_volume", {"volume": 61})]
    [record] = run.gateway.audit.page(kind="confirm")["records"]
    assert record["channel"] == "panel" and record["decided_by"].endswith("panel-test-host")
