"""Helpers for end-to-end tests: wait on the gateway's own change events, record MCP pushes,
and run raw stock-like devices."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.app import Running
from gateway.config import DeviceOptions
from gateway.devices.registry import Changes, DeviceRegistry
from gateway.simulator import SimulatedDevice
from tests.conftest import DEVICE_TOKEN, bound

JsonObject = dict[str, Any]

STOCK_HELLO = {
    "type": "hello",
    "version": 1,
    "features": {"mcp": True},
    "transport": "websocket",
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}


def stock_headers(
    device_id: str = "aa:bb:cc:dd:ee:01", token: str = DEVICE_TOKEN
) -> dict[str, str]:
    """The handshake headers stock firmware sends (docs/protocol.md §1)."""
    return {
        "Authorization": f"Bearer {token}",
        "Protocol-Version": "1",
        "Device-Id": device_id,
        "Client-Id": "5b3f4c1e-0000-4000-8000-000000000001",
    }


async def receive_json(ws: ClientConnection) -> dict[str, object]:
    """The next text frame from the gateway, parsed (binary frames are skipped)."""
    with anyio.fail_after(bound(5)):
        while True:
            frame = await ws.recv()
            if isinstance(frame, str):
                message: dict[str, object] = json.loads(frame)
                return message


def fail_catalogue_of(monkeypatch: pytest.MonkeyPatch, device_id: str) -> None:
    """Make the registry raise on ``device_id``'s tool list (a bug in handling one device's
    message), and only on its."""
    set_catalogue = DeviceRegistry.set_catalogue

    def failing(registry: DeviceRegistry, device: str, *args: Any, **kwargs: Any) -> None:
        if device == device_id:
            raise RuntimeError("the registry broke on this device")
        set_catalogue(registry, device, *args, **kwargs)

    monkeypatch.setattr(DeviceRegistry, "set_catalogue", failing)


async def join_listing_no_tools(url: str, device_id: str) -> int | None:
    """A stock device joins at ``url``, answers ``initialize`` and lists no tools, then waits
    for the gateway to close it; its close code."""
    async with connect(url, additional_headers=stock_headers(device_id)) as ws:
        await ws.send(json.dumps(STOCK_HELLO))
        assert (await receive_json(ws))["type"] == "hello"
        for method, result in (("initialize", {"protocolVersion": "2024-11-05"}), ("tools/list",
                               {"tools": []})):  # fmt: skip
            request: Any = (await receive_json(ws))["payload"]
            assert request["method"] == method
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
            await ws.send(json.dumps({"session_id": "", "type": "mcp", "payload": reply}))
        with anyio.fail_after(bound(5)):
            await ws.wait_closed()
        return ws.close_code


class Inbox:
    """An MCP ``message_handler`` that records ``tools/list_changed`` pushes (or ``kind``'s)."""

    def __init__(self, kind: type[Any] = types.ToolListChangedNotification) -> None:
        self.kind = kind
        self.count = 0
        self._event = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, self.kind):
            self.count += 1
            self._event.set()

    async def next_change(self) -> None:
        """Wait for the next push (one that arrived since the last call counts)."""
        with anyio.fail_after(bound(5)):
            await self._event.wait()
        self._event = anyio.Event()


async def until(changes: Changes, condition: Callable[[], bool]) -> None:
    """Wait on registry changes until ``condition`` holds."""
    with anyio.fail_after(bound(10)):
        while not condition():
            await anext(changes)


def has_tools(run: Running, device_id: str) -> Callable[[], bool]:
    """A condition: the device is online and its tools are visible to hosts."""
    registry = run.gateway.registry

    def check() -> bool:
        return any(
            t.device.device_id == device_id and t.device.online for t in registry.exposed_tools()
        )

    return check


@asynccontextmanager
async def listed_device(
    run: Running, device_id: str = "02:00:00:00:00:01", **kwargs: Any
) -> AsyncIterator[SimulatedDevice]:
    """A simulated device, connected and with its tools listed by the gateway."""
    async with run.gateway.registry.changes() as changes:
        async with SimulatedDevice(
            run.device_url, DEVICE_TOKEN, device_id=device_id, **kwargs
        ) as dev:
            await until(changes, has_tools(run, device_id))
            yield dev


@dataclass
class RawDevice:
    """A stock-like device on a raw WebSocket, serving a fixed catalogue.

    It says hello, answers ``initialize``, ``tools/list`` (``page_size`` tools a page; the cursor
    is the next tool's name, as on stock firmware) and ``tools/call`` (with text), and records
    the calls it gets. Its frames are ASCII JSON, so lone surrogates travel escaped. It joins
    with the shared device token, or with ``credential`` (the one an OTA reply gave it).
    """

    device_id: str
    alias: str
    tools: list[JsonObject]
    page_size: int = 16
    credential: str = DEVICE_TOKEN
    calls: list[tuple[str, JsonObject]] = field(default_factory=list)
    _ws: ClientConnection | None = field(default=None, init=False, repr=False)

    def mcp_name(self, tool: str) -> str:
        """The name hosts see for this device's ``tool``: ``<alias>_<tool without self.>``."""
        return f"{self.alias}_{tool.removeprefix('self.').replace('.', '_')}"

    async def serve(
        self, url: str, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, say hello (then count as started), and answer until the link closes."""
        headers = stock_headers(self.device_id, self.credential)
        async with connect(url, additional_headers=headers) as ws:
            self._ws = ws
            await ws.send(json.dumps(STOCK_HELLO))
            task_status.started()
            try:
                async for frame in ws:
                    reply = (
                        await self.respond(json.loads(frame)) if isinstance(frame, str) else None
                    )
                    if reply is not None:
                        await ws.send(json.dumps(reply))
            except ConnectionClosed:
                pass

    async def respond(self, message: JsonObject) -> JsonObject | None:
        """The reply to one message from the gateway (devices that do I/O to answer override)."""
        return self._answer(message)

    async def close(self) -> None:
        """Close the WebSocket; ``serve`` then returns."""
        if self._ws is not None:
            await self._ws.close()

    def _answer(self, message: JsonObject) -> JsonObject | None:
        payload = message.get("payload")
        if message.get("type") != "mcp" or not isinstance(payload, dict) or "id" not in payload:
            return None
        method, params = payload.get("method"), payload.get("params") or {}
        reply: JsonObject = {"jsonrpc": "2.0", "id": payload["id"]}
        if method == "initialize":
            reply["result"] = {
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw-board", "version": "1.0.0"},
            }
        elif method == "tools/list":
            reply["result"] = self._page(params.get("cursor"))
        elif method == "tools/call":
            self.calls.append((params["name"], params.get("arguments") or {}))
            reply["result"] = {"content": [{"type": "text", "text": f"{params['name']} done"}]}
        else:
            reply["error"] = {"message": f"Method not implemented: {method}"}
        return {"session_id": "", "type": "mcp", "payload": reply}

    def _page(self, cursor: str | None) -> JsonObject:
        names = [tool["name"] for tool in self.tools]
        start = names.index(cursor) if cursor else 0
        end = start + self.page_size
        page: JsonObject = {"tools": self.tools[start:end]}
        if end < len(self.tools):
            page["nextCursor"] = names[end]
        return page


def aliases(*devices: RawDevice) -> dict[str, DeviceOptions]:
    """The ``devices`` config that names each raw device by its alias."""
    return {device.device_id: DeviceOptions(name=device.alias) for device in devices}


def exposes(run: Running, device_id: str, name: str) -> Callable[[], bool]:
    """A condition: the device ``device_id`` is online and hosts see its tool ``name``."""
    registry = run.gateway.registry

    def check() -> bool:
        return any(
            t.name == name and t.device.device_id == device_id and t.device.online
            for t in registry.exposed_tools()
        )

    return check


@asynccontextmanager
async def serving(run: Running, *devices: RawDevice) -> AsyncIterator[None]:
    """Raw devices, connected and with their whole catalogue processed; closed on exit.

    Every device must list a good tool last: once hosts see it, the gateway has read every tool.
    """
    async with run.gateway.registry.changes() as changes, anyio.create_task_group() as tg:
        try:
            for device in devices:
                await tg.start(device.serve, run.device_url)
            last = [exposes(run, d.device_id, d.mcp_name(d.tools[-1]["name"])) for d in devices]
            await until(changes, lambda: all(condition() for condition in last))
            yield
        finally:
            with anyio.fail_after(bound(5)):
                for device in devices:
                    await device.close()
