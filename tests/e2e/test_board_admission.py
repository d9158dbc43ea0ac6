"""Adding a board by URL: the CLI and the API, its bearer token, kept across restarts; a
``boards.json`` that cannot be read is never written over."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gateway.device_side.boards import board_id
from tests.conftest import gateway
from tests.e2e.boards import BoardState, bearer_only, python_board, served
from tests.e2e.helpers import has_tools, until
from tests.e2e.test_stdio_and_cli import cli, cli_env
from tests.ports import refusing_port

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BOARD_TOKEN = "board-secret-0123456789"


async def test_devices_add_serves_a_board_with_its_token_across_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`devices add URL --board-token` makes the board a device, approved; it stays added."""
    app = bearer_only(python_board("garage", BoardState()).streamable_http_app(), BOARD_TOKEN)
    caplog.set_level(logging.DEBUG)
    async with served(app) as base:
        url = f"{base}/mcp"
        async with gateway(tmp_path / "gw") as run:
            env = cli_env(tmp_path / "cli")
            host = f"http://127.0.0.1:{run.host_port}"
            async with run.gateway.registry.changes() as changes:
                code, out, err = await cli("devices", "add", url, "--name", "garage",
                                           "--board-token", BOARD_TOKEN, "--url", host,
                                           env=env)  # fmt: skip
                assert code == 0, err
                assert f"added garage ({board_id(url)})" in out
                await until(changes, has_tools(run, board_id(url)))
            code, table, _ = await cli("devices", "--url", host, env=env)
            assert code == 0 and "garage" in table
        saved = tmp_path / "gw" / "boards.json"
        assert oct(saved.stat().st_mode & 0o777) == "0o600"  # it holds the board's token
        assert json.loads(saved.read_text())[0]["url"] == url
        async with gateway(tmp_path / "gw") as run:  # a restart: the board comes back by itself
            async with run.gateway.registry.device_changes() as changes:
                await until(changes, has_tools(run, board_id(url)))
            device = run.gateway.registry.get(board_id(url))
            assert device is not None and device.alias == "garage" and device.approved
    assert BOARD_TOKEN not in caplog.text


async def test_devices_add_refuses_what_is_not_a_board_url(tmp_path: Path) -> None:
    """A URL that is not http(s) gets a clear one-line error and adds nothing."""
    async with gateway(tmp_path / "gw") as run:
        host = f"http://127.0.0.1:{run.host_port}"
        env = cli_env(tmp_path / "cli")
        code, _, err = await cli("devices", "add", "ftp://lamp.local/mcp", "--url", host, env=env)
        assert code == 1 and "http:// or https://" in err and "Traceback" not in err
        assert not (tmp_path / "gw" / "boards.json").exists()


async def test_devices_forget_stops_a_board_for_good(tmp_path: Path) -> None:
    """`devices forget` of a board added by URL disconnects it, and it stays gone on restart."""
    async with served(python_board("attic", BoardState()).streamable_http_app()) as base:
        url = f"{base}/mcp"
        async with gateway(tmp_path / "gw") as run:
            env = cli_env(tmp_path / "cli")
            host = f"http://127.0.0.1:{run.host_port}"
            registry = run.gateway.registry
            async with registry.changes() as changes:
                code, _, err = await cli("devices", "add", url, "--name", "attic", "--url", host,
                                         env=env)  # fmt: skip
                assert code == 0, err
                await until(changes, has_tools(run, board_id(url)))
                code, out, err = await cli("devices", "forget", "attic", "--url", host, env=env)
                assert code == 0, err
                await until(changes, lambda: registry.get(board_id(url)) is None)
            assert run.gateway.boards.get(board_id(url)) is None
        assert json.loads((tmp_path / "gw" / "boards.json").read_text()) == []
        async with gateway(tmp_path / "gw") as run:
            assert run.gateway.boards.get(board_id(url)) is None


def kept_boards(port: int, count: int) -> list[dict[str, str]]:
    """``count`` boards as boards.json keeps them, at a port that refuses connections."""
    return [{"url": f"http://127.0.0.1:{port}/mcp/{n}", "name": f"board{n}",
             "token": f"token-{n:02}-0123456789"} for n in range(count)]  # fmt: skip


async def test_devices_add_over_an_unreadable_boards_json_is_refused_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A boards.json cut short (18 boards and their tokens, issue 40): `devices add` is refused
    with an error naming the file, which stays byte for byte; repaired, every board is back."""
    caplog.set_level(logging.DEBUG)
    saved = tmp_path / "gw" / "boards.json"
    saved.parent.mkdir(mode=0o700)
    with refusing_port() as port:
        boards = kept_boards(port, 18)
        whole = json.dumps(boards, indent=1).encode()
        saved.write_bytes(whole[: len(whole) // 2])  # a write cut short
        corrupt = saved.read_bytes()
        added = f"http://127.0.0.1:{port}/mcp/new"
        async with gateway(tmp_path / "gw") as run:
            host = f"http://127.0.0.1:{run.host_port}"
            code, out, err = await cli("devices", "add", added, "--name", "new", "--url", host,
                                       env=cli_env(tmp_path / "cli"))  # fmt: skip
            assert code == 1 and out == "", (out, err)
            assert f"{saved} cannot be read" in err and "nothing was saved" in err, err
            assert "Traceback" not in err
            assert saved.read_bytes() == corrupt
            assert run.gateway.boards.get(board_id(added)) is None
        saved.write_bytes(whole)  # the owner repairs it
        async with gateway(tmp_path / "gw") as run:
            for board in boards:
                assert run.gateway.boards.get(board_id(board["url"])) is not None, board
    assert not any(board["token"] in caplog.text for board in boards)


async def test_an_entry_of_boards_json_that_is_no_board_is_kept_as_it_was(tmp_path: Path) -> None:
    """An entry the gateway cannot use is not connected, and stays in the file when a board
    is added: the file loses nothing."""
    saved = tmp_path / "gw" / "boards.json"
    saved.parent.mkdir(mode=0o700)
    with refusing_port() as port:
        [board, added] = kept_boards(port, 2)
        odd = {"url": "ftp://lamp.local/mcp", "token": "kept-as-it-was"}
        saved.write_text(json.dumps([odd, board]))
        async with gateway(tmp_path / "gw") as run:
            host = f"http://127.0.0.1:{run.host_port}"
            code, _, err = await cli("devices", "add", added["url"], "--name", added["name"],
                                     "--board-token", added["token"], "--url", host,
                                     env=cli_env(tmp_path / "cli"))  # fmt: skip
            assert code == 0, err
    assert json.loads(saved.read_text()) == [odd, board, added]
