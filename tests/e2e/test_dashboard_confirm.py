"""The dashboard's Waiting for you list and "Ask me first" boxes in headless Chromium (issue
45): a live call from an MCP host is allowed, another denied, by clicking; a tool's box makes
its calls wait, and the choice is kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client

from gateway.devices.confirmations import Confirmations
from tests.conftest import bound, gateway, program
from tests.e2e.helpers import listed_device
from tests.e2e.test_confirmations import CONFIRMED, LAMP, SIM_ID, VOLUME, until_waiting
from tests.e2e.test_dashboard import dashboard, row, screenshot

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture(autouse=True)
def _chromium_installed() -> None:
    """Skip (saying how to install it) before any task group could wrap the skip in an error."""
    program("chromium")


async def call_into(
    results: list[types.CallToolResult], client: Client, name: str, arguments: dict[str, Any]
) -> None:
    """Call ``name`` and keep its result in ``results``."""
    results.append(await client.call_tool(name, arguments))


async def test_allow_and_deny_live_calls_on_the_waiting_list(tmp_path: Path) -> None:
    """A host's call shows up at once in Waiting for you; Allow lets the board act, Deny
    refuses the next one (isError, the board never sees it); the list empties itself."""
    async with (
        gateway(tmp_path, devices=CONFIRMED) as run,
        listed_device(run, SIM_ID) as dev,
        dashboard(run) as page,
    ):
        confirmations = run.gateway.router.confirmations
        async with Client(run.mcp_url, mode="legacy") as client:
            for tool, arguments, verb in ((VOLUME, {"volume": 55}, "allow"), (LAMP, {}, "deny")):
                results: list[types.CallToolResult] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call_into, results, client, tool, arguments)
                    await until_waiting(confirmations)
                    [waiting] = confirmations.waiting()
                    line = page.locator(f'#waiting-calls tr[data-call="{waiting.id}"]')
                    await line.wait_for()
                    assert "sim-esp32_0001" in await line.inner_text()
                    if verb == "allow":
                        assert '{"volume":55}' in await line.inner_text()
                        await screenshot(page, tmp_path, "waiting")
                    await line.locator(f'button[data-action="{verb}"]').click()
                with anyio.fail_after(bound(5)):
                    await page.wait_for_selector("#waiting", state="hidden")
                [result] = results
                assert result.is_error == (verb == "deny"), result
    assert dev.calls == [("self.audio_speaker.set_volume", {"volume": 55})]
    records = run.gateway.audit.page(kind="confirm")["records"]
    assert [(r["outcome"], r["channel"]) for r in records] == [
        ("denied", "dashboard"),
        ("allowed", "dashboard"),
    ]


async def test_ask_me_first_makes_a_tool_wait_and_is_kept(tmp_path: Path) -> None:
    """Ticking a tool's box on the dashboard makes its calls wait for a yes; the choice is in
    the data dir, so a gateway started anew keeps it."""
    async with (
        gateway(tmp_path / "gw") as run,
        listed_device(run, SIM_ID) as dev,
        dashboard(run) as page,
    ):
        await page.click(f"{row(SIM_ID)} .alias button")
        box = page.locator('.tool-card[data-tool="self.lamp.turn_off"] input.confirm')
        assert not await box.is_checked()
        async with page.expect_response(lambda r: r.request.method == "POST") as answer:
            await box.check()
        assert (await (await answer.value).json())["confirm"] is True
        device = run.gateway.registry.find("sim-esp32_0001")
        dev_tool = device.tool("self.lamp.turn_off") if device is not None else None
        assert dev_tool is not None
        confirmations = run.gateway.router.confirmations
        assert confirmations.wanted(dev_tool)
        async with Client(run.mcp_url, mode="legacy") as client, anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "sim-esp32_0001_lamp_turn_off", {})
            await until_waiting(confirmations)
            tg.cancel_scope.cancel()
        kept = json.loads((tmp_path / "gw" / "confirm.json").read_text())
        assert kept == {SIM_ID: {"self.lamp.turn_off": True}}
        assert Confirmations(run.gateway.config, run.gateway.audit).wanted(dev_tool)
    assert dev.calls == []
