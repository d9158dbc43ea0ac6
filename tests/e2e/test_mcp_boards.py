"""Boards that serve MCP themselves, played by the MCP SDKs' servers, beside a xiaozhi device."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from mcp import Client

from gateway.config.boards import BoardOptions
from gateway.device_side.boards import board_id
from tests.conftest import gateway
from tests.e2e.boards import PNG, BoardState, python_board, served
from tests.e2e.helpers import has_tools, listed_device, until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_host_calls_a_board_beside_a_xiaozhi_device(tmp_path: Path, mode: str) -> None:
    """A host lists and calls a board's tools (text and image) and a stock device's, both eras."""
    state = BoardState()
    app = python_board("kitchen-board", state).streamable_http_app()
    async with served(app) as base:
        url = f"{base}/mcp"
        boards = (BoardOptions(url, name="kitchen"),)
        async with gateway(tmp_path, mcp_devices=boards) as run, listed_device(run):
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
            async with Client(run.mcp_url, mode=mode) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                assert "kitchen_greet" in names and "sim-esp32_0001_lamp_turn_on" in names
                greeting = await client.call_tool("kitchen_greet", {"who": "ada"})
                photo = await client.call_tool("kitchen_take_photo", {})
                lamp = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
                listing = await client.call_tool("list_devices", {})
    assert greeting.content[0].text == "hello ada from kitchen-board"
    assert photo.content[0].type == "image" and base64.b64decode(photo.content[0].data) == PNG
    assert not lamp.is_error
    devices = {d["device"]: d for d in json.loads(listing.content[0].text)["devices"]}
    assert devices["kitchen"]["transport"] == "mcp-http"
    assert devices["kitchen"]["online"] is True
