"""The dashboard's finish (issue 42), in real headless Chromium: a board of long descriptions
stays a page, Allow reads as the answer to give, apps' rights in words, where photos come from,
and issued device tokens listed and revoked. Screenshots go to the test's ``screens/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import gateway
from tests.e2e.helpers import RawDevice, aliases, serving
from tests.e2e.test_dashboard import chromium, dashboard, ms, row, screenshot
from tests.e2e.test_oauth import signed_in_dashboard
from tests.oauth_helpers import (
    MemoryStorage,
    callback_server,
    consent_browser,
    oauth_gateway,
    sdk_auth,
    sdk_client,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# As long as stock firmware's get_device_status, and longer: a paragraph a tool.
LONG = (
    "Provides the real-time information of the device, including the current status of the "
    "audio speaker, screen, battery, network, etc. Use this tool for: 1. Answering questions "
    "about current condition (e.g. what is the current volume of the audio speaker?) 2. As "
    "the first step to control the device (e.g. turn up / down the volume of the audio "
    "speaker, etc.) "
) * 4
TOOLS = [
    {"name": f"self.thing_{n}.act", "description": f"Tool {n}. {LONG}",
     "inputSchema": {"type": "object", "properties": {}}}
    for n in range(24)
]  # fmt: skip
BOARD = RawDevice("aa:42:00:00:00:02", "wordy", TOOLS)
MAX_PAGE_PX = 2600  # 24 folded cards, three a row at 1280 px; unfolded they are over 6,000 px


async def test_a_board_s_long_descriptions_fold(tmp_path: Path) -> None:
    """Each long description shows a line and "more"; opened, the whole of it; the page of a
    board of 24 such tools stays within a bound it exceeds unfolded."""
    async with gateway(tmp_path, devices=aliases(BOARD)) as run, serving(run, BOARD):
        async with dashboard(run) as page:
            await page.set_viewport_size({"width": 1280, "height": 800})
            await page.click(f"{row(BOARD.device_id)} .alias button")
            await page.wait_for_selector(f'#tools article[data-tool="{TOOLS[-1]["name"]}"]')
            folded = page.locator("#tools details.description")
            assert await folded.count() == len(TOOLS)
            assert await page.locator("#tools details.description[open]").count() == 0
            height = await page.evaluate("document.documentElement.scrollHeight")
            await screenshot(page, tmp_path, "tools-folded")
            assert height <= MAX_PAGE_PX, height
            first = folded.first
            assert (await first.locator("summary").inner_text()).endswith("… more")
            assert await first.locator(".less").is_hidden()
            await first.locator("summary").click()
            assert (
                await first.locator(".more").is_hidden()
                and await first.locator(".less").is_visible()
            )
            assert LONG.strip()[:200] in await first.locator(".full").inner_text()
            await screenshot(page, tmp_path, "tools-one-open")


async def test_photos_say_how_a_photo_gets_there(tmp_path: Path) -> None:
    async with gateway(tmp_path) as run, dashboard(run, "/#photos") as page:
        await page.wait_for_selector("#photos-empty:not([hidden])")
        note = await page.inner_text("#page-photos .note")
        assert "take_photo" in note and "camera" in note


async def test_issued_device_tokens_are_listed_and_revoked_on_setup(tmp_path: Path) -> None:
    """The Setup page's form issues a token; the table lists it; Revoke takes it back."""
    async with gateway(tmp_path) as run, chromium() as browser:
        page = await browser.new_page()
        page.set_default_timeout(ms(10))
        await page.goto(f"http://127.0.0.1:{run.host_port}/#setup")
        await page.wait_for_selector("#enrollments-empty:not([hidden])")
        await page.fill('#enroll input[name="name"]', "porch")
        await page.click("#enroll button[type=submit]")
        entry = page.locator("#enrollments tr[data-enrollment]")
        await entry.wait_for()
        assert await entry.locator(".name").inner_text() == "porch"
        assert "not used yet" in await entry.inner_text()
        await screenshot(page, tmp_path, "enrollments")
        await entry.locator("button.revoke").click()
        await page.wait_for_selector("#enrollments-empty:not([hidden])")
        assert run.gateway.enrollment.issued() == []
        records = run.gateway.audit.page(kind="admin")["records"]
    assert [r["action"] for r in records[:2]] == ["revoke enrollment", "enroll"]  # newest first
    assert {r["caller"] for r in records[:2]} == {"dashboard"}


async def test_allow_stands_out_from_deny_and_apps_rights_read_in_words(tmp_path: Path) -> None:
    """On the consent page Allow is the filled button and Deny the plain one; Connected apps
    says what an app may do in words, not scope names."""
    seen: dict[str, dict[str, str]] = {}
    async with (
        oauth_gateway(tmp_path) as run,
        callback_server() as callback,
        consent_browser() as owner,
    ):
        dashboard_page = await signed_in_dashboard(owner, run, "#apps")
        owner.token = None

        async def redirect(url: str) -> None:
            page = await owner.open(url, dashboard_page.context)
            await page.wait_for_selector("#allow")
            for button in ("allow", "deny"):
                seen[button] = await page.eval_on_selector(
                    f"#{button}",
                    "b => { const s = getComputedStyle(b); return {background: "
                    "s.backgroundColor, color: s.color, border: s.borderColor}; }",
                )
            await screenshot(page, tmp_path, "consent")
            async with page.expect_navigation():
                await page.click("#allow")

        auth = sdk_auth(run, owner, callback, storage=MemoryStorage())
        auth.context.redirect_handler = redirect
        async with sdk_client(run, auth) as client:
            await client.list_tools()
        await dashboard_page.reload()
        may = dashboard_page.locator("#apps td.may").first
        await may.wait_for()
        words = await may.inner_text()
        await screenshot(dashboard_page, tmp_path, "apps")
    assert seen["allow"]["background"] != seen["deny"]["background"], seen
    assert seen["allow"]["color"] != seen["deny"]["color"], seen
    assert "see your devices and their tools" in words and "tools.call" not in words
