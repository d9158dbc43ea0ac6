"""Tests for gateway.devices.calls: CallRouter over a real DeviceConnection and in-memory link.

Calls under pressure: the per-device bound, timeouts that count the wait for a slot, and
cancellation that reaches the device and the audit log.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.devices.registry import DeviceTool
from gateway.errors import DeviceBusy, DeviceError, DeviceTimeout
from tests.conftest import bound, make_config
from tests.devices.test_connection import (
    DEVICE,
    TOOLS,
    Harness,
    call,
    cancellation,
    connected,
    nothing,
)
from tests.fakes import ScriptedSession, Stack

pytestmark = pytest.mark.anyio

TOOL = "self.lamp.turn_on"


def lamp(harness: Harness) -> DeviceTool:
    device = harness.stack.registry.find(DEVICE)
    assert device is not None
    tool = device.tool(TOOL)
    assert tool is not None
    return tool


async def route(harness: Harness) -> asyncio.Task[dict[str, Any]]:
    """Start a call through the router; when this returns it is sent or waiting for a slot."""
    router = harness.stack.router
    task = asyncio.create_task(router.call(lamp(harness), {}, caller="test"))
    await asyncio.create_task(nothing())
    return task


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]


async def test_a_call_beyond_the_bound_fails_at_once_with_a_clear_message(tmp_path: Path) -> None:
    """One slot, no queue: the second call fails without waiting, naming the device and why."""
    async with connected(tmp_path, max_calls_in_flight=1, max_calls_queued=0) as harness:
        await harness.discover()
        running = await route(harness)
        request = await harness.request("tools/call")
        with pytest.raises(DeviceBusy) as busy:
            await harness.stack.router.call(lamp(harness), {}, caller="test")
        harness.link.feed({"type": "mcp", "payload": {"jsonrpc": "2.0", "id": request["id"],
                                                      "result": {"content": []}}})  # fmt: skip
        async with asyncio.timeout(bound(5)):
            assert await running == {"content": []}
    assert str(busy.value) == (
        "device b_0001 is busy: 1 call running and 0 waiting; try again later"
    )
    assert busy.value.device_id == DEVICE
    assert [(r["outcome"], r["message"]) for r in audit(tmp_path)] == [
        ("DeviceBusy", str(busy.value)),
        ("ok", None),
    ]


async def test_the_timeout_counts_the_wait_for_a_slot(tmp_path: Path) -> None:
    """A call stuck behind a call that holds the only slot times out on time, never sent."""
    config = make_config(tmp_path, call_timeout=0.2)
    async with connected(tmp_path, config=config, max_calls_in_flight=1) as harness:
        await harness.discover()
        holder = await call(harness, {})  # no timeout of its own: it holds the slot
        held = await harness.request("tools/call")
        stuck = await route(harness)
        async with asyncio.timeout(bound(5)):
            with pytest.raises(DeviceTimeout) as timeout:
                await stuck
        holder.cancel()
        # The next frame is the holder's cancellation: the stuck call never went out.
        assert (await harness.sent())["payload"] == cancellation(
            held["id"], "cancelled by the caller"
        )
    message = "device b_0001 did not answer self.lamp.turn_on within 0.2 s; it was still "
    message += "waiting for a free slot and never reached the device"
    assert str(timeout.value) == message
    assert [(r["outcome"], r["message"]) for r in audit(tmp_path)] == [("DeviceTimeout", message)]


async def test_a_timed_out_call_is_cancelled_on_the_device_and_audited(tmp_path: Path) -> None:
    """At the timeout the device gets notifications/cancelled ("timed out"), and the error and
    the audit record say that it was told."""
    async with connected(tmp_path, config=make_config(tmp_path, call_timeout=0.2)) as harness:
        await harness.discover()
        pending = await route(harness)
        request = await harness.request("tools/call")
        assert (await harness.sent())["payload"] == cancellation(request["id"], "timed out")
        async with asyncio.timeout(bound(5)):
            with pytest.raises(DeviceTimeout, match="; the device was told to cancel it$"):
                await pending
    [record] = audit(tmp_path)
    assert record["outcome"] == "DeviceTimeout"
    assert record["message"].endswith("within 0.2 s; the device was told to cancel it")


async def test_a_call_the_host_cancels_is_cancelled_on_the_device_and_audited(
    tmp_path: Path,
) -> None:
    """A host that gives up sends the device notifications/cancelled ("cancelled by the
    caller"); the audit record says cancelled, and that the device was told."""
    async with connected(tmp_path) as harness:
        await harness.discover()
        pending = await route(harness)
        request = await harness.request("tools/call")
        pending.cancel()
        assert (await harness.sent())["payload"] == cancellation(
            request["id"], "cancelled by the caller"
        )
        with pytest.raises(asyncio.CancelledError):
            await pending
    [record] = audit(tmp_path)
    assert record["outcome"] == "cancelled"
    assert record["message"] == "cancelled by the caller; the device was told to cancel it"


async def test_timeouts_fire_on_time_under_load(tmp_path: Path) -> None:
    """1,000 concurrent calls to a silent device (4 slots, 32 waiting, defaults): 964 fail at
    once as busy, the 36 others time out on time, the device never has more than 4 calls, and
    it is told to cancel every call it got."""
    seconds = 1.0  # long enough that 964 busy failures under a loaded CI still come "at once"
    async with connected(tmp_path, config=make_config(tmp_path, call_timeout=seconds)) as harness:
        await harness.discover()
        loop = asyncio.get_running_loop()

        async def timed() -> tuple[str, float]:
            started = loop.time()
            try:
                await harness.stack.router.call(lamp(harness), {}, caller="load")
            except DeviceError as exc:
                return type(exc).__name__, loop.time() - started
            raise AssertionError("the silent device answered")

        async with asyncio.timeout(seconds + bound(5)):
            outcomes = await asyncio.gather(*(timed() for _ in range(1000)))
        busy = [elapsed for kind, elapsed in outcomes if kind == "DeviceBusy"]
        late = [elapsed for kind, elapsed in outcomes if kind == "DeviceTimeout"]
        assert (len(busy), len(late)) == (964, 36)
        assert max(busy) < seconds / 2  # at once: they never wait
        # On time: never early, and late only by the loop's own latency (the report this
        # answers had a 5 s timeout firing at a median of 11.3 s).
        assert seconds - 0.01 <= min(late) and max(late) < seconds + bound(0.3)
        # The device's side: count calls in flight as it sees them.
        requests: set[int] = set()
        cancelled: set[int] = set()
        most = 0
        async with asyncio.timeout(bound(5)):
            while not requests or cancelled != requests:
                payload = (await harness.sent())["payload"]
                if payload["method"] == "tools/call":
                    requests.add(payload["id"])
                else:
                    assert payload["method"] == "notifications/cancelled", payload
                    cancelled.add(payload["params"]["requestId"])
                most = max(most, len(requests - cancelled))
    assert most == 4 and 4 <= len(requests) <= 36
    records = audit(tmp_path)
    told = [r for r in records if r["message"].endswith("the device was told to cancel it")]
    assert len(records) == 1000 and len(told) == len(requests)


class SilentSession(ScriptedSession):
    """A session that never answers, and knows nothing of call reports."""

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_session_that_reports_nothing_times_out_with_the_plain_message(
    tmp_path: Path,
) -> None:
    """Without a report from the session, the timeout says only that the device was silent."""
    stack = Stack(make_config(tmp_path, call_timeout=0.05))
    try:
        stack.registry.connect(DEVICE, SilentSession(), transport="websocket")
        stack.registry.set_catalogue(DEVICE, tuple(TOOLS), {"name": "b"})
        device = stack.registry.find(DEVICE)
        assert device is not None and (tool := device.tool(TOOL)) is not None
        async with asyncio.timeout(bound(5)):
            with pytest.raises(DeviceTimeout) as timeout:
                await stack.router.call(tool, {}, caller="test")
    finally:
        stack.close()
    assert str(timeout.value) == "device b_0001 did not answer self.lamp.turn_on within 0.05 s"
