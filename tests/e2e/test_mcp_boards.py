"""Boards that serve MCP themselves, played by the MCP SDKs' servers, beside a xiaozhi device."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from gateway.config.boards import BoardOptions
from gateway.device_side.boards import board_id
from tests.conftest import bound, gateway
from tests.e2e.boards import PNG, BoardState, Switchable, python_board, served, ts_board
from tests.e2e.helpers import Inbox, exposes, has_tools, listed_device, until

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


async def test_board_goes_offline_keeps_its_tools_and_comes_back(tmp_path: Path) -> None:
    """A board that stops serving MCP goes offline (tools kept, calls say so) and rejoins."""
    board = Switchable(python_board("porch", BoardState()).streamable_http_app())
    async with served(board) as base:
        url = f"{base}/mcp"
        overrides = {
            "mcp_devices": (BoardOptions(url, name="porch"),),
            "boards_ping_interval": bound(1),
        }
        async with gateway(tmp_path, **overrides) as run:
            registry = run.gateway.registry
            online = lambda: registry.get(board_id(url)).online  # noqa: E731
            async with registry.device_changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
                board.down = True  # rebooting: its HTTP server answers 503, no MCP yet
                await until(changes, lambda: not online())  # its next ping fails
                async with Client(run.mcp_url, mode="legacy") as client:
                    names = [t.name for t in (await client.list_tools()).tools]
                    away = await client.call_tool("porch_greet", {"who": "bob"})
                board.down = False
                await until(changes, online)
                async with Client(run.mcp_url, mode="legacy") as client:
                    back = await client.call_tool("porch_greet", {"who": "bob"})
    assert "porch_greet" in names  # offline memory: still listed
    assert away.is_error and "offline" in away.content[0].text
    assert back.content[0].text == "hello bob from porch"


async def test_board_tool_list_change_reaches_hosts(tmp_path: Path) -> None:
    """A board's tools/list_changed is followed: hosts are told and see the new tool."""
    app = python_board("shed", BoardState()).streamable_http_app()
    async with served(app) as base:
        url = f"{base}/mcp"
        async with gateway(tmp_path, mcp_devices=(BoardOptions(url, name="shed"),)) as run:
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
            inbox = Inbox()
            async with Client(run.mcp_url, mode="legacy", message_handler=inbox) as client:
                with anyio.fail_after(bound(5)):
                    await run.gateway.frontend.notifier.wait_for_sessions(1)
                await client.call_tool("shed_grow", {})
                names: list[str] = []
                while "shed_extra" not in names:  # hosts may hear of other changes first
                    await inbox.next_change()
                    names = [t.name for t in (await client.list_tools()).tools]
                extra = await client.call_tool("shed_extra", {})
    assert "shed_extra" in names
    assert extra.content[0].text == "extra!"


async def test_slow_board_tool_times_out_and_other_boards_answer(tmp_path: Path) -> None:
    """A board's tool slower than the call timeout ends as a clear error; another board answers."""
    slow_state = BoardState()
    async with (
        served(python_board("slowpoke", slow_state).streamable_http_app()) as slow_base,
        served(python_board("quick", BoardState()).streamable_http_app()) as quick_base,
    ):
        boards = (BoardOptions(f"{slow_base}/mcp", name="slowpoke"),
                  BoardOptions(f"{quick_base}/mcp", name="quick"))  # fmt: skip
        async with gateway(tmp_path, mcp_devices=boards, call_timeout=bound(1)) as run:
            async with run.gateway.registry.changes() as changes:
                for board in boards:
                    await until(changes, has_tools(run, board_id(board.url)))
            async with (
                Client(run.mcp_url, mode="legacy") as client,
                anyio.create_task_group() as tg,
            ):
                results = {}

                async def call(name: str, arguments: dict[str, str]) -> None:
                    results[name] = await client.call_tool(name, arguments)

                tg.start_soon(call, "slowpoke_slow", {})
                await slow_state.slow_started.wait()
                await call("quick_greet", {"who": "eve"})
            with anyio.fail_after(bound(5)):
                await slow_state.cancelled.wait()
        slow_state.release.set()
    assert results["quick_greet"].content[0].text == "hello eve from quick"
    assert results["slowpoke_slow"].is_error
    assert "did not answer slow within" in results["slowpoke_slow"].content[0].text
    assert slow_state.cancelled.is_set()  # the board was told to stop (notifications/cancelled)


async def test_sse_board_is_reached_after_streamable_http_fails(tmp_path: Path) -> None:
    """A board serving only the older HTTP+SSE transport is reached through the fallback."""
    app = python_board("attic", BoardState()).sse_app(sse_path="/board", message_path="/posts/")
    async with served(app) as base:
        url = f"{base}/board"
        async with gateway(tmp_path, mcp_devices=(BoardOptions(url, name="attic"),)) as run:
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
            async with Client(run.mcp_url, mode="legacy") as client:
                greeting = await client.call_tool("attic_greet", {"who": "sam"})
    assert greeting.content[0].text == "hello sam from attic"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_typescript_sdk_board_beside_a_xiaozhi_device(tmp_path: Path, mode: str) -> None:
    """A board served by the TypeScript SDK: text, image, a changing tool list, a slow tool."""
    async with ts_board("ts-lamp") as url:
        boards = (BoardOptions(url, name="tslamp"),)
        async with gateway(tmp_path, mcp_devices=boards, call_timeout=bound(1)) as run:
            async with listed_device(run), run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
                async with Client(run.mcp_url, mode=mode) as client:
                    greeting = await client.call_tool("tslamp_greet", {"who": "ada"})
                    photo = await client.call_tool("tslamp_take_photo", {})
                    slow = await client.call_tool("tslamp_slow", {})
                    lamp = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
                    await client.call_tool("tslamp_grow", {})
                    await until(changes, exposes(run, board_id(url), "tslamp_extra"))
                    extra = await client.call_tool("tslamp_extra", {})
    assert greeting.content[0].text == "hello ada from ts-lamp"
    assert base64.b64decode(photo.content[0].data) == PNG
    assert slow.is_error and "did not answer slow within" in slow.content[0].text
    assert not lamp.is_error and extra.content[0].text == "extra!"
