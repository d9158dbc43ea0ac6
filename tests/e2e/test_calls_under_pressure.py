"""Calls under pressure against a real gateway: the per-device bound, and cancellation that
reaches the device (issue 11, item 4). The device is a raw WebSocket that holds its calls."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
import pytest
from mcp import Client
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.app import Running
from gateway.config import DeviceOptions
from tests.conftest import bound, gateway
from tests.e2e.helpers import STOCK_HELLO, has_tools, stock_headers, until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]
DEVICE_ID = "aa:bb:cc:dd:0e:01"
TOOL = {"name": "self.lamp.turn_on", "description": "Switch the lamp on.",
        "inputSchema": {"type": "object", "properties": {}}}  # fmt: skip
MCP_NAME = "kitchen_lamp_turn_on"
KITCHEN = {DEVICE_ID: DeviceOptions(name="kitchen")}


class HoldingDevice:
    """A stock-like device whose tool calls wait, unanswered, until ``release()``.

    It records the ids of the calls it gets and the params of every ``notifications/cancelled``.
    """

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.cancelled: list[JsonObject] = []
        self._held: list[int] = []
        self._released = False
        self._ws: ClientConnection | None = None
        self._changed = anyio.Event()

    async def serve(
        self, url: str, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, say hello (then count as started), and serve until the link closes."""
        async with connect(url, additional_headers=stock_headers(DEVICE_ID)) as ws:
            self._ws = ws
            await ws.send(json.dumps(STOCK_HELLO))
            task_status.started()
            try:
                async for frame in ws:
                    if isinstance(frame, str):
                        await self._receive(json.loads(frame).get("payload") or {})
            except ConnectionClosed:
                pass

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition`` holds (checked after each message the device gets)."""
        with anyio.fail_after(bound(5)):
            while not condition():
                await self._changed.wait()

    async def release(self) -> None:
        """Answer the calls held so far, and every later one at once."""
        self._released = True
        for call_id in self._held:
            await self._answer(call_id, {"content": [{"type": "text", "text": "on"}]})
        self._held.clear()

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def _receive(self, payload: JsonObject) -> None:
        method, call_id = payload.get("method"), payload.get("id")
        if method == "initialize":
            info = {"name": "raw-board", "version": "1.0.0"}
            await self._answer(call_id, {"capabilities": {"tools": {}}, "serverInfo": info})
        elif method == "tools/list":
            await self._answer(call_id, {"tools": [TOOL]})
        elif method == "tools/call":
            self.calls.append(call_id)
            self._held.append(call_id)
            if self._released:
                await self.release()
        elif method == "notifications/cancelled":
            self.cancelled.append(payload["params"])
        self._changed.set()
        self._changed = anyio.Event()

    async def _answer(self, call_id: object, result: JsonObject) -> None:
        assert self._ws is not None
        reply = {"jsonrpc": "2.0", "id": call_id, "result": result}
        await self._ws.send(json.dumps({"session_id": "", "type": "mcp", "payload": reply}))


@asynccontextmanager
async def holding_device(run: Running) -> AsyncIterator[HoldingDevice]:
    """A HoldingDevice, connected and with its tool listed; closed on exit."""
    device = HoldingDevice()
    async with run.gateway.registry.changes() as changes, anyio.create_task_group() as tg:
        await tg.start(device.serve, run.device_url)
        await until(changes, has_tools(run, DEVICE_ID))
        try:
            yield device
        finally:
            with anyio.fail_after(bound(5)):
                await device.close()


def text(result: types.CallToolResult) -> str:
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


def audit(path: Path) -> list[JsonObject]:
    return [json.loads(line) for line in (path / "audit.log").read_text().splitlines()]


async def test_a_call_beyond_the_per_device_bound_fails_at_once_with_a_clear_message(
    tmp_path: Path,
) -> None:
    """Two calls run and one waits; of two more, one fails at once, saying why, while every
    other call is still pending; the waiting call runs when the device answers."""
    options: dict[str, Any] = {"call_max_in_flight": 2, "call_max_queued": 1, "devices": KITCHEN}
    results: list[types.CallToolResult] = []
    done = anyio.Event()

    async def call(client: Client) -> None:
        nonlocal done
        results.append(await client.call_tool(MCP_NAME, {}))
        done.set()
        done = anyio.Event()

    async def next_result() -> types.CallToolResult:
        count = len(results)
        with anyio.fail_after(bound(5)):
            while len(results) == count:
                await done.wait()
        return results[-1]

    async with (
        gateway(tmp_path, **options) as run,
        holding_device(run) as device,
        Client(run.mcp_url, mode="legacy") as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(2):
            tg.start_soon(call, client)
        await device.until(lambda: len(device.calls) == 2)
        for _ in range(2):  # one of these waits for a slot, the other is refused
            tg.start_soon(call, client)
        refused = await next_result()
        assert refused.is_error
        assert text(refused) == (
            "device kitchen is busy: 2 calls running and 1 waiting; try again later"
        )
        assert len(results) == 1 and len(device.calls) == 2  # nothing else has finished
        await device.release()
        while len(results) < 4:
            await next_result()
    assert sorted(text(result) for result in results[1:]) == ["on"] * 3
    assert len(device.calls) == 3 and device.cancelled == []
    outcomes = sorted(record["outcome"] for record in audit(tmp_path))
    assert outcomes == ["DeviceBusy", "ok", "ok", "ok"]


async def test_a_call_that_times_out_is_cancelled_on_the_device(tmp_path: Path) -> None:
    """At the timeout the device gets notifications/cancelled for the call's id; the host and
    the audit log are told that it was."""
    async with (
        gateway(tmp_path, call_timeout=0.5, devices=KITCHEN) as run,
        holding_device(run) as device,
        Client(run.mcp_url, mode="legacy") as client,
    ):
        result = await client.call_tool(MCP_NAME, {})
        await device.until(lambda: bool(device.cancelled))
    message = "device kitchen did not answer self.lamp.turn_on within 0.5 s; "
    message += "the device was told to cancel it"
    assert result.is_error and text(result) == message
    assert device.cancelled == [{"requestId": device.calls[0], "reason": "timed out"}]
    [record] = audit(tmp_path)
    assert (record["outcome"], record["message"]) == ("DeviceTimeout", message)
