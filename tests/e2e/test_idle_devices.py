"""What an idle device costs the gateway, counted: tasks and timers, whatever the fleet's size."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import gateway, listener_tasks, listener_timers
from tests.e2e.helpers import RawDevice, aliases, serving

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

TOOL = {
    "name": "self.lamp.turn_on",
    "description": "Turn the lamp on.",
    "inputSchema": {"type": "object", "properties": {}},
}


async def test_an_idle_device_costs_one_task_and_no_timer_of_its_own(tmp_path: Path) -> None:
    """Once listed, a device waits in its connection's one task; its keepalive pings share one
    timer with every other device (uvicorn's own kept one or two per device), and its
    discovery deadline is gone."""
    devices = [RawDevice(f"02:00:00:00:01:{n:02x}", f"idle-{n}", [TOOL]) for n in range(1, 13)]
    async with gateway(tmp_path, devices=aliases(*devices)) as run:
        tasks, timers = listener_tasks(), listener_timers()
        async with serving(run, *devices):
            assert listener_tasks() - tasks == len(devices)
            assert listener_timers() - timers <= 1
