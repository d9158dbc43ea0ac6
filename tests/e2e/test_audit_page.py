"""The dashboard's audit page (issue 30) in Chromium: times as the devices tab shows them, and
where each call came from."""

from __future__ import annotations

import re
from pathlib import Path

import httpx2
import pytest
from mcp import Client

from tests.conftest import gateway, program
from tests.e2e.helpers import listed_device
from tests.e2e.test_dashboard import SIM, dashboard, row

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SHOWN = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")  # the devices tab's format


@pytest.fixture(autouse=True)
def _chromium_installed() -> None:
    program("chromium")


async def test_audit_times_read_like_the_device_list_and_calls_say_where_from(
    tmp_path: Path,
) -> None:
    """A call from an MCP host over HTTP and one from the API: both rows say 127.0.0.1 under
    "From", and every time reads like the device list's "Last seen"."""
    async with gateway(tmp_path) as run, listed_device(run, SIM), dashboard(run) as page:
        async with Client(run.mcp_url, mode="legacy") as host:
            await host.call_tool("sim-esp32_0001_get_device_status", {})
        async with httpx2.AsyncClient() as http:
            call = {"device": SIM, "tool": "self.get_device_status"}
            called = await http.post(f"http://127.0.0.1:{run.host_port}/api/call", json=call)
        assert called.status_code == 200
        last_seen = await page.locator(f"{row(SIM)} td").nth(5).inner_text()
        assert SHOWN.match(last_seen), last_seen
        await page.click('nav a[data-page="audit"]')
        await page.wait_for_selector("#audit tbody tr:nth-child(2)")
        times = await page.locator("#audit tbody tr td:nth-child(1)").all_inner_texts()
        froms = await page.locator("#audit tbody tr td:nth-child(4)").all_inner_texts()
        callers = await page.locator("#audit tbody tr td:nth-child(3)").all_inner_texts()
    assert all(SHOWN.match(t) for t in times), times
    assert froms == ["127.0.0.1", "127.0.0.1"]
    assert callers[0] == "api" and callers[1].startswith("http:127.0.0.1")
