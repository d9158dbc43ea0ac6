"""The companion dashboard in real headless Chromium (Debian's, driven by Playwright).

Each test starts a real gateway, opens the dashboard in the browser, and checks what a user
sees and what the devices and MCP hosts get. Screenshots of each page go to the test's tmp dir
(``screens/``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from playwright.async_api import Browser, Page, async_playwright
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import Running
from gateway.config import ListenAddress
from gateway.device_side.boards import board_id
from gateway.simulator import SimulatedDevice
from gateway.simulator.fleet import firmware_device
from tests.conftest import DEVICE_TOKEN, bound, gateway, program
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.boards import BoardState, python_board, served
from tests.e2e.helpers import Inbox, has_tools, listed_device, until
from tests.e2e.ingress import ingress
from tests.e2e.test_device_trust import EMBEDDED, IMPOSTOR, check_in, listed_but_pending
from tests.e2e.test_mqtt import STOCK, stock_device, tool_name

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "02:00:00:00:00:01"
STOCK_ALIAS = "bread-compact-wifi_eeff"  # the stock device's name, from its board and MAC
HOST_TOKEN = "host-secret-for-dashboard-tests"


@pytest.fixture(autouse=True)
def _chromium_installed() -> None:
    """Skip (saying how to install it) before any task group could wrap the skip in an error."""
    program("chromium")


def ms(seconds: float) -> float:
    """A Playwright timeout (milliseconds), scaled like every other bound."""
    return bound(seconds) * 1000


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Headless Chromium from the system (nothing is downloaded)."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=program("chromium"))
        try:
            yield browser
        finally:
            await browser.close()


@asynccontextmanager
async def dashboard(run: Running, path: str = "/") -> AsyncIterator[Page]:
    """A browser page on the gateway's dashboard, its device feed connected."""
    async with chromium() as browser:
        context = await browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(ms(10))
        await page.goto(f"http://127.0.0.1:{run.host_port}{path}")
        if path == "/":
            await page.wait_for_selector("#live.on")
        yield page
        await context.close()


async def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    folder = tmp_path / "screens"
    folder.mkdir(exist_ok=True)
    await page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
    assert (folder / f"{name}.png").stat().st_size > 0


def row(device_id: str, status: str | None = None) -> str:
    """The selector of a device's row in the list (in a given status)."""
    selector = f'#devices tr[data-device="{device_id}"]'
    return selector + (f'[data-status="{status}"]' if status else "")


def form(tool: str) -> str:
    return f'#tools form[data-tool="{tool}"]'


async def call_from_form(page: Page, tool: str) -> str:
    """Submit a tool's form; return the text of the result it shows."""
    result = page.locator(f"{form(tool)} .result")
    await page.locator(f"{form(tool)} button[type=submit]").click()
    await result.locator("pre, p").first.wait_for()
    return await result.inner_text()


async def test_device_list_follows_devices_without_a_reload(tmp_path: Path) -> None:
    """A simulated device appears online when it connects and offline when it leaves."""
    async with gateway(tmp_path) as run, dashboard(run) as page:
        await page.wait_for_selector("#no-devices:not([hidden])")
        await page.evaluate("window.notReloaded = true")
        async with listed_device(run, SIM):
            await page.wait_for_selector(row(SIM, "online"))
            assert await page.inner_text(f"{row(SIM)} .alias") == "sim-esp32_0001"
            await screenshot(page, tmp_path, "devices")
        await page.wait_for_selector(row(SIM, "offline"))
        assert await page.evaluate("window.notReloaded") is True


async def test_set_volume_form_then_read_back_audit_and_metrics(tmp_path: Path) -> None:
    """The form generated from set_volume's schema sets the volume; a second call reads it
    back; both calls show in the audit log, newest first, and /metrics counts them."""
    async with gateway(tmp_path) as run, listed_device(run, SIM) as dev, dashboard(run) as page:
        await page.click(f"{row(SIM)} .alias button")
        volume = page.locator(f'{form("self.audio_speaker.set_volume")} input[name="volume"]')
        assert await volume.get_attribute("type") == "number"
        assert (await volume.get_attribute("min"), await volume.get_attribute("max")) == (
            "0",
            "100",
        )
        await volume.fill("37")
        await call_from_form(page, "self.audio_speaker.set_volume")
        status = json.loads(await call_from_form(page, "self.get_device_status"))
        assert status["audio_speaker"]["volume"] == 37
        assert ("self.audio_speaker.set_volume", {"volume": 37}) in dev.calls
        await screenshot(page, tmp_path, "tools")

        await volume.fill("300")  # over the schema's maximum: said at once, nothing is sent
        text = await call_from_form(page, "self.audio_speaker.set_volume")
        assert "at most 100" in text and len(dev.calls) == 2

        await page.click('nav a[data-page="audit"]')
        await page.wait_for_selector("#audit tbody tr")
        tools = await page.locator("#audit tbody tr td:nth-child(6)").all_inner_texts()
        assert tools == ["self.get_device_status", "self.audio_speaker.set_volume"]
        callers = await page.locator("#audit tbody tr td:nth-child(3)").all_inner_texts()
        assert callers == ["dashboard", "dashboard"]  # not "api": the CLI's calls are
        await page.select_option('#audit-filter select[name="outcome"]', "failed")
        await page.click("#audit-filter button[type=submit]")
        await page.wait_for_selector("#audit-empty:not([hidden])")
        await screenshot(page, tmp_path, "audit")

        async with httpx2.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{run.host_port}/metrics")).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("gateway_calls_total", (("outcome", "ok"),))] == 2
    assert samples[("gateway_call_duration_seconds_count", ())] == 2
    assert samples[("gateway_devices", (("state", "online"), ("transport", "websocket")))] == 1
    assert samples[("gateway_discovery_duration_seconds_count", ())] == 1
    assert samples[("gateway_rejected_tools", ())] == 0


async def test_user_only_tool_is_callable_from_the_dashboard_not_through_mcp(
    tmp_path: Path,
) -> None:
    """reboot (audience user) has a form on the dashboard that reaches the device; MCP hosts
    neither see it nor may call it."""
    async with gateway(tmp_path) as run, listed_device(run, SIM) as dev, dashboard(run) as page:
        await page.click(f"{row(SIM)} .alias button")
        card = page.locator('#tools article[data-tool="self.reboot"]')
        assert "user only" in await card.locator(".badges").inner_text()
        await page.locator(f"{form('self.reboot')} button[type=submit]").click()
        await dev.wait_for_call("self.reboot", bound(5))
        shown = page.locator(f"{form('self.reboot')} .result p.error")
        await shown.wait_for()  # stock reboots before it answers: the call fails, as it should
        assert "disconnected during the call" in await shown.inner_text()
        async with Client(run.mcp_url, mode="legacy") as client:
            names = [t.name for t in (await client.list_tools()).tools]
            refused = await client.call_tool(
                "call_device_tool", {"device": SIM, "tool": "self.reboot"}
            )
    assert not any("reboot" in name for name in names)
    assert refused.is_error and "user-only" in refused.content[0].text  # type: ignore[union-attr]
    assert [name for name, _ in dev.calls].count("self.reboot") == 1


async def test_pending_device_is_approved_with_a_click(tmp_path: Path) -> None:
    """A stock device waiting for approval is approved from its row; an MCP host then sees
    and calls its tools."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        reply = (await check_in(run)).json()
        registry = run.gateway.registry
        async with stock_device(reply), registry.changes() as changes, dashboard(run) as page:
            await listed_but_pending(run)
            await page.wait_for_selector(row(STOCK, "pending"))
            await screenshot(page, tmp_path, "pending")
            async with Client(run.mcp_url, mode="legacy") as client:
                before = [t.name for t in (await client.list_tools()).tools]
                await page.click(f'{row(STOCK)} button[data-action="approve"]')
                await until(changes, has_tools(run, STOCK))
                await page.wait_for_selector(row(STOCK, "online"))
                name = tool_name(run, STOCK, "self.lamp.turn_on")
                after = [t.name for t in (await client.list_tools()).tools]
                result = await client.call_tool(name, {})
    assert before == ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
    assert name in after and not result.is_error


async def test_rename_renames_the_tools_and_tells_mcp_hosts(tmp_path: Path) -> None:
    """Renaming a device from its row gives its tools new MCP names, hosts are told, and the
    name outlives a restart."""
    async with gateway(tmp_path) as run, listed_device(run, SIM), dashboard(run) as page:
        inbox = Inbox()
        async with Client(run.mcp_url, mode="legacy", message_handler=inbox) as client:
            await run.gateway.frontend.notifier.wait_for_sessions(1)
            await page.click(f'{row(SIM)} button[data-action="rename"]')
            await page.fill(f'{row(SIM)} input[name="alias"]', "kitchen")
            await page.click(f"{row(SIM)} .rename button")
            await inbox.next_change()
            names = [t.name for t in (await client.list_tools()).tools]
            await page.wait_for_selector(f'{row(SIM)} .alias button:text-is("kitchen")')
    assert "kitchen_lamp_turn_on" in names and "sim-esp32_0001_lamp_turn_on" not in names
    async with gateway(tmp_path) as again:
        assert again.gateway.registry.get(SIM).alias == "kitchen"  # type: ignore[union-attr]


async def test_setup_and_photos_pages(tmp_path: Path) -> None:
    """Setup shows the device token, the OTA URL and host configs with a working copy
    button, and enrolls a board; Photos says there are none yet."""
    async with gateway(tmp_path) as run, chromium() as browser:
        context = await browser.new_context(permissions=["clipboard-read", "clipboard-write"])
        page = await context.new_page()
        page.set_default_timeout(ms(10))
        await page.goto(f"http://127.0.0.1:{run.host_port}/#setup")
        await page.wait_for_selector("#setup-devices dt")
        facts = await page.inner_text("#setup-devices")
        assert DEVICE_TOKEN not in facts and "/xiaozhi/ota/" in facts  # masked until "Show"
        mcp_url = f"http://127.0.0.1:{run.host_port}/mcp"
        desktop = page.locator('.config[data-host="claude_desktop"]')
        assert mcp_url in await desktop.locator("pre").inner_text()
        assert mcp_url in await page.inner_text('.config[data-host="vscode"] pre')
        await desktop.locator("button.copy").click()
        await page.wait_for_selector('.config[data-host="claude_desktop"] button:text-is("Copied")')
        copied = json.loads(await page.evaluate("navigator.clipboard.readText()"))
        assert copied["mcpServers"]["esp32"]["args"] == ["stdio", "--connect", mcp_url]
        await page.fill('#enroll input[name="name"]', "porch")
        await page.click("#enroll button[type=submit]")
        await page.wait_for_selector("#enrolled:not([hidden])")
        assert "--name porch --token " in await page.inner_text("#enrolled")
        await screenshot(page, tmp_path, "setup")
        await page.click('nav a[data-page="photos"]')
        await page.wait_for_selector("#photos-empty:not([hidden])")
        await screenshot(page, tmp_path, "photos")
        await context.close()


async def test_sign_in_with_the_host_token_and_csrf(tmp_path: Path) -> None:
    """With a host token the dashboard asks for it and then works; a request without the
    session cookie, or with it but a wrong CSRF token, is refused; MCP ignores the cookie."""
    async with gateway(tmp_path, host_token=HOST_TOKEN) as run, chromium() as browser:
        base = f"http://127.0.0.1:{run.host_port}"
        context = await browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(ms(10))
        await page.goto(base + "/")
        assert page.url == base + "/login"
        await page.fill("#token", "not-the-token")
        await page.click("#login button[type=submit]")
        await page.wait_for_selector("#error:not([hidden])")
        await screenshot(page, tmp_path, "login")
        await page.fill("#token", HOST_TOKEN)
        await page.click("#login button[type=submit]")
        await page.wait_for_url(base + "/")
        await page.wait_for_selector("#live.on")
        async with SimulatedDevice(run.device_url, DEVICE_TOKEN, device_id=SIM):
            await page.wait_for_selector(row(SIM, "online"))
        [cookie] = await context.cookies()
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
        csrf = await page.evaluate("fetch('/api/session').then(r => r.json()).then(b => b.csrf)")
        await page.click('nav a[data-page="audit"]')
        await screenshot(page, tmp_path, "signed-in")

        session = {"gateway_session": cookie["value"]}
        pair = base + "/api/devices/pair"
        async with httpx2.AsyncClient() as anonymous:
            assert (await anonymous.get(base + "/api/dashboard/devices")).status_code == 401
            assert (await anonymous.post(pair, json={"seconds": 5})).status_code == 401
            assert (await anonymous.get(base + "/metrics")).status_code == 401
            bearer = {"Authorization": f"Bearer {HOST_TOKEN}"}
            assert (await anonymous.get(base + "/metrics", headers=bearer)).status_code == 200
        async with httpx2.AsyncClient(cookies=session) as http:
            assert (await http.get(base + "/api/dashboard/devices")).status_code == 200
            assert (await http.get(base + "/metrics")).status_code == 200
            missing = await http.post(pair, json={"seconds": 5})
            wrong = await http.post(pair, json={"seconds": 5}, headers={"X-CSRF-Token": "x"})
            assert (missing.status_code, wrong.status_code) == (403, 403)
            assert "CSRF" in wrong.json()["error"] and run.gateway.registry.admin.pairing_until == 0
            mcp = await http.post(base + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert mcp.status_code == 401  # the cookie is the dashboard's, never MCP's
            right = await http.post(pair, json={"seconds": 5}, headers={"X-CSRF-Token": csrf})
            assert right.status_code == 200
            out = await http.post(base + "/api/logout", json={}, headers={"X-CSRF-Token": csrf})
            assert out.status_code == 200
            assert (await http.get(base + "/api/dashboard/devices")).status_code == 401
        await context.close()


async def test_a_photo_taken_from_the_dashboard_shows_inline_and_on_the_photos_page(
    tmp_path: Path,
) -> None:
    """take_photo's form shows the photo in its result; Photos then shows the device's latest."""
    camera_id = "02:00:00:00:0c:02"
    async with gateway(tmp_path) as run, run.gateway.registry.changes() as changes:
        async with anyio.create_task_group() as tg:
            tg.start_soon(firmware_device(run.device_url, DEVICE_TOKEN, camera_id, camera=True).run)
            await until(changes, has_tools(run, camera_id))
            async with dashboard(run) as page:
                await page.click(f"{row(camera_id)} .alias button")
                question = page.locator(f'{form("self.camera.take_photo")} [name="question"]')
                await question.fill("what colour is it?")
                await call_from_form(page, "self.camera.take_photo")
                inline = page.locator(f"{form('self.camera.take_photo')} .result img.image")
                await inline.wait_for()
                # A real JPEG, decoded by the browser: the simulated camera's 160x120 frame.
                assert (
                    await inline.evaluate("img => img.decode().then(() => img.naturalWidth)") == 160
                )
                await screenshot(page, tmp_path, "photo-call")
                await page.click('nav a[data-page="photos"]')
                photo = page.locator("#photos figure.photo img")
                await photo.wait_for()
                assert (
                    await photo.evaluate("img => img.decode().then(() => img.naturalHeight)") == 120
                )
                assert "what colour is it?" in await page.inner_text("#photos")
                await screenshot(page, tmp_path, "photos-taken")
            tg.cancel_scope.cancel()


async def test_sign_in_from_the_lan_address_with_other_cookies_around(tmp_path: Path) -> None:
    """Bound to every interface, the dashboard works at the machine's LAN address (its requests
    are same-origin there), another app's odd cookie on the host does not hide the session from
    the connection guard, and a token that is not even valid text is simply wrong."""
    listen = ListenAddress("0.0.0.0", 0)
    async with gateway(
        tmp_path, host_listen=listen, host_token=HOST_TOKEN, limits_auth_timeout=1.0
    ) as run:
        lan = f"192.0.2.7:{run.host_port}"  # as a browser on the LAN addresses this machine
        headers = {"Host": lan, "Origin": f"http://{lan}"}
        base = f"http://127.0.0.1:{run.host_port}"
        async with httpx2.AsyncClient() as http:
            surrogate = b'{"token": "\\ud800"}'  # JSON for a lone surrogate: not valid text
            odd = await http.post(base + "/login", content=surrogate, headers=headers)
            assert odd.status_code == 401
            signed = await http.post(base + "/login", json={"token": HOST_TOKEN}, headers=headers)
            assert signed.status_code == 200, signed.text
            session = signed.cookies["gateway_session"]
            elsewhere = {**headers, "Origin": "http://evil.example"}
            assert (await http.post(base + "/login", json={"token": HOST_TOKEN},
                                    headers=elsewhere)).status_code == 403  # fmt: skip
        cookie = f'prefs={{"theme": "dark"}}; gateway_session={session}'
        async with httpx2.AsyncClient(headers={**headers, "Cookie": cookie}) as browser:
            async with browser.stream("GET", base + "/api/events") as events:
                assert events.status_code == 200
                lines = events.aiter_lines()
                with anyio.fail_after(bound(4)):
                    assert await anext(lines)
                # Past the auth deadline (1 s) the feed is still open: the guard saw the session.
                with anyio.move_on_after(2.5) as listening:
                    async for _ in lines:
                        pass
                assert listening.cancelled_caught, "the feed closed at the auth deadline"


async def test_audit_page_shows_who_did_what_from_where_and_the_full_pending_list(
    tmp_path: Path,
) -> None:
    """With room for one pending device, a second check-in is refused and the device page
    says so; the approval made with a click, and the impostor's check-in after it, are on the
    audit page with who and where, each under its own kind."""
    async with gateway(tmp_path, **EMBEDDED, max_pending=1) as run, dashboard(run) as page:
        assert (await check_in(run)).status_code == 200
        other = {**STOCK_HEADERS, "Device-Id": "AA:BB:CC:00:00:99", "Client-Id": IMPOSTOR}
        async with httpx2.AsyncClient() as http:
            refused = await http.post(f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/",
                                      headers=other, json=STOCK_BODY)  # fmt: skip
        assert refused.status_code == 403
        # The box shows once the list is full (the first check-in); the refusal follows.
        await page.wait_for_selector('#pending-cap:not([hidden]):has-text("were refused")')
        assert "1 new devices were refused" in await page.inner_text("#pending-cap")
        await page.click(f'{row(STOCK)} button[data-action="approve"]')
        await page.wait_for_selector(row(STOCK, "offline"))
        assert (await check_in(run, IMPOSTOR)).status_code == 403

        await page.click('nav a[data-page="audit"]')
        await page.select_option('#audit-filter select[name="kind"]', "admin")
        await page.click("#audit-filter button[type=submit]")
        await page.wait_for_selector('#audit tbody tr[data-kind="admin"]')
        cells = await page.locator("#audit tbody tr td").all_inner_texts()
        assert cells[1:7] == ["admin", "dashboard", "127.0.0.1", STOCK_ALIAS, "approve", ""]
        await page.select_option('#audit-filter select[name="kind"]', "login")
        await page.click("#audit-filter button[type=submit]")
        await page.wait_for_selector('#audit tbody tr[data-kind="login"]')
        whats = await page.locator("#audit tbody tr td:nth-child(6)").all_inner_texts()
        assert whats == ["login conflict", "login refused"]
        await screenshot(page, tmp_path, "audit-logins")


async def test_calls_are_audited_as_the_dashboard_or_the_api(tmp_path: Path) -> None:
    """With a host token: a signed-in dashboard session's call is the dashboard's in the audit
    log, a bearer token's (the CLI, scripts) is the API's."""
    async with gateway(tmp_path, host_token=HOST_TOKEN) as run, listed_device(run, SIM):
        base = f"http://127.0.0.1:{run.host_port}"
        call = {"device": SIM, "tool": "self.get_device_status"}
        async with httpx2.AsyncClient() as browser:
            assert (await browser.post(base + "/login", json={"token": HOST_TOKEN})).is_success
            csrf = (await browser.get(base + "/api/session")).json()["csrf"]
            signed_in = await browser.post(base + "/api/call", json=call,
                                           headers={"X-CSRF-Token": csrf})  # fmt: skip
            bearer = {"Authorization": f"Bearer {HOST_TOKEN}"}
            scripted = await browser.post(base + "/api/call", json=call, headers=bearer)
        assert signed_in.status_code == scripted.status_code == 200
        records = run.gateway.audit.page()["records"]
    assert [r["caller"] for r in records] == ["api", "dashboard"]


async def test_the_dashboard_works_behind_a_path_prefix(tmp_path: Path) -> None:
    """As Home Assistant's ingress serves it, under /api/hassio_ingress/<token>/ (a proxy that
    strips the prefix and passes redirects back as they are): sign-in, the live device list and
    a tool's call all work, every URL the pages use being relative."""
    prefix = "/api/hassio_ingress/abc123"
    async with gateway(tmp_path, host_token=HOST_TOKEN) as run, chromium() as browser:
        async with ingress(f"http://127.0.0.1:{run.host_port}", prefix) as proxy:
            context = await browser.new_context()
            page = await context.new_page()
            page.set_default_timeout(ms(10))
            missing: list[str] = []
            page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
            await page.goto(proxy + prefix + "/")
            await page.wait_for_url(proxy + prefix + "/login")
            await page.fill("#token", HOST_TOKEN)
            await page.click("#login button[type=submit]")
            await page.wait_for_url(proxy + prefix + "/")
            await page.wait_for_selector("#live.on")
            async with listed_device(run, SIM) as dev:
                await page.click(f"{row(SIM, 'online')} .alias button")
                await call_from_form(page, "self.get_device_status")
                assert [name for name, _ in dev.calls] == ["self.get_device_status"]
            await context.close()
    assert missing == []


async def test_add_a_board_by_url_on_the_setup_page(tmp_path: Path) -> None:
    """The Setup page adds a board that serves MCP itself; its tools are then served."""
    async with served(python_board("shelf", BoardState()).streamable_http_app()) as base:
        url = f"{base}/mcp"
        async with gateway(tmp_path) as run, chromium() as browser:
            page = await browser.new_page()
            page.set_default_timeout(ms(10))
            await page.goto(f"http://127.0.0.1:{run.host_port}/#setup")
            async with run.gateway.registry.changes() as changes:
                await page.fill('#add-board input[name="url"]', url)
                await page.fill('#add-board input[name="name"]', "shelf")
                await page.click("#add-board button[type=submit]")
                await page.wait_for_selector("#board-added:not([hidden])")
                assert "Added shelf" in await page.inner_text("#board-added")
                await until(changes, has_tools(run, board_id(url)))
    assert any(t.name == "shelf_greet" for t in run.gateway.registry.exposed_tools())
