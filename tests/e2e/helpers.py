"""Helpers for end-to-end tests: wait on the gateway's own change events, record MCP pushes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
from websockets.asyncio.client import ClientConnection

from gateway.app import Running
from gateway.devices.registry import Changes
from gateway.simulator import SimulatedDevice
from tests.conftest import DEVICE_TOKEN, bound

STOCK_HELLO = {
    "type": "hello",
    "version": 1,
    "features": {"mcp": True},
    "transport": "websocket",
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}


def stock_headers(device_id: str = "aa:bb:cc:dd:ee:01") -> dict[str, str]:
    """The handshake headers stock firmware sends (xiaozhi-protocol.md §1)."""
    return {
        "Authorization": f"Bearer {DEVICE_TOKEN}",
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


class Inbox:
    """An MCP ``message_handler`` that records ``tools/list_changed`` pushes."""

    def __init__(self) -> None:
        self.count = 0
        self._event = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
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
