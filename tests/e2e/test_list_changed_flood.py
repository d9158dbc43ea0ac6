"""A device that floods ``notifications/tools/list_changed`` is listed a few times a second.

A raw device on a real WebSocket says its tools changed every 5 ms, with a new catalogue each
time, while its neighbour's tool is called over MCP the whole time; a board the gateway reaches
over streamable HTTP (the MCP Python SDK's server) does the same. The protocol tests run the
same flood for 8 s on a clock they move (tests/protocol/test_device.py); here it lasts
``FLOOD`` seconds of real time and the bound is the same rule: one listing per
``[devices] relist_interval``, plus discovery's and the last change's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import Tool as MCPTool

from gateway.app import Running
from gateway.config.boards import BoardOptions
from gateway.device_side.boards import board_id
from tests.conftest import bound, gateway
from tests.e2e.boards import served
from tests.e2e.helpers import RawDevice, aliases, exposes, has_tools, serving, until
from tests.e2e.test_hostile_devices import PING, PING_TOOL

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]

FLOOD = 2.0  # seconds of list_changed every 5 ms
CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


class Flooding(RawDevice):
    """Lists PING with its catalogue's version as the description; counts the listings."""

    def __init__(self) -> None:
        super().__init__("aa:bb:cc:dd:ee:40", "flood", [PING_TOOL])
        self.version = 0
        self.listings = 0

    async def respond(self, message: JsonObject) -> JsonObject | None:
        payload = message.get("payload")
        if isinstance(payload, dict) and payload.get("method") == "tools/list":
            self.listings += 1
            self.tools = [{**PING_TOOL, "description": f"version {self.version}"}]
        return await super().respond(message)

    async def flood(self, seconds: float) -> None:
        """A new catalogue and ``tools/list_changed`` every 5 ms for ``seconds``."""
        assert self._ws is not None
        frame = json.dumps({"session_id": "", "type": "mcp", "payload": CHANGED})
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            self.version += 1
            await self._ws.send(frame)
            await anyio.sleep(0.005)  # the device's own pace, not a wait of the test


def served_description(run: Running, device_id: str) -> str | None:
    """The description of PING as the gateway holds it for ``device_id``."""
    device = run.gateway.registry.get(device_id)
    tools = [] if device is None else [t.spec for t in device.tools.values()]
    return next((spec.description for spec in tools if spec.name == PING), None)


async def test_a_flood_of_list_changed_costs_a_few_listings_and_the_last_change_is_served(
    tmp_path: Path,
) -> None:
    """At most one listing per relist_interval (and two more); the final catalogue is the
    one served; every call to the neighbour succeeds meanwhile."""
    flooding, calm = Flooding(), RawDevice("aa:bb:cc:dd:ee:41", "calm", [PING_TOOL])
    async with (
        gateway(tmp_path, devices=aliases(flooding, calm)) as run,
        serving(run, flooding, calm),
        Client(run.mcp_url, mode="legacy") as client,
    ):
        before = flooding.listings
        results: list[types.CallToolResult] = []
        flooded = anyio.Event()

        async def call_the_neighbour() -> None:
            while not flooded.is_set():
                with anyio.fail_after(bound(5)):
                    results.append(await client.call_tool(calm.mcp_name(PING), {}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_the_neighbour)
            await flooding.flood(FLOOD)
            flooded.set()
        last = f"version {flooding.version}"
        async with run.gateway.registry.changes() as changes:
            await until(changes, lambda: served_description(run, flooding.device_id) == last)
        listings = flooding.listings - before
        served = {t.name: t for t in (await client.list_tools()).tools}
    interval = run.gateway.config.relist_interval
    assert listings <= FLOOD / interval + 2, f"{listings} listings in {FLOOD} s"
    assert served[flooding.mcp_name(PING)].description is not None
    assert last in served[flooding.mcp_name(PING)].description
    assert results and all(not r.is_error for r in results), [r for r in results if r.is_error]
    assert len(calm.calls) == len(results)


class CountingBoard(MCPServer):
    """An MCP SDK server that counts the tools/list requests it answers."""

    listings = 0

    async def list_tools(self) -> list[MCPTool]:
        """The SDK's answer, counted."""
        self.listings += 1
        return await super().list_tools()


def flooding_board() -> CountingBoard:
    """A board whose ``flood`` tool renames its ``version_<n>`` tool and says its tools changed,
    every 5 ms for ``FLOOD`` seconds; it answers with the last version."""
    board = CountingBoard("flood")
    board.add_tool(lambda: "0", name="version_0", description="The first version.")

    @board.tool(description="Change the tools every 5 ms for a while.")
    async def flood(ctx: Context) -> str:
        version = 0
        ends = time.monotonic() + FLOOD
        while time.monotonic() < ends:
            board.remove_tool(f"version_{version}")
            version += 1
            board.add_tool(lambda: "v", name=f"version_{version}", description="A version.")
            await ctx.session.send_tool_list_changed()
            await anyio.sleep(0.005)  # the board's own pace, not a wait of the test
        return f"version_{version}"

    return board


async def test_a_board_flooding_list_changed_is_listed_a_few_times_and_its_last_tools_served(
    tmp_path: Path,
) -> None:
    """A board the gateway reaches over streamable HTTP, flooding for FLOOD seconds: at most
    one listing per relist_interval (and two more), and hosts get its last tools."""
    board = flooding_board()
    async with served(board.streamable_http_app()) as base:
        url = f"{base}/mcp"
        async with gateway(tmp_path, mcp_devices=(BoardOptions(url, name="flood"),)) as run:
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
            before = board.listings
            async with Client(run.mcp_url, mode="legacy") as client:
                [text] = (await client.call_tool("flood_flood", {})).content
                assert isinstance(text, types.TextContent)
                last = f"flood_{text.text}"
                async with run.gateway.registry.changes() as changes:
                    await until(changes, exposes(run, board_id(url), last))
                names = [t.name for t in (await client.list_tools()).tools]
            listings = board.listings - before
    interval = run.gateway.config.relist_interval
    assert listings <= FLOOD / interval + 2, f"{listings} listings in {FLOOD} s"
    assert [n for n in names if n.startswith("flood_version_")] == [last]
