"""One replica holds each board that serves MCP itself; the others call it through that one.

Replicas on a real mosquitto, configured with the same board (the MCP Python SDK's server on
uvicorn, tests/e2e/boards.py): the board serves one MCP session, every replica lists and calls
its tools (a photo larger than a xiaozhi device's frames included), and when the holder stops,
another replica takes the board over and calls succeed again.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.types import ImageContent
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.app import Running
from gateway.cluster.boards import BoardOwners
from gateway.cluster.records import BadRecord, BoardOffer
from gateway.cluster.remote import RemoteSession
from gateway.cluster.replica import owner_of
from gateway.config.boards import BoardOptions
from gateway.device_side.boards import board_id
from gateway.device_side.boards.board import HANDOVER
from gateway.devices.registry import DeviceRegistry
from tests.cluster.conftest import Proxy, cluster_options, eventually, shared_secret
from tests.cluster.test_faults import call_text, online, tool
from tests.conftest import bound, gateway
from tests.e2e.boards import BoardState, Hostile, python_board, served
from tests.mqtt_helpers import Mosquitto

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

NAMES = ["gw-1", "gw-2"]
BIG = os.urandom(200_000)  # a photo: larger than a xiaozhi device's frames ([limits], 64 KB)


class Sessions:
    """An MCP server app that notes the sessions it hands out, ends, and serves calls on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.issued: list[str] = []
        self.ended: set[str] = set()
        self.calls_on: list[str] = []  # the session of each tools/call
        self._changed = asyncio.Event()

    @property
    def open(self) -> list[str]:
        return [s for s in self.issued if s not in self.ended]

    async def until(self, check: Callable[[], bool], seconds: float = 10) -> None:
        with anyio.fail_after(bound(seconds)):
            while not check():
                self._changed.clear()
                await self._changed.wait()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = dict(scope["headers"]).get(b"mcp-session-id", b"").decode()
        if scope["method"] == "DELETE" and session:
            self.ended.add(session)
            self._changed.set()
        body = bytearray()

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body") and b'"tools/call"' in body:
                    self.calls_on.append(session)
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.lower() == b"mcp-session-id" and value.decode() not in self.issued:
                        self.issued.append(value.decode())
                        self._changed.set()
            await send(message)

        await self.app(scope, receiving, sending)


def board_app(state: BoardState) -> Sessions:
    server = python_board("workbench", state)

    @server.tool(description="Take a large photo.")
    def big_photo() -> ImageContent:
        data = base64.b64encode(BIG).decode()
        return ImageContent(type="image", data=data, mime_type="image/jpeg")

    return Sessions(server.streamable_http_app())


def name(run: Running) -> str:
    assert run.gateway.cluster is not None
    return run.gateway.cluster.replica


def held_by(run: Running, device_id: str, holder: str) -> Callable[[DeviceRegistry], bool]:
    """A check for ``run``: the board is listed, with its own session on ``holder`` and a
    remote session through ``holder`` on any other replica."""

    def check(registry: DeviceRegistry) -> bool:
        device = registry.get(device_id)
        if device is None or not online(device_id)(registry):
            return False
        remote = isinstance(device.session, RemoteSession)
        if name(run) == holder:
            return not remote
        return remote and device.session.replica == holder  # type: ignore[union-attr]

    return check


async def all_held_by(runs: list[Running], device_id: str, holder: str) -> None:
    for run in runs:
        await eventually([run], held_by(run, device_id, holder))


@dataclass(frozen=True)
class Setup:
    """A board served on loopback, a broker for the replicas, and what each replica is told."""

    broker_port: int
    device_id: str
    boards: tuple[BoardOptions, ...]  # a replica's config naming the board
    holder: str  # the replica the rule picks among all of NAMES


@asynccontextmanager
async def board_and_broker(tmp: Path, board: ASGIApp, label: str = "bench") -> AsyncIterator[Setup]:
    async with Mosquitto(tmp / "broker") as broker, served(board) as base:
        url = f"{base}/mcp"
        device_id = board_id(url)
        boards = (BoardOptions(url, name=label),)
        yield Setup(broker.port, device_id, boards, owner_of(device_id, NAMES))


async def replica(stack: AsyncExitStack, tmp: Path, port: int, n: str,
                  boards: tuple[BoardOptions, ...]) -> Running:  # fmt: skip
    """Replica ``n`` with ``boards`` in its config, stopped when ``stack`` closes."""
    data_dir = shared_secret(tmp / n)
    options = cluster_options(port, n, mcp_devices=boards)
    return await stack.enter_async_context(gateway(data_dir, **options))


async def test_two_replicas_with_one_board_hold_one_session_and_both_call_it(
    tmp_path: Path,
) -> None:
    """Both replicas configured with the board: it serves one MCP session, the holder's by the
    rule; each replica lists it (as mcp-http) and calls its tools, a large photo too."""
    state = BoardState()
    board = board_app(state)
    async with board_and_broker(tmp_path, board) as setup:
        device_id, holder = setup.device_id, setup.holder
        async with AsyncExitStack() as stack:
            runs = [await replica(stack, tmp_path, setup.broker_port, n, setup.boards)
                    for n in NAMES]  # fmt: skip
            await all_held_by(runs, device_id, holder)
            await board.until(lambda: len(board.open) == 1)
            for run in runs:
                assert await call_text(run, tool(run, device_id, "greet"), {"who": name(run)}) \
                    == (False, f"hello {name(run)} from workbench")  # fmt: skip
                registry = run.gateway.registry
                assert registry.get(device_id).record.transport == "mcp-http"  # type: ignore[union-attr]
                photo = await call_image(run, tool(run, device_id, "big_photo"))
                assert base64.b64decode(photo) == BIG
            assert state.calls == ["greet", "greet"]
            assert board.open == [board.calls_on[0]] and len(set(board.calls_on)) == 1


async def call_image(run: Running, name: str) -> str:
    async with Client(run.mcp_url, mode="legacy") as client:
        result = await client.call_tool(name, {})
    assert not result.is_error, result.content
    assert isinstance(result.content[0], ImageContent)
    return result.content[0].data


async def test_the_other_replica_takes_the_board_when_its_holder_stops(
    tmp_path: Path,
) -> None:
    """The other replica holds the board until the holder by the rule joins and takes it over;
    the holder stops: the other connects to the board again and serves it itself, and calls
    succeed again, on a session of its own."""
    state = BoardState()
    board = board_app(state)
    async with board_and_broker(tmp_path, board) as setup:
        device_id, holder = setup.device_id, setup.holder
        [heir] = [n for n in NAMES if n != holder]
        # The heir starts first and holds the board alone, until the holder comes and takes it
        # (the holder's stack is the inner one: it can stop first).
        stacks = {n: AsyncExitStack() for n in (heir, holder)}
        try:
            runs = {n: await replica(stacks[n], tmp_path, setup.broker_port, n, setup.boards)
                    for n in stacks}  # fmt: skip
            await all_held_by(list(runs.values()), device_id, holder)
            await board.until(lambda: len(board.open) == 1)
            [first] = board.open
            await stacks[holder].aclose()
            survivor = runs[heir]
            await all_held_by([survivor], device_id, heir)
            greeting = await call_text(survivor, tool(survivor, device_id, "greet"), {"who": "x"})
            assert greeting == (False, "hello x from workbench")
            assert board.calls_on[-1] != first and board.open == [board.calls_on[-1]]
        finally:
            for stack in reversed(stacks.values()):
                await stack.aclose()


async def test_the_other_replica_takes_the_board_from_a_holder_cut_from_the_broker(
    tmp_path: Path,
) -> None:
    """The holder is cut from the cluster broker (as a death, for the others: its will): the
    other replica connects to the board and its calls succeed; the cut holder ends its own
    session after ``HANDOVER``. (A holder that joins takes a board back: the test above.)"""
    board = board_app(BoardState())
    async with board_and_broker(tmp_path, board) as setup:
        device_id, holder = setup.device_id, setup.holder
        async with AsyncExitStack() as stack:
            proxy = await stack.enter_async_context(Proxy(setup.broker_port))
            runs = []
            for n in sorted(NAMES, key=lambda n: n != holder):  # the holder first
                port = proxy.port if n == holder else setup.broker_port
                runs.append(await replica(stack, tmp_path, port, n, setup.boards))
            await all_held_by(runs, device_id, holder)
            proxy.cut()
            [survivor] = [r for r in runs if name(r) != holder]
            await all_held_by([survivor], device_id, name(survivor))
            greeting = await call_text(survivor, tool(survivor, device_id, "greet"), {"who": "z"})
            assert greeting == (False, "hello z from workbench")
            # The cut holder hears nothing of it, and ends its own session after HANDOVER.
            await board.until(lambda: len(board.open) == 1, seconds=HANDOVER + 10)
            assert board.calls_on == [board.open[0]]


async def test_a_board_only_one_replica_reaches_is_held_there(tmp_path: Path) -> None:
    """A board in one replica's config only: that replica holds it, whatever the rule would
    pick among all live replicas, and the other calls it through that one."""
    board = board_app(BoardState())
    async with board_and_broker(tmp_path, board) as setup:
        device_id = setup.device_id
        lonely = [n for n in NAMES if n != setup.holder][0]  # the rule's loser
        async with AsyncExitStack() as stack:
            runs = []
            for n in NAMES:
                boards = setup.boards if n == lonely else ()
                runs.append(await replica(stack, tmp_path, setup.broker_port, n, boards))
            await all_held_by(runs, device_id, lonely)
            for run in runs:
                assert (await call_text(run, tool(run, device_id, "greet"), {"who": "y"}))[0] \
                    is False  # fmt: skip
            assert len(board.issued) == 1


async def test_a_hostile_boards_50_mb_reply_is_a_clear_error_on_every_replica(
    tmp_path: Path,
) -> None:
    """The holder cuts a 50 MB reply off as it arrives, as a single gateway does: the caller on
    either replica gets the same clear error, at once, and the board stays listed."""
    board = Hostile("big_result")
    async with board_and_broker(tmp_path, board, "big") as setup:
        device_id = setup.device_id
        async with AsyncExitStack() as stack:
            runs = [await replica(stack, tmp_path, setup.broker_port, n, setup.boards)
                    for n in NAMES]  # fmt: skip
            await all_held_by(runs, device_id, setup.holder)
            for run in runs:
                with anyio.fail_after(bound(20)):
                    failed, text = await call_text(run, tool(run, device_id, "fine"), {})
                assert failed and "larger than 4194304 bytes" in text
                assert online(device_id)(run.gateway.registry)


def test_the_holder_is_the_rules_pick_among_the_live_replicas_that_reach_the_board() -> None:
    """Each replica's offer counts while it lives; its own past offer is not read back; a bad
    offer is refused."""
    owners = BoardOwners("gw-1")
    board = board_id("http://192.0.2.1/mcp")
    assert owners.holder(board, ["gw-1", "gw-2"]) is None  # nobody reaches it
    owners.mine = frozenset({board})
    assert owners.holder(board, ["gw-1", "gw-2"]) == "gw-1"
    assert owners.hear("gw-2", BoardOffer(frozenset({board}), 1.0)) is True
    assert owners.hear("gw-2", BoardOffer(frozenset({board}), 2.0)) is False  # no change
    assert owners.holder(board, ["gw-1", "gw-2"]) == owner_of(board, ["gw-1", "gw-2"])
    assert owners.holder(board, ["gw-2"]) == "gw-2"  # gw-1 no longer lives (as seen by gw-2)
    assert owners.hear("gw-1", BoardOffer(frozenset(), 1.0)) is False  # a past life's
    assert owners.hear("gw-2", None) is True
    assert owners.holder(board, ["gw-1", "gw-2"]) == "gw-1"
    assert BoardOffer.read(BoardOffer(frozenset({board}), 3.0).encode()).boards == {board}
    for bad in (b'{"boards": "x", "at": 1}', b'{"boards": ["a b"], "at": 1}', b'{"boards": []}'):
        with pytest.raises(BadRecord):
            BoardOffer.read(bad)
