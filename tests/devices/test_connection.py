"""Tests for gateway.devices.connection: one device over an in-memory link, no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.devices.connection import DeviceConnection
from gateway.devices.link import DeviceIdentity
from gateway.errors import DeviceToolError, DeviceUnavailable
from gateway.protocol import DeviceProtocol
from tests.conftest import bound, make_config
from tests.fakes import MemoryLink, Stack

pytestmark = pytest.mark.anyio

DEVICE = "aa:00:00:00:00:01"
HELLO = {"type": "hello", "version": 1, "features": {"mcp": True}, "transport": "websocket"}
TOOLS = [{"name": "self.lamp.turn_on", "description": "on", "inputSchema": {"type": "object"}}]


def mcp(payload: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": "s", "type": "mcp", "payload": {"jsonrpc": "2.0", **payload}}


class Harness:
    """A DeviceConnection over a MemoryLink, with the registry it reports to."""

    def __init__(self, stack: Stack, link: MemoryLink, task: asyncio.Task[None]) -> None:
        self.stack, self.link, self.task = stack, link, task

    async def sent(self) -> dict[str, Any]:
        async with asyncio.timeout(bound(5)):
            return await self.link.next_sent()

    async def request(self, method: str) -> dict[str, Any]:
        """The next message sent, which must be an MCP request for ``method``."""
        payload = (await self.sent())["payload"]
        assert payload["method"] == method, payload
        return dict(payload)

    async def discover(self) -> None:
        """Say hello and answer initialize and tools/list like stock firmware."""
        self.link.feed(HELLO)
        assert (await self.sent())["type"] == "hello"
        initialize = await self.request("initialize")
        self.link.feed(mcp({"id": initialize["id"], "result": {"serverInfo": {"name": "b"}}}))
        listing = await self.request("tools/list")
        async with self.stack.registry.changes() as changes:
            self.link.feed(mcp({"id": listing["id"], "result": {"tools": TOOLS}}))
            async with asyncio.timeout(bound(5)):
                await anext(changes)


@asynccontextmanager
async def connected(tmp_path: Path, **protocol: Any) -> AsyncIterator[Harness]:
    stack = Stack(make_config(tmp_path))
    link = MemoryLink()
    identity = DeviceIdentity(device_id=DEVICE, client_id="c1", transport="websocket")
    proto = DeviceProtocol(DEVICE, clock=asyncio.get_running_loop().time, **protocol)
    connection = DeviceConnection(link, identity, stack.registry, proto)
    task = asyncio.create_task(connection.run())
    try:
        yield Harness(stack, link, task)
    finally:
        await link.aclose()
        async with asyncio.timeout(bound(5)):
            await task
        stack.close()


async def call(harness: Harness, arguments: dict[str, Any]) -> asyncio.Task[dict[str, Any]]:
    device = harness.stack.registry.find(DEVICE)
    assert device is not None and device.session is not None
    return asyncio.create_task(device.session.call("self.lamp.turn_on", arguments))


async def test_discovery_lists_the_tools_into_the_registry(tmp_path: Path) -> None:
    """Hello, initialize and tools/list end with the device's tools exposed."""
    async with connected(tmp_path) as harness:
        await harness.discover()
        names = [t.name for t in harness.stack.registry.exposed_tools()]
        assert names == ["b_0001_lamp_turn_on"]


async def test_silent_device_is_discovered_at_the_hello_deadline(tmp_path: Path) -> None:
    """No hello: initialize goes out when hello_timeout passes (the protocol's timer)."""
    async with connected(tmp_path, hello_timeout=0.05) as harness:
        await harness.request("initialize")


async def test_discovery_that_never_ends_closes_the_link(tmp_path: Path) -> None:
    """A device that never answers initialize is dropped at discovery_timeout, then offline."""
    async with connected(tmp_path, hello_timeout=0.0, discovery_timeout=0.05) as harness:
        await harness.request("initialize")
        async with asyncio.timeout(bound(5)):
            await harness.task
        assert harness.link.closed
        device = harness.stack.registry.find(DEVICE)
        assert device is not None and not device.online


async def test_call_result_and_device_error(tmp_path: Path) -> None:
    """A reply settles the call; an error reply raises DeviceToolError with its code."""
    async with connected(tmp_path) as harness:
        await harness.discover()
        pending = await call(harness, {})
        request = await harness.request("tools/call")
        harness.link.feed(mcp({"id": request["id"], "result": {"content": []}}))
        assert await pending == {"content": []}
        pending = await call(harness, {})
        request = await harness.request("tools/call")
        harness.link.feed(mcp({"id": request["id"], "error": {"code": -32000, "message": "no"}}))
        with pytest.raises(DeviceToolError) as failure:
            await pending
        assert failure.value.code == -32000


async def test_link_loss_fails_pending_calls_at_once(tmp_path: Path) -> None:
    """A call in flight when the link goes fails now with DeviceUnavailable, not at a timeout."""
    async with connected(tmp_path) as harness:
        await harness.discover()
        pending = await call(harness, {})
        await harness.request("tools/call")
        await harness.link.aclose()
        async with asyncio.timeout(bound(5)):
            with pytest.raises(DeviceUnavailable, match="disconnected during the call"):
                await pending


async def test_reconnect_closes_the_replaced_session(tmp_path: Path) -> None:
    """A second connection for the same device takes over and closes the first link."""
    async with connected(tmp_path) as harness:
        await harness.discover()
        link = MemoryLink()
        identity = DeviceIdentity(device_id=DEVICE, client_id="c1", transport="websocket")
        protocol = DeviceProtocol(DEVICE, clock=asyncio.get_running_loop().time)
        second = DeviceConnection(link, identity, harness.stack.registry, protocol)
        task = asyncio.create_task(second.run())
        async with asyncio.timeout(bound(5)):
            await harness.task  # the first connection ends: its link was closed
        device = harness.stack.registry.find(DEVICE)
        assert device is not None and device.session is second
        await link.aclose()
        await task
