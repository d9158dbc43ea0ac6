"""Tests for gateway.devices.connection: one device over an in-memory link, no sockets."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Config
from gateway.devices.connection import DeviceConnection
from gateway.devices.link import DeviceIdentity, LinkClosed
from gateway.errors import DeviceBusy, DeviceToolError, DeviceUnavailable
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

    def __init__(
        self, stack: Stack, link: MemoryLink, task: asyncio.Task[None], protocol: DeviceProtocol
    ) -> None:
        self.stack, self.link, self.task, self.protocol = stack, link, task, protocol

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
async def connected(
    tmp_path: Path, *, config: Config | None = None, link: MemoryLink | None = None, **protocol: Any
) -> AsyncIterator[Harness]:
    """A DeviceConnection over a MemoryLink; ``protocol``: DeviceProtocol keyword arguments."""
    stack = Stack(config or make_config(tmp_path))
    link = link or MemoryLink()
    identity = DeviceIdentity(device_id=DEVICE, client_id="c1", transport="websocket")
    proto = DeviceProtocol(DEVICE, clock=asyncio.get_running_loop().time, **protocol)
    connection = DeviceConnection(link, identity, stack.registry, proto)
    task = asyncio.create_task(connection.run())
    try:
        yield Harness(stack, link, task, proto)
    finally:
        await link.aclose()
        async with asyncio.timeout(bound(5)):
            await task
        stack.close()


async def call(harness: Harness, arguments: dict[str, Any]) -> asyncio.Task[dict[str, Any]]:
    """Start a call in a task; when this returns, the call is sent or waiting for a slot."""
    device = harness.stack.registry.find(DEVICE)
    assert device is not None and device.session is not None
    task = asyncio.create_task(device.session.call("self.lamp.turn_on", arguments))
    # The loop runs ready tasks in order: once a task created now has run, so has the call's
    # first step, which hands the request to the protocol.
    await asyncio.create_task(nothing())
    return task


async def nothing() -> None:
    """Do nothing (a task to await: every task ready before it has then run a step)."""


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


async def test_a_device_discovered_at_its_hello_deadline_keeps_no_task_once_idle(
    tmp_path: Path,
) -> None:
    """The timer's task (as every MQTT device's, discovered at once) is let go once it has
    sent: an idle fleet keeps no finished task per device."""
    async with connected(tmp_path, hello_timeout=0.0) as harness:
        initialize = await harness.request("initialize")
        harness.link.feed(mcp({"id": initialize["id"], "result": {"serverInfo": {"name": "b"}}}))
        listing = await harness.request("tools/list")
        async with harness.stack.registry.changes() as changes:
            harness.link.feed(mcp({"id": listing["id"], "result": {"tools": TOOLS}}))
            async with asyncio.timeout(bound(5)):
                await anext(changes)
        gc.collect()
        timer_tasks = [
            o
            for o in gc.get_objects()
            if isinstance(o, asyncio.Task) and o.get_name() == f"gateway.device[{DEVICE}].timer"
        ]
        assert timer_tasks == []


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


# Calls under pressure: the per-device bound, and cancellation reaching the device.


def cancellation(call_id: int, reason: str) -> dict[str, Any]:
    params = {"requestId": call_id, "reason": reason}
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


async def test_calls_beyond_the_bound_fail_at_once_and_queued_calls_run_as_slots_free(
    tmp_path: Path,
) -> None:
    """With 2 slots and a queue of 1, the 4th call fails at once; the 3rd goes out when the 1st
    is answered, and every call gets its own answer."""
    async with connected(tmp_path, max_calls_in_flight=2, max_calls_queued=1) as harness:
        await harness.discover()
        calls = [await call(harness, {"n": n}) for n in range(3)]
        first, second = await harness.request("tools/call"), await harness.request("tools/call")
        device = harness.stack.registry.find(DEVICE)
        assert device is not None and device.session is not None
        with pytest.raises(DeviceBusy, match="^2 calls running and 1 waiting$"):
            await device.session.call("self.lamp.turn_on", {"n": 3})
        harness.link.feed(mcp({"id": first["id"], "result": {"n": 0}}))
        third = await harness.request("tools/call")
        assert third["params"]["arguments"] == {"n": 2}
        for request in (second, third):
            n = request["params"]["arguments"]["n"]
            harness.link.feed(mcp({"id": request["id"], "result": {"n": n}}))
        async with asyncio.timeout(bound(5)):
            assert await asyncio.gather(*calls) == [{"n": 0}, {"n": 1}, {"n": 2}]


async def test_a_cancelled_call_is_cancelled_on_the_device(tmp_path: Path) -> None:
    """Cancelling a sent call sends notifications/cancelled for its id, without waiting."""
    async with connected(tmp_path) as harness:
        await harness.discover()
        pending = await call(harness, {})
        request = await harness.request("tools/call")
        pending.cancel()
        assert (await harness.sent())["payload"] == cancellation(
            request["id"], "cancelled by the caller"
        )
        with pytest.raises(asyncio.CancelledError):
            await pending


async def test_a_cancelled_waiting_call_never_reaches_the_device(tmp_path: Path) -> None:
    """A call cancelled while it waits for a slot is dropped: the next one takes the slot."""
    async with connected(tmp_path, max_calls_in_flight=1) as harness:
        await harness.discover()
        running = await call(harness, {"n": 0})
        first = await harness.request("tools/call")
        dropped, last = await call(harness, {"n": 1}), await call(harness, {"n": 2})
        assert len(harness.protocol.waiting_calls) == 2
        dropped.cancel()
        harness.link.feed(mcp({"id": first["id"], "result": {}}))
        following = await harness.request("tools/call")
        assert following["params"]["arguments"] == {"n": 2}
        harness.link.feed(mcp({"id": following["id"], "result": {}}))
        async with asyncio.timeout(bound(5)):
            assert await running == {} and await last == {}


async def test_link_loss_fails_waiting_calls_at_once_too(tmp_path: Path) -> None:
    """Calls still waiting for a slot fail with DeviceUnavailable when the link goes."""
    async with connected(tmp_path, max_calls_in_flight=1) as harness:
        await harness.discover()
        running, waiting = await call(harness, {}), await call(harness, {})
        await harness.request("tools/call")
        await harness.link.aclose()
        async with asyncio.timeout(bound(5)):
            with pytest.raises(DeviceUnavailable, match="during the call"):
                await running
            with pytest.raises(DeviceUnavailable, match="before the call was sent"):
                await waiting


class BrokenLink(MemoryLink):
    """A MemoryLink whose sends fail, once ``broken``, as if the connection had just dropped."""

    broken = False

    async def send(self, text: str) -> None:
        if self.broken:
            raise LinkClosed("gone")
        await super().send(text)


class BrokenWholeLink(BrokenLink):
    """A BrokenLink that writes frames whole: its callers send their own calls."""

    sends_whole = True


@pytest.mark.parametrize("link_class", [BrokenLink, BrokenWholeLink])
async def test_a_call_that_finds_the_link_gone_fails_at_once(
    tmp_path: Path, link_class: type[BrokenLink]
) -> None:
    """A failed send fails the call with DeviceUnavailable, and later calls too, at once,
    whoever sends it (the connection's task, or the caller)."""
    link = link_class()
    async with connected(tmp_path, link=link) as harness:
        await harness.discover()
        link.broken = True
        async with asyncio.timeout(bound(5)):
            with pytest.raises(DeviceUnavailable, match="during the call"):
                await (await call(harness, {}))
        with pytest.raises(DeviceUnavailable, match="^device disconnected$"):
            await (await call(harness, {}))


class WholeLink(MemoryLink):
    """A MemoryLink that writes frames whole, like the device WebSocket (``DeviceSocket``)."""

    sends_whole = True


@pytest.mark.parametrize(("link", "send_tasks"), [(WholeLink, 0), (MemoryLink, 3)])
async def test_over_a_link_that_sends_whole_a_call_needs_no_task_to_send_it(
    tmp_path: Path, link: type[MemoryLink], send_tasks: int
) -> None:
    """Over the WebSocket a caller sends its own call (issue 18: no task per call); over other
    links a task of the connection does, as a cancelled send there may have written it."""
    senders: list[str] = []
    loop = asyncio.get_running_loop()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        if getattr(coro, "__qualname__", "") == "DeviceConnection._send_all":
            senders.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async with connected(tmp_path, link=link()) as harness:
        await harness.discover()
        loop.set_task_factory(counting)
        try:
            for n in range(3):
                pending = await call(harness, {"n": n})
                request = await harness.request("tools/call")
                harness.link.feed(mcp({"id": request["id"], "result": {"n": n}}))
                async with asyncio.timeout(bound(5)):
                    assert await pending == {"n": n}
        finally:
            loop.set_task_factory(None)
    assert len(senders) == send_tasks


class FullLink(WholeLink):
    """Writes frames whole, but only while ``writable``: a socket buffer that must drain."""

    def __init__(self) -> None:
        super().__init__()
        self.writable, self.waiting = asyncio.Event(), asyncio.Event()
        self.writable.set()

    async def send(self, text: str) -> None:
        if not self.writable.is_set():
            self.waiting.set()
            await self.writable.wait()
        await super().send(text)


async def test_a_call_cancelled_while_its_send_waits_reaches_the_device_once(
    tmp_path: Path,
) -> None:
    """A caller cancelled while the socket is full loses nothing and doubles nothing: the
    connection sends its call once, then tells the device to cancel it."""
    link = FullLink()
    async with connected(tmp_path, link=link) as harness:
        await harness.discover()
        link.writable.clear()
        cancelled = await call(harness, {"n": 0})
        async with asyncio.timeout(bound(5)):
            await link.waiting.wait()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        link.writable.set()
        request = await harness.request("tools/call")
        assert request["params"]["arguments"] == {"n": 0}
        assert (await harness.sent())["payload"] == cancellation(
            request["id"], "cancelled by the caller"
        )
        following = await call(harness, {"n": 1})
        again = await harness.request("tools/call")
        assert again["params"]["arguments"] == {"n": 1}  # not the cancelled call a second time
        harness.link.feed(mcp({"id": again["id"], "result": {}}))
        async with asyncio.timeout(bound(5)):
            assert await following == {}


async def test_a_relisting_that_stops_early_keeps_the_known_catalogue(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The device's tools change; its next listing fails on its first page: the tools it listed
    before stay (not 0 tools), the log says why at INFO, and the next complete listing wins."""
    async with connected(tmp_path) as harness:
        await harness.discover()
        registry = harness.stack.registry
        caplog.set_level("INFO", logger="gateway.devices.connection")
        harness.link.feed(mcp({"method": "notifications/tools/list_changed"}))
        listing = await harness.request("tools/list")
        harness.link.feed(mcp({"id": listing["id"], "error": {"code": -32603, "message": "busy"}}))
        # A second change: its listing is asked for only once the first one ended.
        harness.link.feed(mcp({"method": "notifications/tools/list_changed"}))
        listing = await harness.request("tools/list")
        assert [t.name for t in registry.exposed_tools()] == ["b_0001_lamp_turn_on"]
        stopped = [r for r in caplog.records if "stopped early" in r.getMessage()]
        assert [r.levelname for r in stopped] == ["INFO"]
        assert "keeping the catalogue it listed before" in stopped[0].getMessage()
        more = [*TOOLS, {**TOOLS[0], "name": "self.lamp.turn_off"}]
        async with registry.changes() as changes:
            harness.link.feed(mcp({"id": listing["id"], "result": {"tools": more}}))
            async with asyncio.timeout(bound(5)):
                await anext(changes)
        names = [t.name for t in registry.exposed_tools()]
        assert names == ["b_0001_lamp_turn_on", "b_0001_lamp_turn_off"]
