"""simulate(): many devices at once, each with its own id, stopped by an event."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.simulator import device_id_for, simulate
from tests.simulator.helpers import bound, mini_gateway

pytestmark = pytest.mark.anyio


def test_device_ids_are_locally_administered_macs() -> None:
    """Index 1 is 02:00:00:00:00:01; indices outside 1..65535 are refused."""
    assert device_id_for(1) == "02:00:00:00:00:01"
    assert device_id_for(258) == "02:00:00:00:01:02"
    with pytest.raises(ValueError):
        device_id_for(0)


async def test_simulate_runs_count_devices_until_stopped() -> None:
    """Three devices connect with distinct ids; setting stop_event ends them all."""
    stop = asyncio.Event()
    async with mini_gateway() as gw:
        runner = asyncio.create_task(simulate(gw.url, "t", 3, stop_event=stop), name="test.sim")
        for _ in range(3):
            await gw.next_connection()
        stop.set()
        with anyio.fail_after(bound()):
            await runner
        for _ in range(3):
            await gw.wait_ended()  # cleanly, or aborted if stopped mid-hello
    ids = sorted(r.headers["Device-Id"] for r in gw.requests)
    assert ids == ["02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03"]


async def test_simulate_can_run_our_firmware_board() -> None:
    """board="firmware" boots device_fw as a board does, on its simulated hardware."""
    stop = asyncio.Event()
    async with mini_gateway() as gw:
        runner = asyncio.create_task(
            simulate(gw.url, "t", 1, stop_event=stop, board="firmware"), name="test.sim"
        )
        await gw.next_connection()
        await gw.recv()  # the hello
        listing = await gw.request(1, "tools/list")
        stop.set()
        with anyio.fail_after(bound()):
            await runner
    names = [tool["name"] for tool in listing["result"]["tools"]]
    assert names[:3] == ["self.get_device_status", "self.led.set_power", "self.led.get_state"]
    assert "self.relay.set_power" in names and "self.reboot" not in names
