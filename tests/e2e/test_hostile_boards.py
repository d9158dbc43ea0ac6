"""Hostile boards get what a hostile xiaozhi device gets, and harm no other board or host."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from gateway.app import Running
from gateway.config.boards import BoardOptions
from gateway.device_side.boards import board_id
from gateway.protocol.device import DeviceProtocol
from tests.conftest import bound, gateway
from tests.e2e.boards import BoardState, Hostile, python_board, served
from tests.e2e.helpers import has_tools, until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MAX_PAGES = DeviceProtocol.__init__.__kwdefaults__["max_pages"]  # type: ignore[index]


async def tool_names(run: Running) -> list[str]:
    async with Client(run.mcp_url, mode="legacy") as client:
        return [t.name for t in (await client.list_tools()).tools]


async def test_endless_and_huge_tool_lists_are_cut_short(tmp_path: Path) -> None:
    """Endless pages stop at the page cap, huge pages at the list cap; a good board is served."""
    endless, huge = Hostile("endless"), Hostile("huge")
    async with served(endless) as e, served(huge) as h, served(
        python_board("good", BoardState()).streamable_http_app()
    ) as g:  # fmt: skip
        boards = (BoardOptions(f"{e}/mcp", name="endless"), BoardOptions(f"{h}/mcp", name="huge"),
                  BoardOptions(f"{g}/mcp", name="good"))  # fmt: skip
        async with gateway(tmp_path, mcp_devices=boards, tools_mode="per-device") as run:
            async with run.gateway.registry.changes() as changes:
                for board in boards:
                    await until(changes, has_tools(run, board_id(board.url)))
            names = await tool_names(run)
    assert endless.pages == MAX_PAGES  # counted work: the cap, not the board, ends the listing
    assert huge.pages <= 3  # ~1 MB each: the 2 MiB cap on a whole list ends it
    assert "good_greet" in names and "endless_t1" in names
    assert sum(n.startswith("endless_") for n in names) == MAX_PAGES


async def test_tools_with_invalid_schemas_are_rejected_and_the_rest_served(tmp_path: Path) -> None:
    """A board's tools with broken schemas are left out with a reason; its good tool is served."""
    async with served(Hostile("bad_schemas")) as base:
        url = f"{base}/mcp"
        async with gateway(tmp_path, mcp_devices=(BoardOptions(url, name="odd"),)) as run:
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
            names = await tool_names(run)
            async with Client(run.mcp_url, mode="legacy") as client:
                listing = await client.call_tool("list_devices", {})
    assert "odd_fine" in names and "odd_no_schema" not in names and "odd_bad_props" not in names
    odd = json.loads(listing.content[0].text)["devices"][0]
    assert {r["tool"] for r in odd["rejected"]} == {"no_schema", "bad_props"}


async def test_a_50_mb_result_is_a_clear_error_and_the_board_stays(tmp_path: Path) -> None:
    """A reply past [mcp_boards] max_message_bytes ends the call with a clear error, at once."""
    async with served(Hostile("big_result")) as base:
        url = f"{base}/mcp"
        async with gateway(tmp_path, mcp_devices=(BoardOptions(url, name="big"),)) as run:
            async with run.gateway.registry.changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
            async with Client(run.mcp_url, mode="legacy") as client:
                with anyio.fail_after(bound(20)):
                    result = await client.call_tool("big_fine", {})
                again = await client.call_tool("big_fine", {})
            online = run.gateway.registry.get(board_id(url)).online  # type: ignore[union-attr]
    assert result.is_error and "larger than 4194304 bytes" in result.content[0].text
    assert again.is_error and online  # the board is still there; each big reply is refused


async def test_silent_and_redirecting_boards_do_not_hold_up_others(tmp_path: Path) -> None:
    """A board that never answers, or redirects elsewhere, stays offline; others are served.

    The redirect's target (on 127.0.0.1, another port) never hears from the gateway.
    """
    target = Hostile("bad_schemas")
    async with served(target) as elsewhere, served(Hostile("silent")) as s, served(
        python_board("good", BoardState()).streamable_http_app()
    ) as g:  # fmt: skip
        redirect = Hostile("redirect", location=f"{elsewhere}/mcp")
        async with served(redirect) as r:
            boards = (BoardOptions(f"{s}/mcp", name="mute"), BoardOptions(f"{r}/mcp", name="hop"),
                      BoardOptions(f"{g}/mcp", name="good"))  # fmt: skip
            config = {"mcp_devices": boards, "discovery_timeout": bound(1)}
            async with gateway(tmp_path, **config) as run:
                async with run.gateway.registry.changes() as changes:
                    await until(changes, has_tools(run, board_id(boards[2].url)))
                hop = run.gateway.boards.get(board_id(boards[1].url))
                assert hop is not None
                with anyio.fail_after(bound(10)):
                    await hop.attempted.wait()
                names = await tool_names(run)
                registry = run.gateway.registry
                mute = registry.get(board_id(boards[0].url))
    assert "good_greet" in names
    assert not any(n.startswith(("mute_", "hop_")) for n in names)
    assert mute is None or not mute.online
    assert redirect.requests >= 1 and target.requests == 0  # the redirect was not followed
    assert hop.problem is not None


@pytest.mark.parametrize("where", ["itself", "link-local"])
async def test_board_urls_leading_to_the_gateway_or_link_local_are_refused(
    tmp_path: Path, where: str
) -> None:
    """A URL resolving to this gateway's own listener, or to a link-local address, is refused."""
    async with gateway(tmp_path) as run:
        url = (f"http://127.0.0.1:{run.host_port}/mcp" if where == "itself"
               else "http://169.254.169.254/mcp")  # fmt: skip
        added = run.gateway.boards.add(url, "loop")
        board = run.gateway.boards.get(added["id"])
        assert board is not None
        with anyio.fail_after(bound(10)):
            await board.attempted.wait()
        device = run.gateway.registry.get(added["id"])
    expected = "this gateway itself" if where == "itself" else "a link-local address"
    assert board.problem is not None and expected in board.problem
    assert device is None or not device.online
