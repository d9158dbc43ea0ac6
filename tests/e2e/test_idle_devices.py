"""What an idle device costs the gateway, counted: tasks and timers, whatever the fleet's size."""

from __future__ import annotations

import gc
from pathlib import Path

import anyio
import pytest

from gateway.app import Running
from gateway.devices.device import Device
from gateway.devices.naming import derive_alias
from tests.conftest import gateway, listener_tasks, listener_timers
from tests.e2e.helpers import RawDevice, aliases, serving, until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

TOOL = {
    "name": "self.lamp.turn_on",
    "description": "Turn the lamp on.",
    "inputSchema": {"type": "object", "properties": {}},
}


async def test_an_idle_device_costs_one_task_and_no_timer_of_its_own(tmp_path: Path) -> None:
    """Once listed, a device waits in its connection's one task; its keepalive pings share one
    timer with every other device (uvicorn's own kept one or two per device), as do its
    connection's handshake and authentication deadlines (one timer each for the listener, not
    cancelled when a device authenticates: it fires once, later, to find nothing), and its
    discovery deadline is gone."""
    devices = [RawDevice(f"02:00:00:00:01:{n:02x}", f"idle-{n}", [TOOL]) for n in range(1, 13)]
    async with gateway(tmp_path, devices=aliases(*devices)) as run:
        tasks, timers = listener_tasks(), listener_timers()
        async with serving(run, *devices):
            assert listener_tasks() - tasks == len(devices)
            assert listener_timers() - timers <= 3  # keepalive, handshake and auth deadlines


def fleet(block: int, tools: list[dict[str, object]], count: int) -> list[RawDevice]:
    """``count`` devices the config says nothing of (named after their board, as a stock fleet
    is), serving ``tools``."""
    ids = [f"02:00:00:00:{block:02x}:{n:02x}" for n in range(1, count + 1)]
    return [RawDevice(i, derive_alias(i, "raw-board"), tools) for i in ids]


def gateway_objects() -> int:
    """Objects of the gateway's own classes alive now."""
    gc.collect()
    modules = (type(o).__module__ for o in gc.get_objects())
    return sum(isinstance(m, str) and m.startswith("gateway.") for m in modules)


def shown(device: Device | None) -> bool:
    """The device is known and hosts see its tools."""
    return device is not None and device.exposed


async def held_per_device(run: Running, devices: list[RawDevice]) -> float:
    """The gateway's own objects (of its classes) per device, while ``devices`` are connected
    and idle, their tools shown to hosts (no host listed them) and their names' rows written.
    Timers and contexts of the moment, the same whatever the tools, are left out: they come
    and go with the pings."""
    registry = run.gateway.registry
    gc.collect()
    before = gateway_objects()
    async with registry.changes() as changes, anyio.create_task_group() as tg:
        for device in devices:
            await tg.start(device.serve, run.device_url)
        await until(changes, lambda: all(shown(registry.get(d.device_id)) for d in devices))
        run.gateway.store.flush()  # write-behind: the names' rows leave with their batch
        gc.collect()
        held = (gateway_objects() - before) / len(devices)
        for device in devices:
            await device.close()
    return held


async def test_an_idle_device_holds_as_many_objects_whatever_its_tool_count(
    tmp_path: Path,
) -> None:
    """Devices of one firmware share its tools as decided and their names: a connected device
    of a 25-tool firmware costs the gateway no more objects than one of a 1-tool firmware (each
    of its tools cost two or more before: a name entry, a `DeviceTool`) until hosts list them."""
    many = [{**TOOL, "name": f"self.part_{n}.turn_on"} for n in range(25)]
    async with gateway(tmp_path) as run:
        # A device of each firmware stays: the catalogues are judged and shared from then on.
        async with serving(run, *fleet(1, [TOOL], 1), *fleet(2, many, 1)):
            one_tool = await held_per_device(run, fleet(3, [TOOL], 10))
            tools_25 = await held_per_device(run, fleet(4, many, 10))
    # before: 48 more (a name entry and a DeviceTool a tool); a few come and go with pings
    assert tools_25 - one_tool < 10, (one_tool, tools_25)
