"""The dashboard's Setup page (issue 30) in real Chromium: configs that work when pasted, each
host's own format, and the device token masked until asked for."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from playwright.async_api import Page

from tests.conftest import DEVICE_TOKEN, bound, gateway, program
from tests.e2e.helpers import listed_device
from tests.e2e.test_dashboard import chromium, ms, screenshot

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# What a desktop app gives the programs it starts: no venv, no user PATH, another directory.
DESKTOP_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")}


@pytest.fixture(autouse=True)
def _chromium_installed() -> None:
    program("chromium")


async def config_text(page: Page, host: str) -> str:
    return await page.inner_text(f'.config[data-host="{host}"] pre')


async def test_pasted_configs_run_from_a_desktop_apps_environment(tmp_path: Path) -> None:
    """Claude Desktop's relay entry, run as the app runs it (absolute command, bare PATH, another
    cwd), lists the running gateway's device tools; the entry for Claude Desktop alone runs the
    same program on the same data dir; each page entry says when to pick it."""
    async with gateway(tmp_path / "gw") as run, listed_device(run), chromium() as browser:
        page = await browser.new_page()
        page.set_default_timeout(ms(10))
        await page.goto(f"http://127.0.0.1:{run.host_port}/#setup")
        await page.wait_for_selector('.config[data-host="claude_desktop"] pre')
        mcp_url = f"http://127.0.0.1:{run.host_port}/mcp"
        relay = json.loads(await config_text(page, "claude_desktop"))["mcpServers"]["esp32"]
        command = Path(relay["command"])
        assert command.is_absolute() and os.access(command, os.X_OK)
        assert relay["args"][-3:] == ["stdio", "--connect", mcp_url]
        note = await page.inner_text('.config[data-host="claude_desktop"] .note')
        assert "while this gateway runs" in note
        elsewhere = tmp_path / "desktop-cwd"
        elsewhere.mkdir()
        desktop = StdioServerParameters(command=str(command), args=relay["args"],
                                        env=DESKTOP_ENV, cwd=elsewhere)  # fmt: skip
        with anyio.fail_after(bound(30)):
            async with Client(desktop, mode="legacy") as client:
                names = [tool.name for tool in (await client.list_tools()).tools]
        assert "sim-esp32_0001_audio_speaker_set_volume" in names

        alone = json.loads(await config_text(page, "claude_desktop_alone"))["mcpServers"]["esp32"]
        assert (alone["command"], alone["args"][-1:]) == (relay["command"], ["stdio"])
        assert alone["env"] == {"GATEWAY_DATA_DIR": str(tmp_path / "gw")}
        note = await page.inner_text('.config[data-host="claude_desktop_alone"] .note')
        assert "when nothing else runs the gateway" in note
        with anyio.fail_after(bound(30)):
            version = await anyio.run_process([alone["command"], *alone["args"][:-1], "--version"],
                                              env=DESKTOP_ENV, cwd=elsewhere)  # fmt: skip
        assert version.stdout.decode().startswith("esp-mcp-gateway ")
        await screenshot(page, tmp_path, "setup-hosts")


async def test_every_host_gets_its_own_format_and_the_token_is_masked(tmp_path: Path) -> None:
    """Cursor, VS Code, Claude Code, Codex CLI and Gemini CLI each get their own config for
    this /mcp URL; the device token shows only after "Show", and Copy copies it either way."""
    async with gateway(tmp_path) as run, chromium() as browser:
        context = await browser.new_context(permissions=["clipboard-read", "clipboard-write"])
        page = await context.new_page()
        page.set_default_timeout(ms(10))
        await page.goto(f"http://127.0.0.1:{run.host_port}/#setup")
        await page.wait_for_selector('.config[data-host="gemini"] pre')
        mcp_url = f"http://127.0.0.1:{run.host_port}/mcp"
        hosts = await page.locator(".config h3").all_inner_texts()
        assert hosts == ["Claude Desktop, with this gateway running", "Claude Desktop alone",
                         "Claude Code", "Cursor", "VS Code", "Codex CLI", "Gemini CLI"]  # fmt: skip
        cursor = json.loads(await config_text(page, "cursor"))
        assert cursor == {"mcpServers": {"esp32": {"url": mcp_url}}}
        vscode = json.loads(await config_text(page, "vscode"))
        assert vscode == {"servers": {"esp32": {"type": "http", "url": mcp_url}}}
        gemini = json.loads(await config_text(page, "gemini"))
        assert gemini == {"mcpServers": {"esp32": {"httpUrl": mcp_url}}}
        codex = tomllib.loads(await config_text(page, "codex"))
        assert codex == {"mcp_servers": {"esp32": {"url": mcp_url}}}
        code = await config_text(page, "claude_code")
        assert code == f"claude mcp add --transport http esp32 {mcp_url}"

        token = page.locator('#setup-devices dd[data-secret="masked"]')
        assert DEVICE_TOKEN not in await page.inner_text("#setup-devices")
        assert DEVICE_TOKEN not in await page.content()
        await token.locator("button.copy").click()
        await page.wait_for_selector('#setup-devices button.copy:text-is("Copied")')
        assert await page.evaluate("navigator.clipboard.readText()") == DEVICE_TOKEN
        await token.locator("button.reveal").click()
        assert await token.locator("code").inner_text() == DEVICE_TOKEN
        await token.locator("button.reveal").click()
        assert DEVICE_TOKEN not in await page.inner_text("#setup-devices")
        await context.close()
